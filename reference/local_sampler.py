"""The local sampler of a conformance step: what an engine's sampler would return for one rank.

Between the all-to-all and the gather an engine samples its own rows. A case
names what stands in for that sampler: the toy sampler of
:mod:`shardspec.reference.sampler` on the rank's full-vocab rows and local
batch, or an explicit per-rank output. Its extension fields, local-output
edits and memory layout come from the case (spec/case_edits.py,
spec/layouts.py).
"""

from __future__ import annotations

from shardspec.reference.sampler import toy_sample
from shardspec.spec.case import Case
from shardspec.spec.case_edits import finish_local_output
from shardspec.spec.layouts import lay_out_sampler_output


def local_sampler_output(case: Case, rank: int, full_vocab_logits, shard, device=None):
    """The local sampler's result for ``rank``: toy sampler or the case's explicit output (a rank the case
    does not list supplies None)."""
    device = full_vocab_logits.device if device is None else device
    if case.local_outputs == "toy":
        num_logprobs = None if case.logprobs_dims is None else case.logprobs_dims[0]
        logits = full_vocab_logits[:, : case.vocab_size]
        out = toy_sample(logits, shard.local_batch, shard.local_grammar_output, num_logprobs, case.rules)
    else:
        explicit = case.local_outputs.get(rank)
        out = None if explicit is None else explicit.to_sampler_output(device)
    # The case's extension fields and local-output edits (spec/case_edits.py), then its memory layout.
    out = finish_local_output(out, shard.local_batch, case.extensions, case.edits, device)
    return lay_out_sampler_output(out, case.layouts)
