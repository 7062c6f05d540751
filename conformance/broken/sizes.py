"""Defects that show only at a size's end the generators did not draw before (conformance/cases/sizes.py).

Each passed every case of the default run before the ``size`` axis: no case had a grammar output that lists
no request (G = 0), and no case asked for as many logprobs as the vocabulary has tokens (k = V or t = V:
the generators drew k up to 4 and t up to 6). :data:`CASES` are the cases that expose them.
"""

from __future__ import annotations

from dataclasses import replace

from shardspec.reference import ReferenceSharder
from shardspec.spec.case import Case

# A staging buffer for the gathered logprobs: the sampled token and up to 32 more (vLLM's default
# max_logprobs is 20).
STAGED_COLUMNS = 33


class GrammarListingNothingHandedOn(ReferenceSharder):
    """INV-LOCAL-GRAMMAR: a grammar output that lists no request is handed on as every rank's local one (a
    short cut for "nothing to slice"), where the spec says None."""

    def shard_sampler_inputs(self, batch, grammar=None, **kwargs):
        result = super().shard_sampler_inputs(batch, grammar, **kwargs)
        if grammar is not None and not grammar.structured_output_request_ids:
            return result._replace(local_grammar_output=grammar)
        return result


class LogprobColumnsStagedInFixedBuffer(ReferenceSharder):
    """INV-LOGPROBS-SHAPES: the gathered logprobs pass through a buffer of STAGED_COLUMNS columns, so a width
    1 + max(k, t) above it is cut (k and t up to the vocabulary are valid)."""

    def gather_sampler_output(self, *args, **kwargs):
        out = super().gather_sampler_output(*args, **kwargs)
        tensors = out.logprobs_tensors
        if tensors is None or tensors.logprobs.shape[1] <= STAGED_COLUMNS:
            return out
        cut = tensors._replace(
            logprob_token_ids=tensors.logprob_token_ids[:, :STAGED_COLUMNS],
            logprobs=tensors.logprobs[:, :STAGED_COLUMNS],
        )
        return replace(out, logprobs_tensors=cut)


def _case(case_id: str, **fields) -> Case:
    return Case(case_id=case_id, tp_size=2, description=f"corpus case {case_id}", **fields)


CASES = [
    # Three requests, a grammar output listing none of them.
    _case("grammar-lists-nothing", slots=[0, 1, 2], num_logits_per_req=[1, 2, 1], grammar_positions=[]),
    # As many top logprobs and token ids as the vocabulary of 40 tokens has: 41 columns.
    _case(
        "logprobs-whole-vocabulary",
        slots=[0, 1, 2],
        num_logits_per_req=[1, 2, 1],
        vocab_size=40,
        logprobs_dims=(40, 40),
    ),
]
