"""The step an engine runs each decoding step, in one place: shard → all-to-all → sample → gather.

Every caller that runs a whole step goes through :func:`engine_step`: the
conformance suite (which observes each call), the goldens, and the
benchmarks (which time it). What differs between them is what surrounds
each call, passed as ``call``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# call(step, fn, *args, **kwargs): runs fn(*args, **kwargs) for the named step and returns its result.
Call = Callable[..., Any]


def plain_call(step: str, fn, *args, **kwargs):
    return fn(*args, **kwargs)


def engine_step(
    sharder,
    batch,
    grammar,
    logits_shard_of: Callable[[Any], Any],
    sample: Callable[[Any, Any], Any],
    gather_kwargs: dict | None = None,
    call: Call = plain_call,
    shard_kwargs: dict | None = None,
):
    """One step on ``sharder``; returns ``(shard, full_vocab_logits, local_output, gathered)``.

    ``logits_shard_of(shard)``: this rank's vocab shard of the owner-sorted logits rows (the LM head's
    output, in the order ``shard.sorted_logits_indices`` gives). ``sample(full_vocab_logits, shard)``:
    the engine's sampler on the owned rows. ``gather_kwargs``: options of ``gather_sampler_output``;
    ``shard_kwargs``: those of ``shard_sampler_inputs`` (the owner table under owner rule owner_table).
    """
    shard = call("shard", sharder.shard_sampler_inputs, batch, grammar, **(shard_kwargs or {}))
    full = call("all_to_all", sharder.all_to_all_logits, logits_shard_of(shard), shard.metadata)
    local_output = call("sample", sample, full, shard)
    gathered = call(
        "gather",
        sharder.gather_sampler_output,
        local_output,
        shard.metadata,
        batch,
        shard.local_batch,
        **(gather_kwargs or {}),
    )
    return shard, full, local_output, gathered
