"""Defects that show only where a profile's field meets an optional output (conformance/cases/input_space.py,
:func:`profile_output_pairs`): drawn one field at a time, the two met only by chance, and at some group sizes
never.
"""

from __future__ import annotations

from shardspec.conformance.broken.cases import corpus_case
from shardspec.reference import ReferenceSharder
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT


class GrammarDroppedWithoutUpperBound(ReferenceSharder):
    """INV-LOCAL-GRAMMAR: a batch without seq_lens_cpu_upper_bound takes a fallback path that rebuilds the local
    batch from seq_lens and forgets the grammar: every rank's local grammar output is None."""

    def shard_sampler_inputs(self, batch, grammar=None, **kwargs):
        result = super().shard_sampler_inputs(batch, grammar, **kwargs)
        if self.rules.has_upper_bound and batch.seq_lens_cpu_upper_bound is None:
            return result._replace(local_grammar_output=None)
        return result


CASES = [
    # The bound left out, a grammar output listing two of three requests (rank 0 owns positions 0 and 2).
    corpus_case(
        "grammar-without-upper-bound",
        slots=[0, 1, 2],
        num_logits_per_req=[1, 2, 1],
        grammar_positions=[2, 1],
        edits=[UPPER_BOUND_ABSENT],
    ),
]
