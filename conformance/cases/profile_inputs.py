"""The inputs a profile's rules add to the root profile's generated batches.

A share of the generated cases get, as an engine with those rules makes them: the sharder's adaptive
verification on (adaptive_verification: present); admitted draft counts below the scheduled ones when
the budget binds, some with a budget of 0 (admitted_drafts: admitted); grammar blocks wider than any
request's rows (grammar_slicing: blocks), with and without num_acceptable_drafts (acceptable_drafts:
sliced); and device fields (and the host bound of seq_lens, where the profile has it) in the other
integer dtype, which the local batch follows (local_dtypes: batch, CL-LOCAL-DTYPES, CL-SEQ-LENS-UPPER-BOUND).
Each only where the profile's callers send it (spec/guarantees.py: the dtypes rule). The draws come from a
generator seeded by the case, so a run is the same every time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardspec.spec.case import Case
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT
from shardspec.spec.guarantees import engine_dtypes
from shardspec.spec.rules import Rules

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
# The host bound of seq_lens, whose dtype the local batch keeps (CL-SEQ-LENS-UPPER-BOUND): drawn where the
# profile has it, in the other dtype the data model lists for it.
BOUND, BOUND_DTYPE = "seq_lens_cpu_upper_bound", "int64"


def with_profile_inputs(case: Case, rules: Rules, rng: np.random.Generator, adaptive: bool | None = None) -> Case:
    """``case`` (valid under ``rules``) with a draw of the inputs those rules allow; ``adaptive``: the
    sharder's adaptive verification where it is already chosen (a later step of one sharder), else drawn."""
    changes: dict = {}
    if adaptive is None:
        adaptive = rules.adaptive and rng.random() < ADAPTIVE_SHARE
    if adaptive:
        changes["adaptive_verification"] = True
        counts = np.asarray(case.num_logits_per_req, dtype=np.int64)
        # Explicit outputs are drawn for the scheduled rows, so only toy-sampled cases trim drafts.
        admits = rules.admits_drafts and case.local_outputs == "toy"
        if admits and (counts > 1).any() and rng.random() < ADMITTED_SHARE:
            if rng.random() < BUDGET_ZERO_SHARE:
                changes["admitted_drafts"] = [0] * len(counts)
            else:
                changes["admitted_drafts"] = [int(rng.integers(0, c)) for c in counts]
    if case.grammar_positions and rules.grammar_blocks:
        if rng.random() < WIDE_BLOCK_SHARE:
            changes["grammar_block_rows"] = case.max_num_logits_per_req + int(rng.integers(1, 3))
        if rules.acceptable_drafts == "sliced" and rng.random() < ACCEPTABLE_SHARE:
            changes["num_acceptable_drafts"] = [
                int(rng.integers(0, case.num_logits_per_req[p] + 1)) for p in case.grammar_positions
            ]
    sendable = [name for name, dtype in OTHER_DTYPES.items() if sent(rules, name, dtype)]
    if rules.batch_dtypes and sendable and rng.random() < DTYPE_SHARE:
        names = [name for name in sendable if rng.random() < 0.5] or sendable[:1]
        changes["batch_dtypes"] = {name: OTHER_DTYPES[name] for name in names}
        if _has_bound(case, rules) and sent(rules, BOUND, BOUND_DTYPE) and rng.random() < 0.5:
            changes["batch_dtypes"][BOUND] = BOUND_DTYPE
    return replace(case, **changes)


def sent(rules: Rules, name: str, dtype: str) -> bool:
    """Whether the callers of ``rules`` send the batch field ``name`` in ``dtype`` (the dtypes rule: every accepted
    dtype, or the engine's own, spec/guarantees.py)."""
    return not rules.engine_dtypes_only or dtype in engine_dtypes().get(name, ())


def _has_bound(case: Case, rules: Rules) -> bool:
    """Whether ``case`` passes seq_lens_cpu_upper_bound under ``rules``."""
    return rules.has_upper_bound and UPPER_BOUND_ABSENT not in case.edits


def without_profile_inputs(case: Case) -> Case:
    """``case`` without the per-step inputs :func:`with_profile_inputs` draws (the sharder's adaptive
    verification stays: it is a construction argument)."""
    return replace(case, admitted_drafts=None, grammar_block_rows=None, num_acceptable_drafts=None, batch_dtypes={})


def flipped_dtypes(case: Case, rules: Rules) -> dict[str, str]:
    """Batch dtypes in which every field of :data:`OTHER_DTYPES`, and the bound where ``rules`` have it, has the
    other dtype than in ``case``, where the callers of ``rules`` send it."""
    other = {**OTHER_DTYPES, BOUND: BOUND_DTYPE} if _has_bound(case, rules) else OTHER_DTYPES
    return {name: dtype for name, dtype in other.items() if name not in case.batch_dtypes and sent(rules, name, dtype)}
