"""A JSON-able summary of one rank's step, for the group checkers.

Group checkers compare ranks that may have run in different processes, so
each rank reduces its outputs to a digest::

    {
      "rank": int, "impl": str,
      "failed_step": str | None,          # set when the step raised
      "error_in_collective": bool,
      "gathered": {field: TENSOR | value | None},   # the gathered SamplerOutput
      "sorted_logits_indices": TENSOR | None,
      "metadata": {field: value | TENSOR} | None,
      "wire": [{"kind", "send_shape", "send_dtype", "output_shape",
                "input_split_sizes", "output_split_sizes", "group"}, ...],   # in issue order
    }

``gathered`` has the keys ``sampled_token_ids``, ``num_sampled``,
``num_rejected``, ``num_nans``, ``logprob_token_ids``, ``logprobs``,
``selected_token_ranks`` and ``cu_num_generated_tokens``. A TENSOR is the
string ``"<dtype>[<shape>]@<device type>:<sha256 prefix>"``: two tensors with equal digests
have equal dtype, shape and bytes (NaN payloads included).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from shardspec.conformance.record import NUMPY_CARRIER, StepOutputs
from shardspec.reference.profile_rules import device_cu_num_logits

GATHERED_FIELDS = ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans")
LOGPROBS_FIELDS = (
    "logprob_token_ids",
    "logprobs",
    "selected_token_ranks",
    "cu_num_generated_tokens",
    "cu_num_generated_tokens_tensor",
)
# Per-row logprob tensors: rows from the batch's L on are unspecified (CL-ADMITTED-DRAFTS), so only the
# first L rows are digested.
PER_ROW_LOGPROBS = LOGPROBS_FIELDS[:3]
METADATA_FIELDS = (
    "tp_size",
    "num_logits_per_rank",
    "num_local_logits",
    "num_local_reqs",
    "max_num_reqs_per_rank",
    "gathered_src_indices",
    "max_num_logits_per_req",
    "adaptive_verification_enabled",
)


def tensor_digest(t: torch.Tensor) -> str:
    if t.layout != torch.strided or t.device.type == "meta":  # an implementation's result with no data to hash
        layout = str(t.layout).removeprefix("torch.")
        return f"{str(t.dtype).removeprefix('torch.')}[{','.join(map(str, t.shape))}]@{t.device.type}:{layout}"
    flat = t.detach().cpu().reshape(-1)
    if flat.dtype in NUMPY_CARRIER:  # same-size integer view: no stride constraint
        flat = flat.view(NUMPY_CARRIER[flat.dtype])
    raw = flat.numpy().tobytes()
    shape = ",".join(str(s) for s in t.shape)
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{dtype}[{shape}]@{t.device.type}:{hashlib.sha256(raw).hexdigest()[:16]}"


def plain(value: Any) -> Any:
    """A JSON-able form of ``value``; tensors become digests."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return tensor_digest(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return repr(value)


def logprob_rows(case, batch) -> int | None:
    """The batch's L, the gathered logprob rows that carry data; None for a case that breaks a precondition
    on purpose (its L may not be computable): the digest then covers every row."""
    if case.expect_error is not None:
        return None
    return int(device_cu_num_logits(batch, case.rules)[-1])


def _gathered(out: StepOutputs, logprob_rows: int | None) -> dict[str, Any] | None:
    gathered = out.gathered
    if gathered is None:
        return None
    digest = {name: plain(getattr(gathered, name, None)) for name in GATHERED_FIELDS}
    logprobs = getattr(gathered, "logprobs_tensors", None)
    for name in LOGPROBS_FIELDS:
        value = None if logprobs is None else getattr(logprobs, name, None)
        if name in PER_ROW_LOGPROBS and logprob_rows is not None and isinstance(value, torch.Tensor) and value.dim():
            value = value[:logprob_rows]
        digest[name] = plain(value)
    return digest


def _metadata(out: StepOutputs) -> dict[str, Any] | None:
    if out.shard is None:
        return None
    metadata = out.shard.metadata
    return {name: plain(getattr(metadata, name, None)) for name in METADATA_FIELDS}


def _wire(out: StepOutputs) -> list[dict[str, Any]]:
    return [
        {
            "kind": call.kind,
            "send_shape": list(call.send.shape),
            "send_dtype": str(call.send.dtype).removeprefix("torch."),
            "output_shape": list(call.output_shape),
            "input_split_sizes": call.input_split_sizes,
            "output_split_sizes": call.output_split_sizes,
            "group": getattr(call, "group", None),
        }
        for call in out.wire
    ]


def step_digest(
    out: StepOutputs, *, rank: int, impl: str, error_in_collective: bool = False, logprob_rows: int | None = None
) -> dict[str, Any]:
    """``logprob_rows``: the batch's L, the logprob rows that carry data (None: all of them)."""
    return {
        "rank": rank,
        "impl": impl,
        "failed_step": out.failed_step,
        "error_in_collective": error_in_collective,
        "gathered": _gathered(out, logprob_rows),
        "sorted_logits_indices": None if out.shard is None else plain(out.shard.sorted_logits_indices),
        "metadata": _metadata(out),
        "wire": _wire(out),
        "collectives_performed": out.collectives_performed,
    }
