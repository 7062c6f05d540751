"""Realizers that change a case's explicit local outputs (cases/realizers.py): a value at a limit of its
dtype, no NaN counts, the sampler's own prefix sums, no output at all. Each returns None where the case has no
explicit outputs to change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from shardspec.conformance.cases.batches import local_requests
from shardspec.conformance.cases.coverage import float_limit
from shardspec.conformance.cases.field_paths import CU_GENERATED_TENSOR, EXPLICIT_OUTPUTS
from shardspec.conformance.cases.input_space import (
    FLOAT32_MAX,
    FLOAT32_SUBNORMAL,
    INT32,
    INT64,
    LAYOUT,
    LAYOUTS_1D,
    VALUE,
)
from shardspec.conformance.cases.sizes import with_logprobs

_LOGPROB_NAMES = ("logprob_token_ids", "logprobs", "selected_token_ranks")


def explicit_value(name: str, value) -> Callable:
    """One entry of every explicit output's ``name`` set to ``value`` (logprobs added where ``name`` is one of
    theirs)."""

    def realize(case, rng):
        if not isinstance(case.local_outputs, dict) or not case.local_outputs:
            return None
        if name in _LOGPROB_NAMES and case.logprobs_dims is None:
            case = replace(case, logprobs_dims=(1, 0))
        outputs = {}
        for rank, out in case.local_outputs.items():
            if name in _LOGPROB_NAMES:
                out = with_logprobs(case, rank, out)
            values = getattr(out, name)
            if values is None or not values:
                outputs[rank] = out
                continue
            copied = [list(row) for row in values] if isinstance(values[0], list) else list(values)
            # An entry no earlier change put at a limit, so that the variations drawn before stay drawn.
            if isinstance(copied[0], list):
                free = [(r, c) for r, row in enumerate(copied) for c, v in enumerate(row) if _plain(v)]
            else:
                free = [(r, None) for r, v in enumerate(copied) if _plain(v)]
            if free:
                row, col = free[int(rng.integers(len(free)))]
                if col is None:
                    copied[row] = value
                else:
                    copied[row][col] = value
            outputs[rank] = replace(out, **{name: copied})
        return replace(case, local_outputs=outputs)

    return realize


def _plain(value) -> bool:
    """Not at a limit a realizer puts a value at (a float's limits, an integer's dtype ends)."""
    if isinstance(value, float):
        return float_limit(value) is None
    return INT64[0] < value < INT32[1] and value != INT32[0]


def without_nan_counts(case, rng):
    if not isinstance(case.local_outputs, dict) or not case.local_outputs:
        return None
    outputs = {rank: replace(out, num_nans=None) for rank, out in case.local_outputs.items()}
    return replace(case, gather_num_nans=False, local_outputs=outputs)


def with_sampler_cu(name: str, layout: str | None = None) -> Callable:
    """The explicit outputs that carry logprobs also carry the sampler's own ``name`` (its local rows'
    prefix sums, which the gather does not read), the local output laid out as ``layout``."""

    def realize(case, rng):
        if not isinstance(case.local_outputs, dict) or (name.endswith("_tensor") and not case.rules.adaptive):
            return None
        outputs = dict(case.local_outputs)
        for rank, out in outputs.items():
            if out.logprob_token_ids is not None:
                rows = [case.num_logits_per_req[i] for i in local_requests(case, rank)]
                outputs[rank] = replace(out, **{name: [0, *np.cumsum(rows).tolist()]})
        if outputs == case.local_outputs:
            return None
        layouts = case.layouts if layout is None else {**case.layouts, "local_output": layout}
        return replace(case, local_outputs=outputs, layouts=layouts)

    return realize


def no_local_output(case, rng):
    """An empty batch's rank passes no local output (tp 1: the one way its only rank owns nothing)."""
    if case.slots or case.local_outputs == {}:
        return None
    return replace(case, local_outputs={})


def _output_realizers() -> dict[str, Callable]:
    out: dict[str, Callable] = {}
    out["local_output.num_nans:presence=absent"] = without_nan_counts
    out["local_output:presence=absent"] = no_local_output
    for name in ("cu_num_generated_tokens", "cu_num_generated_tokens_tensor"):
        out[f"local_output.logprobs_tensors.{name}:presence=present"] = with_sampler_cu(name)
    for layout in LAYOUTS_1D:
        out[f"{CU_GENERATED_TENSOR}:{LAYOUT}={layout}"] = with_sampler_cu(
            "cu_num_generated_tokens_tensor", None if layout == "contiguous" else layout
        )
    limits = {
        "+inf": float("inf"),
        "-inf": float("-inf"),
        "nan": float("nan"),
        "largest": FLOAT32_MAX,
        "lowest": -FLOAT32_MAX,
        "subnormal": FLOAT32_SUBNORMAL,
    }
    for limit, value in limits.items():
        out[f"local_output.logprobs_tensors.logprobs:{VALUE}={limit}"] = explicit_value("logprobs", value)
    for name, path in EXPLICIT_OUTPUTS.items():
        if name == "logprobs":
            continue
        bounds = INT64 if name in ("sampled_token_ids", "logprob_token_ids", "selected_token_ranks") else INT32
        out[f"{path}:{VALUE}=dtype-max"] = explicit_value(name, bounds[1])
        if name in ("sampled_token_ids", "logprob_token_ids"):
            out[f"{path}:{VALUE}=dtype-min"] = explicit_value(name, bounds[0])
        if name in ("num_sampled", "num_rejected", "selected_token_ranks"):
            out[f"{path}:{VALUE}=min"] = explicit_value(name, 0)
    return out


# Realizers of the variations of the local sampler output's fields (cases/realizers.py holds them all).
OUTPUT_REALIZERS: dict[str, Callable] = _output_realizers()
