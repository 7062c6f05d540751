"""What each value of a rule means (spec/rules.py), as a function: the one definition of it.

The reference follows these functions; production's vectorised paths (impl/profiles.py) compute the
same, and tests/impl/test_impl_rule_meanings.py holds them equal over a grid of batches.

No torch here: the command line reads profiles before a run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# -- owner (INV-OWNER): the rank that owns the request at batch ``position`` with slot ``slot``, in a batch of
# ``num_reqs`` requests over ``tp`` ranks; ``table``: the step's owner table (any sequence indexed by slot).
OwnerFunction = Callable[[int, int, int, int, Sequence | None], int]


def owner_slot_mod_tp(position: int, slot: int, tp: int, num_reqs: int, table: Sequence | None) -> int:
    """The request's slot decides: idx_mapping[i] mod tp."""
    return int(slot) % tp


def owner_position_mod_tp(position: int, slot: int, tp: int, num_reqs: int, table: Sequence | None) -> int:
    """The request's batch position decides: i mod tp."""
    return position % tp


def owner_owner_table(position: int, slot: int, tp: int, num_reqs: int, table: Sequence | None) -> int:
    """The slot's entry of the step's owner table (CL-OWNER-TABLE): owner_table[idx_mapping[i]]."""
    if table is None:
        raise ValueError("owner rule owner_table: the owner table is needed")
    return int(table[int(slot)])


def owner_contiguous_ranges(position: int, slot: int, tp: int, num_reqs: int, table: Sequence | None) -> int:
    """Rank r owns the r-th of tp contiguous ranges of batch positions (CL-OWNER-CONTIGUOUS-RANGES),
    balanced: each holds num_reqs // tp positions and the first num_reqs % tp one more (numpy's
    array_split)."""
    size, extra = divmod(num_reqs, tp)
    longer = extra * (size + 1)  # positions in the longer ranges, which come first
    return position // (size + 1) if position < longer else extra + (position - longer) // size


OWNER: dict[str, OwnerFunction] = {
    "slot_mod_tp": owner_slot_mod_tp,
    "position_mod_tp": owner_position_mod_tp,
    "owner_table": owner_owner_table,
    "contiguous_ranges": owner_contiguous_ranges,
}


def owners(owner: str, slots: Sequence, tp: int, table: Sequence | None = None) -> list[int]:
    """The owner of every batch position under owner rule ``owner``, for the batch's ``slots`` and, under
    owner_table, the step's ``table``."""
    function = OWNER.get(owner)
    if function is None:
        raise NotImplementedError(f"owner rule {owner}: not supported yet")
    return [function(i, slot, tp, len(slots), table) for i, slot in enumerate(slots)]


# -- empty_batch_padding (CL-EMPTY-BATCH): the requests per rank (M) a plan may pad to, for the requests
# each rank owns, in ascending order; the reference takes the last (every collective stays non-empty). A
# batch with requests pads to its largest rank.
PaddingFunction = Callable[[Sequence[int]], tuple[int, ...]]


def padding_one(num_reqs_per_rank: Sequence[int]) -> tuple[int, ...]:
    """M = 1 for an empty batch: every collective stays non-empty."""
    return (max(num_reqs_per_rank),) if sum(num_reqs_per_rank) else (1,)


def padding_zero_or_one(num_reqs_per_rank: Sequence[int]) -> tuple[int, ...]:
    """M = 1 or M = 0 for an empty batch (the same on every rank of one implementation)."""
    return (max(num_reqs_per_rank),) if sum(num_reqs_per_rank) else (0, 1)


EMPTY_BATCH_PADDING: dict[str, PaddingFunction] = {"one": padding_one, "zero_or_one": padding_zero_or_one}


def reqs_per_rank_choices(padding: str, num_reqs_per_rank: Sequence[int]) -> tuple[int, ...]:
    """The values of max_num_reqs_per_rank rule value ``padding`` allows for a batch whose ranks own
    ``num_reqs_per_rank`` requests, ascending: the reference's is the last."""
    return EMPTY_BATCH_PADDING[padding](list(num_reqs_per_rank))
