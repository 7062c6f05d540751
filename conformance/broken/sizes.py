"""Defects that show only at a size's end the generators did not draw before (conformance/cases/sizes.py).

Each passed every case of the default run before the ``size`` axis: no case had a grammar output that lists
no request (G = 0), and no case asked for as many logprobs as the vocabulary has tokens (k = V or t = V:
the generators drew k up to 4 and t up to 6). Nor did any case declare extension fields as an empty dict or
one of each kind and dtype (at most a few fields), an entry of more than 32 elements, a local sampled-id or
logprob width of 0 (the generators drew 1 and up) or a sampled-id width past 32 columns (up to 9). One is no
such defect: local logprobs past 33 columns (LocalLogprobsSkippedPastFixedBuffer) were drawn before, by the
toy sampler at k = V, and the old run rejected it there too; it stays as the proof that c's largest end is
judged. :data:`CASES` are the cases that expose them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from shardspec.conformance.cases.batches import local_requests
from shardspec.conformance.cases.sizes import EVERY_EXTENSION, WIDE_LOCAL_WIDTH, vocabulary_wide_entry
from shardspec.reference import ReferenceSharder
from shardspec.spec.case import Case, ExplicitLocalOutput
from shardspec.spec.case_edits import EXTENSIONS_DECLARED_EMPTY

# A staging buffer for the gathered logprobs: the sampled token and up to 32 more (vLLM's default
# max_logprobs is 20).
STAGED_COLUMNS = 33
# A table of extension fields sized for the few an engine is expected to declare.
FIELD_SLOTS = 8
# A staging buffer for one extension entry: 32 elements (a bitmask of a 1024-token vocabulary in words).
STAGED_ENTRY = 32
# A staging buffer for a rank's local sampled ids: 32 columns (more than any draft count is expected to be).
STAGED_IDS = 32


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


class ExtensionsNoneWhenNoneDeclared(ReferenceSharder):
    """INV-GATHER-EXTENSIONS: tests the declarations for truth (``if extension_fields:``), so an empty
    declaration returns extensions None, where a declaration of no field returns {} (a caller iterating over
    the gathered fields finds None)."""

    def gather_sampler_output(self, *args, extension_fields=None, **kwargs):
        out = super().gather_sampler_output(*args, extension_fields=extension_fields, **kwargs)
        return out if extension_fields else replace(out, extensions=None)


class ExtensionFieldsInFixedTable(ReferenceSharder):
    """INV-GATHER-EXTENSIONS: gathers the declared fields through a table of FIELD_SLOTS entries, so the fields
    declared after the table is full are dropped (any number of fields is valid)."""

    def gather_sampler_output(self, *args, extension_fields=None, **kwargs):
        out = super().gather_sampler_output(*args, extension_fields=extension_fields, **kwargs)
        if not out.extensions or len(out.extensions) <= FIELD_SLOTS:
            return out
        kept = dict(list(out.extensions.items())[:FIELD_SLOTS])
        return replace(out, extensions=kept)


class ExtensionEntriesStagedInFixedBuffer(ReferenceSharder):
    """INV-GATHER-EXTENSIONS: each gathered extension entry passes through a buffer of STAGED_ENTRY elements, so
    the elements of a wider entry past it come back zero (an entry of any trailing shape E is valid)."""

    def gather_sampler_output(self, *args, **kwargs):
        out = super().gather_sampler_output(*args, **kwargs)
        if not out.extensions:
            return out
        return replace(out, extensions={name: _staged(value) for name, value in out.extensions.items()})


def _staged(value: torch.Tensor) -> torch.Tensor:
    if value.dim() < 2 or math.prod(value.shape[1:]) <= STAGED_ENTRY:
        return value
    flat = value.flatten(1)
    cut = torch.zeros_like(flat)
    cut[:, :STAGED_ENTRY] = flat[:, :STAGED_ENTRY]
    return cut.reshape(value.shape)


class ZeroWidthIdsTakenForAnIdleRank(ReferenceSharder):
    """INV-GATHER-COUNTS: tests a local output for emptiness by ``sampled_token_ids.numel() == 0`` (true for a rank
    that owns nothing), so a local output of width 0 (valid: narrower rows are zero-filled) is sent as padding
    and its requests come back with nothing sampled."""

    def gather_sampler_output(self, local_output, *args, **kwargs):
        if local_output is not None and local_output.sampled_token_ids.numel() == 0:
            local_output = _sent_as_padding(local_output)
        return super().gather_sampler_output(local_output, *args, **kwargs)


class LocalIdsSkippedPastFixedBuffer(ReferenceSharder):
    """INV-GATHER-COUNTS: stages a rank's local sampled ids in a buffer of STAGED_IDS columns and skips a local output
    that does not fit (valid: a wider one is cut to W), so its requests come back with nothing sampled."""

    def gather_sampler_output(self, local_output, *args, **kwargs):
        if local_output is not None and local_output.sampled_token_ids.shape[1] > STAGED_IDS:
            local_output = _sent_as_padding(local_output)
        return super().gather_sampler_output(local_output, *args, **kwargs)


def _sent_as_padding(out):
    """The local output a rank that owns nothing would send: no tokens, no counts."""
    return replace(out, num_sampled=torch.zeros_like(out.num_sampled), num_rejected=torch.zeros_like(out.num_rejected))


class ZeroWidthLogprobsTakenForNone(ReferenceSharder):
    """INV-LOGPROBS-VALUES: takes local logprobs without a column for none, so logprobs of width 0 (valid: narrower
    rows are filled) come back as padding, the rows' selected-token ranks too."""

    def gather_sampler_output(self, local_output, *args, **kwargs):
        lp = None if local_output is None else local_output.logprobs_tensors
        if lp is not None and lp.logprobs.dim() == 2 and lp.logprobs.shape[1] == 0:
            local_output = replace(local_output, logprobs_tensors=None)
        return super().gather_sampler_output(local_output, *args, **kwargs)


class LocalLogprobsSkippedPastFixedBuffer(ReferenceSharder):
    """INV-LOGPROBS-VALUES: stages a rank's local logprobs in a buffer of STAGED_COLUMNS columns and skips local
    logprobs that do not fit (valid: wider ones are cut to C), so the rows' selected-token ranks come back as
    padding."""

    def gather_sampler_output(self, local_output, *args, **kwargs):
        lp = None if local_output is None else local_output.logprobs_tensors
        if lp is not None and lp.logprobs.shape[1] > STAGED_COLUMNS:
            local_output = replace(local_output, logprobs_tensors=None)
        return super().gather_sampler_output(local_output, *args, **kwargs)


def _case(case_id: str, **fields) -> Case:
    return Case(case_id=case_id, tp_size=2, description=f"corpus case {case_id}", **fields)


def _explicit(case_id: str, width: int, cols: int | None, **fields) -> Case:
    """Three one-row requests over tp 2 with explicit outputs of ``width`` sampled-id columns and ``cols``
    logprob columns (None: no logprobs)."""
    case = _case(case_id, slots=[0, 1, 2], num_logits_per_req=[1, 1, 1], **fields)
    outputs = {}
    for rank in range(case.tp_size):
        rows = len(local_requests(case, rank))
        outputs[rank] = ExplicitLocalOutput(
            sampled_token_ids=[[3] * width for _ in range(rows)],
            num_sampled=[1] * rows,  # not the padding's 0
            num_rejected=[0] * rows,
            num_nans=[0] * rows,
            logprob_token_ids=None if cols is None else [[5] * cols for _ in range(rows)],
            logprobs=None if cols is None else [[-0.5] * cols for _ in range(rows)],
            selected_token_ranks=None if cols is None else [7] * rows,  # not the padding's 0
        )
    return replace(case, local_outputs=outputs)


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
    # extension_fields={}: declared, none of them.
    _case(
        "extensions-declared-empty", slots=[0, 1, 2], num_logits_per_req=[1, 2, 1], edits=[EXTENSIONS_DECLARED_EMPTY]
    ),
    # One extension field of each kind and dtype the spec supports: 18 all-gathers after the named ones.
    _case("extensions-every-kind-and-dtype", slots=[0, 1, 2], num_logits_per_req=[1, 2, 1], extensions=EVERY_EXTENSION),
    # A per-row entry as wide as the vocabulary of 40 tokens (a sampling mask of bools).
    _case(
        "extension-entry-vocabulary-wide",
        slots=[0, 1, 2],
        num_logits_per_req=[1, 2, 1],
        vocab_size=40,
        extensions={"mask": vocabulary_wide_entry(40)},
    ),
    # Local outputs with no sampled-id column, then with no logprob column (the sampled token's alone).
    _explicit("sampled-ids-width-zero", 0, None, logprobs_dims=None),
    _explicit("logprobs-width-zero", 1, 0, logprobs_dims=(0, 0)),
    # Local outputs wider than 32 sampled-id columns, then than 33 logprob columns.
    _explicit("sampled-ids-wide", WIDE_LOCAL_WIDTH, None, logprobs_dims=None),
    _explicit("logprobs-wide", 1, WIDE_LOCAL_WIDTH + 1, logprobs_dims=(1, 2)),
]
