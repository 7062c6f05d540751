"""The rank's local batch: host fields picked from the batch, device fields the plan kernel's outputs."""

from __future__ import annotations

from dataclasses import fields, replace
from operator import itemgetter

import numpy as np
import torch

from shardspec.impl import profiles
from shardspec.impl.workspace import LOCAL_FIELDS, REGION_DTYPES, local_region
from shardspec.spec.model import InputBatch
from shardspec.spec.rules import Rules

_BATCH_FIELDS = tuple(f.name for f in fields(InputBatch))
# vllm-seed's local dtypes (CL-LOCAL-DTYPES), in LOCAL_FIELDS order.
SEED_DTYPES = (torch.int32,) * len(LOCAL_FIELDS)


def local_input_batch(
    batch, slots, counts, local_reqs, width: int, views: dict, prefix: str = "local_", rules: Rules | None = None
):
    """The rank's local batch: its requests' host fields picked from ``batch``, its device fields the plan
    kernel's outputs in ``views`` (keyed ``prefix + field``). ``counts`` are the rows per request as the
    device fields lay them out (the admitted ones where admitted counts are given and the profile's rules
    admit them). ``rules``: the profile's (None: the root profile's, which localizes neither the bound nor
    the admitted counts)."""
    num_local = local_reqs.shape[0]
    if width == 1:
        local_cu_np = np.arange(num_local + 1, dtype=np.int32)
    else:
        local_cu_np = np.zeros(num_local + 1, dtype=np.int32)
        np.cumsum(counts[local_reqs], out=local_cu_np[1:])
    drafts = batch.num_draft_tokens_per_req
    local_drafts = None if drafts is None else np.asarray(drafts)[local_reqs].astype(np.int32)
    if rules is not None and (rules.admits_drafts or rules.has_upper_bound):
        num_drafts, bound, admitted = profiles.local_profile_fields(batch, local_reqs, local_drafts, rules)
    else:
        # CL-LOCAL-DRAFT-COUNT without admitted counts; the two fields the profile does not list stay the
        # batch's (INV-LOCAL-UNLISTED-FIELDS).
        num_drafts = 0 if local_drafts is None else int(np.add.reduce(local_drafts))
        bound, admitted = batch.seq_lens_cpu_upper_bound, batch.num_admitted_draft_tokens
    local_batch = InputBatch(
        req_ids=_pick(batch.req_ids, local_reqs.tolist()),
        num_reqs=num_local,
        idx_mapping=views[prefix + "idx_mapping"],
        idx_mapping_np=slots[local_reqs],
        expanded_idx_mapping=views[prefix + "expanded_idx_mapping"],
        expanded_local_pos=views[prefix + "expanded_local_pos"],
        query_start_loc=batch.query_start_loc,
        seq_lens=views[prefix + "seq_lens"],
        logits_indices=views[prefix + "logits_indices"],
        cu_num_logits=views[prefix + "cu_num_logits"],
        cu_num_logits_np=local_cu_np,
        num_draft_tokens=num_drafts,
        num_draft_tokens_per_req=local_drafts,
        seq_lens_cpu_upper_bound=bound,
        num_admitted_draft_tokens=admitted,
    )
    if type(batch) is not InputBatch:
        # An engine's subclass keeps its type and its own fields unchanged (INV-LOCAL-UNLISTED-FIELDS).
        local_batch = replace(batch, **{name: getattr(local_batch, name) for name in _BATCH_FIELDS})
    return local_batch


def local_regions(workspace: dict, dtypes: tuple) -> dict:
    """The workspace regions the plan kernel writes the local fields of ``dtypes`` into, keyed
    ``local_<field>``: int32 or int64 regions; a field of another dtype gets the int32 one, and
    :func:`convert_views` converts it."""
    return {f"local_{name}": workspace[local_region(name, d)] for name, d in zip(LOCAL_FIELDS, dtypes, strict=True)}


def convert_views(views: dict, dtypes: tuple) -> dict:
    """``views`` with the local fields whose dtype has no region of its own converted to it (a copy)."""
    converted = dict(views)
    for name, dtype in zip(LOCAL_FIELDS, dtypes, strict=True):
        if dtype not in REGION_DTYPES:
            converted[f"local_{name}"] = views[f"local_{name}"].to(dtype)
    return converted


def _pick(items: list, indices: list) -> list:
    """``[items[i] for i in indices]`` in one C-level call, about 4x faster for a batch's worth."""
    if len(indices) > 1:
        return list(itemgetter(*indices)(items))
    return [items[i] for i in indices]
