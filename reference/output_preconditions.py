"""Precondition checks of what the engine produces within a step, one function per input.

This rank's logits shard, the LM head's output (``all_to_all_logits``), and the local sampler
output with its extension fields (``gather_sampler_output``). Each violation raises
:class:`PreconditionError` as :mod:`shardspec.reference.preconditions` does for the batch.
"""

from __future__ import annotations

import torch

from shardspec.reference.violations import require
from shardspec.spec.model import (
    EXTENSION_DTYPES,
    EXTENSION_KINDS,
    BatchShardMetadata,
    ExtensionSpec,
    InputBatch,
    SamplerOutput,
)


def check_local_output(
    local_output: SamplerOutput | None,
    local_batch: InputBatch,
    *,
    gather_num_nans: bool,
    logprobs_dims,
    rank=None,
) -> None:
    num_local_reqs, num_local_logits = local_batch.num_reqs, local_batch.num_logits
    # logprobs_dims is replicated: check it before the local output, so that a
    # rank owning nothing rejects it too instead of entering the collectives.
    if logprobs_dims is not None:
        require(
            len(logprobs_dims) == 2 and min(logprobs_dims) >= 0,
            "PRE-LOGPROBS-DIMS",
            "logprobs_dims",
            f"{logprobs_dims} is not a pair of non-negative ints",
            rank=rank,
        )
    if local_output is None:
        require(
            num_local_reqs == 0,
            "PRE-LOCAL-OUTPUT",
            "local_output",
            f"is None but this rank owns {num_local_reqs} requests",
            rank=rank,
        )
        return
    ids = local_output.sampled_token_ids
    require(
        ids.dim() == 2 and ids.shape[0] == num_local_reqs,
        "PRE-LOCAL-OUTPUT",
        "sampled_token_ids",
        f"shape {tuple(ids.shape)}; expected ({num_local_reqs}, width)",
        rank=rank,
    )
    for name in ("num_sampled", "num_rejected"):
        value = getattr(local_output, name)
        require(
            value is not None and tuple(value.shape) == (num_local_reqs,),
            "PRE-LOCAL-OUTPUT",
            name,
            f"is {None if value is None else tuple(value.shape)}; expected shape ({num_local_reqs},)",
            rank=rank,
        )
    if gather_num_nans:
        nans = local_output.num_nans
        require(
            nans is not None and tuple(nans.shape) == (num_local_logits,),
            "PRE-LOCAL-OUTPUT",
            "num_nans",
            f"is {None if nans is None else tuple(nans.shape)}; gather_num_nans needs one count per "
            f"local logits row ({num_local_logits},)",
            rank=rank,
        )
    if logprobs_dims is not None:
        lp = local_output.logprobs_tensors
        if lp is not None:
            for name in ("logprob_token_ids", "logprobs"):
                value = getattr(lp, name)
                require(
                    value.dim() == 2 and value.shape[0] == num_local_logits,
                    "PRE-LOCAL-OUTPUT",
                    name,
                    f"shape {tuple(value.shape)}; expected ({num_local_logits}, columns)",
                    rank=rank,
                )
            require(
                lp.logprob_token_ids.shape == lp.logprobs.shape,
                "PRE-LOCAL-OUTPUT",
                "logprobs",
                "logprob_token_ids and logprobs differ in shape",
                rank=rank,
            )
            require(
                tuple(lp.selected_token_ranks.shape) == (num_local_logits,),
                "PRE-LOCAL-OUTPUT",
                "selected_token_ranks",
                f"shape {tuple(lp.selected_token_ranks.shape)}",
                rank=rank,
            )


def check_logits_shard(logits_shard: torch.Tensor, metadata: BatchShardMetadata, rank=None) -> None:
    """This rank's own shard only: whether every rank's width is the same is not checkable here."""
    num_logits = int(sum(metadata.num_logits_per_rank))
    require(
        isinstance(logits_shard, torch.Tensor) and logits_shard.is_floating_point(),
        "PRE-LOGITS-SHARD",
        "logits_shard",
        f"is {getattr(logits_shard, 'dtype', type(logits_shard).__name__)}, not a floating point tensor",
        rank=rank,
    )
    require(
        logits_shard.dim() == 2 and logits_shard.shape[0] == num_logits and logits_shard.shape[1] >= 1,
        "PRE-LOGITS-SHARD",
        "logits_shard",
        f"shape {tuple(logits_shard.shape)}; expected ({num_logits}, Vs) with Vs >= 1",
        rank=rank,
    )


def check_extension_declarations(extension_fields: dict | None, rank=None) -> None:
    """The replicated declarations: every rank reaches the same verdict."""
    if extension_fields is None:
        return
    for name, spec in extension_fields.items():
        require(
            isinstance(name, str) and isinstance(spec, ExtensionSpec),
            "PRE-EXTENSION-SUPPORTED",
            "extension_fields",
            f"entry {name!r} is not a str -> ExtensionSpec pair",
            rank=rank,
        )
        require(
            spec.per in EXTENSION_KINDS,
            "PRE-EXTENSION-SUPPORTED",
            "extension_fields",
            f"{name}: kind {spec.per!r} is not one of {EXTENSION_KINDS}",
            rank=rank,
        )
        require(
            spec.dtype in EXTENSION_DTYPES,
            "PRE-EXTENSION-SUPPORTED",
            "extension_fields",
            f"{name}: dtype {spec.dtype} is not supported",
            rank=rank,
        )
        require(
            all(isinstance(d, int) and d >= 0 for d in spec.shape),
            "PRE-EXTENSION-SUPPORTED",
            "extension_fields",
            f"{name}: trailing shape {spec.shape} is not a tuple of sizes",
            rank=rank,
        )


def check_local_extensions(
    local_output: SamplerOutput | None, local_batch: InputBatch, extension_fields: dict | None, rank=None
) -> None:
    """Every extension field the local output carries is declared, and every declared one is there."""
    carried = {} if local_output is None or local_output.extensions is None else local_output.extensions
    declared = extension_fields or {}
    for name in carried:
        require(
            name in declared,
            "PRE-EXTENSION-FIELDS",
            f"extensions.{name}",
            "is not declared in extension_fields, so the gather would drop it",
            rank=rank,
        )
    rows = {"request": local_batch.num_reqs, "logits_row": local_batch.num_logits}
    for name, spec in declared.items():
        value = carried.get(name)
        if value is None:
            require(
                local_batch.num_reqs == 0,
                "PRE-EXTENSION-FIELDS",
                f"extensions.{name}",
                f"is declared but missing, and this rank owns {local_batch.num_reqs} requests",
                rank=rank,
            )
            continue
        expected = (rows[spec.per], *spec.shape)
        require(
            isinstance(value, torch.Tensor) and value.dtype == spec.dtype and tuple(value.shape) == expected,
            "PRE-EXTENSION-FIELDS",
            f"extensions.{name}",
            f"is {getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}; "
            f"declared {spec.dtype} {expected}",
            rank=rank,
        )
