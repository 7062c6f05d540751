"""Defects that show only at a variation of what callers may send that the generators did not draw on purpose
before (conformance/cases/input_space.py): a dtype a precondition accepts for a field, a relation of the slots
to the batch positions (conformance/cases/relations.py).

Each short cut below is right on every batch but those of its variation: seq_lens_cpu_upper_bound was only
ever int32, and random slots are the batch positions, reversed or permuted with the ends in place almost never.
:data:`CASES` are the cases that expose them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.conformance.broken.cases import TABLE_RULES, corpus_case
from shardspec.conformance.broken.support import MisreportingSharder
from shardspec.conformance.cases.owner_tables import carried
from shardspec.reference import ReferenceSharder
from shardspec.spec.case import Case


class UpperBoundLocalizedInInt32(MisreportingSharder):
    """INV-LOCAL-SEQ-LENS-UPPER-BOUND: the local seq_lens_cpu_upper_bound is built in int32, the dtype vLLM builds
    it in, whatever the batch's: an int64 bound comes back int32."""

    def corrupt(self, batch, result):
        bound = result.local_batch.seq_lens_cpu_upper_bound
        if bound is None or bound.dtype == torch.int32:
            return result
        return self.corrupt_local_batch(result, seq_lens_cpu_upper_bound=bound.to(torch.int32))


def _local_slots(result, values) -> dict:
    """The local batch's idx_mapping and idx_mapping_np replaced by ``values`` (in their own dtypes)."""
    local = result.local_batch
    return {
        "idx_mapping": torch.as_tensor(
            np.asarray(values), dtype=local.idx_mapping.dtype, device=local.idx_mapping.device
        ),
        "idx_mapping_np": np.asarray(values, dtype=local.idx_mapping_np.dtype),
    }


class _SlotsShortCut(MisreportingSharder):
    """Where :meth:`applies` to the batch's slots, the local slots come back as :meth:`short_cut` makes them."""

    def corrupt(self, batch, result):
        slots = [int(s) for s in np.asarray(batch.idx_mapping_np)]
        if len(slots) < 2 or not self.applies(slots):
            return result
        owned = [i for i, s in enumerate(slots) if s in set(np.asarray(result.local_batch.idx_mapping_np).tolist())]
        return self.corrupt_local_batch(result, **_local_slots(result, self.short_cut(slots, owned)))

    def applies(self, slots: list[int]) -> bool:
        raise NotImplementedError

    def short_cut(self, slots: list[int], owned: list[int]) -> list[int]:
        raise NotImplementedError


class LocalSlotsNumberedLikeLocalPositions(_SlotsShortCut):
    """INV-LOCAL-IDX-MAPPING: where every slot is its batch position, the local slots are taken to be the local
    positions too (0 .. n-1), where they are the owned requests' batch positions."""

    def applies(self, slots):
        return slots == list(range(len(slots)))

    def short_cut(self, slots, owned):
        return list(range(len(owned)))


class IdentityJudgedByItsEnds(_SlotsShortCut):
    """INV-LOCAL-IDX-MAPPING: a dense batch (its slots 0 .. N-1 in some order) is judged to be in batch order from
    its first and last slots alone, and the local slots are then the owned positions: wrong where the slots
    between are permuted."""

    def applies(self, slots):
        return sorted(slots) == list(range(len(slots))) and (slots[0], slots[-1]) == (0, len(slots) - 1)

    def short_cut(self, slots, owned):
        return owned


class AscendingSlotsTakenAsConsecutive(_SlotsShortCut):
    """INV-LOCAL-IDX-MAPPING: where the slots rise with the batch positions, they are taken to be consecutive:
    each owned request's slot is the first slot plus its position (wrong where the slots skip some)."""

    def applies(self, slots):
        return all(a < b for a, b in zip(slots, slots[1:], strict=False))

    def short_cut(self, slots, owned):
        return [slots[0] + i for i in owned]


class SlotsRebasedWhenAllPastN(_SlotsShortCut):
    """INV-LOCAL-IDX-MAPPING: a batch whose slots all lie at N or above is taken for a second micro-batch's,
    numbered from its own base: the local slots come back less the smallest slot."""

    def applies(self, slots):
        return min(slots) >= len(slots)

    def short_cut(self, slots, owned):
        return [slots[i] - min(slots) for i in owned]


class ReversedSlotsGatheredInSlotOrder(ReferenceSharder):
    """INV-GATHER-SAMPLED-IDS: a batch whose slots run backwards (N-1 .. 0) is gathered in slot order: the sampled
    ids come back with their requests reversed."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        slots = np.asarray(global_batch.idx_mapping_np).tolist()
        if len(slots) < 2 or slots != list(range(len(slots)))[::-1]:
            return out
        return replace(out, sampled_token_ids=out.sampled_token_ids.flip(0))


CASES = [
    # An int64 bound; rank 0 owns positions 0 and 2, rank 1 position 1 (by position and by slot alike).
    corpus_case(
        "upper-bound-int64",
        slots=[0, 3, 2],
        num_logits_per_req=[1, 2, 1],
        batch_dtypes={"seq_lens_cpu_upper_bound": "int64"},
    ),
]
# The slots against the batch positions at tp 2 (rank 0 owns positions 0, 2, 4, rank 1 positions 1, 3 under
# either owner rule by position or by slot where they agree): each relation of conformance/cases/relations.py.
CASES += [
    corpus_case(f"slots-{name}", slots=slots, num_logits_per_req=counts)
    for name, slots, counts in (
        ("identical", [0, 1, 2, 3, 4], [1, 2, 1, 1, 2]),
        ("reversed", [4, 3, 2, 1, 0], [1, 2, 1, 1, 2]),
        ("permuted", [0, 3, 2, 1, 4], [2, 1, 1, 2, 1]),
        ("gaps", [0, 2, 3, 6, 7], [1, 1, 2, 1, 1]),
        ("above-n", [9, 5, 12, 7, 6], [1, 2, 1, 1, 1]),
    )
]


def _table_steps(name: str, entries: dict, slots: list[list[int]], form: str) -> Case:
    """Steps of ``slots`` on one sharder at tp 2, the first with the owner table ``entries``, each later one with
    the table the engine left in ``form`` (conformance/cases/owner_tables.py, CARRIED)."""
    case_id = f"owner-table-{name}"
    steps = [
        Case(
            case_id=case_id,
            rules=TABLE_RULES,
            tp_size=2,
            slots=step,
            num_logits_per_req=[1 + k % 2 for k in range(len(step))],
            max_num_reqs=8,
            description=f"corpus case {case_id}",
        )
        for step in slots
    ]
    return carried(replace(steps[0], owner_table=entries, then=steps[1:]), forms=(form,))


# The owner table carried across a step in each form the contract allows. Rewritten: slot 6, new to the second
# step, keeps its entry 1 (not 6 mod 2). In part: the engine rewrote slots 0 and 2 only, so 1 and 3 keep 0 (a
# full rewrite would give 1 and 1). Kept: the first step's table again (a rewrite would flip every entry).
CASES += [
    _table_steps("rewritten", {0: 1, 1: 1, 2: 0, 3: 0, 6: 1}, [[0, 1, 2, 3], [3, 0, 1, 6]], "rewritten"),
    _table_steps("rewritten-in-part", {0: 1, 1: 0, 2: 1, 3: 0}, [[0, 1, 2, 3], [1, 3, 0, 2]], "rewritten-in-part"),
    _table_steps("kept", {0: 1, 1: 0, 2: 1, 3: 0}, [[0, 1, 2, 3], [2, 3, 0, 1]], "kept"),
]
