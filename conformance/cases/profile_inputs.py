"""vLLM 0.33's inputs on generated cases: what the vllm-0.33 profile adds to the seed's batches.

A share of the generated cases of a vllm-0.33 run get, as vLLM 0.33 makes them: the sharder's adaptive
verification on; admitted draft counts below the scheduled ones when the budget binds (some with a
budget of 0); grammar blocks wider than any request's rows (padding rows), with and without
num_acceptable_drafts; and device fields in the other integer dtype (the local batch follows the
input's, CL-LOCAL-DTYPES). The draws come from a generator seeded by the case, so a run is the same
every time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardspec.spec.case import Case

ADAPTIVE_SHARE = 0.4
ADMITTED_SHARE = 0.7  # of adaptive cases with drafts: the budget binds
BUDGET_ZERO_SHARE = 0.25  # of those: no draft is admitted
WIDE_BLOCK_SHARE = 0.3  # grammar blocks wider than the capacity's rows
ACCEPTABLE_SHARE = 0.5
DTYPE_SHARE = 0.3
# The batch fields whose dtype the local batch follows, and the dtype each is drawn in besides its default.
OTHER_DTYPES = {
    "idx_mapping": "int32",
    "expanded_idx_mapping": "int64",
    "expanded_local_pos": "int64",
    "seq_lens": "int64",
    "cu_num_logits": "int64",
}


def with_vllm_033_inputs(case: Case, rng: np.random.Generator) -> Case:
    """``case`` (valid, vllm-0.33) with a draw of vLLM 0.33's inputs."""
    changes: dict = {}
    if rng.random() < ADAPTIVE_SHARE:
        changes["adaptive_verification"] = True
        counts = np.asarray(case.num_logits_per_req, dtype=np.int64)
        # Explicit outputs are drawn for the scheduled rows, so only toy-sampled cases trim drafts.
        if case.local_outputs == "toy" and (counts > 1).any() and rng.random() < ADMITTED_SHARE:
            if rng.random() < BUDGET_ZERO_SHARE:
                changes["admitted_drafts"] = [0] * len(counts)
            else:
                changes["admitted_drafts"] = [int(rng.integers(0, c)) for c in counts]
    if case.grammar_positions:
        if rng.random() < WIDE_BLOCK_SHARE:
            changes["grammar_block_rows"] = case.max_num_logits_per_req + int(rng.integers(1, 3))
        if rng.random() < ACCEPTABLE_SHARE:
            changes["num_acceptable_drafts"] = [
                int(rng.integers(0, case.num_logits_per_req[p] + 1)) for p in case.grammar_positions
            ]
    if rng.random() < DTYPE_SHARE:
        names = [name for name in OTHER_DTYPES if rng.random() < 0.5] or ["idx_mapping"]
        changes["batch_dtypes"] = {name: OTHER_DTYPES[name] for name in names}
    return replace(case, **changes)
