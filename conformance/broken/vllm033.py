"""Defects against vLLM 0.33's rules (profile vllm-0.33): admitted draft counts, grammar blocks,
seq_lens_cpu_upper_bound, local dtypes and the empty batch's padding. Several are what vllm-seed
prescribes: one profile's rule is another's defect."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.conformance.broken.support import EmptyBatchPaddedTo, LogprobsRewritingSharder, MisreportingSharder
from shardspec.reference import ReferenceSharder
from shardspec.reference.plan import build_plan
from shardspec.spec.model import GrammarOutput


class SeqLensUpperBoundGlobal(MisreportingSharder):
    """INV-LOCAL-SEQ-LENS-UPPER-BOUND: the local batch keeps the batch's seq_lens_cpu_upper_bound (every request's)."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, seq_lens_cpu_upper_bound=batch.seq_lens_cpu_upper_bound)


class AdmittedDraftsLocalized(MisreportingSharder):
    """INV-LOCAL-ADMITTED-DRAFTS: the local batch carries the owned requests' admitted counts, a second reading."""

    def corrupt(self, batch, result):
        admitted = batch.num_admitted_draft_tokens
        if admitted is None:
            return result
        owned = [batch.req_ids.index(req_id) for req_id in result.local_batch.req_ids]
        return self.corrupt_local_batch(result, num_admitted_draft_tokens=np.asarray(admitted)[owned])


class GrammarRowsNotBlocks(MisreportingSharder):
    """INV-LOCAL-GRAMMAR: the local bitmask keeps one row per logits row (the seed's layout), not whole blocks."""

    def corrupt(self, batch, result):
        grammar = result.local_grammar_output
        if grammar is None:
            return result
        block = grammar.grammar_bitmask.shape[0] // len(grammar.structured_output_request_ids)
        cu = np.asarray(result.local_batch.cu_num_logits_np, dtype=np.int64)
        local = {req_id: j for j, req_id in enumerate(result.local_batch.req_ids)}
        rows = [
            k * block + p
            for k, req_id in enumerate(grammar.structured_output_request_ids)
            for p in range(int(cu[local[req_id] + 1] - cu[local[req_id]]))
        ]
        index = torch.tensor(rows, dtype=torch.int64, device=grammar.grammar_bitmask.device)
        return result._replace(local_grammar_output=replace(grammar, grammar_bitmask=grammar.grammar_bitmask[index]))


class AcceptableDraftsNotSliced(MisreportingSharder):
    """INV-LOCAL-GRAMMAR: the local grammar output keeps every listed request's num_acceptable_drafts."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        self._counts = None if grammar is None else grammar.num_acceptable_drafts
        return super().shard_sampler_inputs(batch, grammar, **kwargs)

    def corrupt(self, batch, result):
        grammar = result.local_grammar_output
        if grammar is None or self._counts is None:
            return result
        local = GrammarOutput(grammar.structured_output_request_ids, grammar.grammar_bitmask, list(self._counts))
        return result._replace(local_grammar_output=local)


class PlanFollowsScheduledCounts(MisreportingSharder):
    """INV-SPLITS: num_logits_per_rank counts the scheduled rows of cu_num_logits_np, not the admitted ones."""

    def corrupt(self, batch, result):
        scheduled = build_plan(batch.idx_mapping_np, np.asarray(batch.cu_num_logits_np), self.tp_size, self.rank)
        splits = [int(n) for n in scheduled.num_logits_per_rank]
        return result._replace(metadata=replace(result.metadata, num_logits_per_rank=splits))


class LocalDraftsScheduled(MisreportingSharder):
    """INV-LOCAL-DRAFTS: local num_draft_tokens counts the scheduled drafts when the budget binds."""

    def corrupt(self, batch, result):
        drafts = result.local_batch.num_draft_tokens_per_req
        total = 0 if drafts is None else int(np.asarray(drafts).sum())
        return self.corrupt_local_batch(result, num_draft_tokens=total)


class CuNumGeneratedSeedRule(ReferenceSharder):
    """INV-CU-NUM-GENERATED: under adaptive verification the host list is returned and no device prefix sums."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        lp = out.logprobs_tensors
        if lp is None or lp.cu_num_generated_tokens_tensor is None:
            return out
        cu = [int(c) for c in np.asarray(global_batch.cu_num_logits_np)]
        lp = lp._replace(cu_num_generated_tokens=cu, cu_num_generated_tokens_tensor=None)
        return replace(out, logprobs_tensors=lp)


class AdaptiveFlagDropped(MisreportingSharder):
    """INV-META-SCALARS: metadata.adaptive_verification_enabled is always False."""

    def corrupt(self, batch, result):
        return result._replace(metadata=replace(result.metadata, adaptive_verification_enabled=False))


class LocalIdxMappingFixedInt32(MisreportingSharder):
    """INV-LOCAL-IDX-MAPPING: the local idx_mapping is int32 whatever the batch's dtype (the seed's rule)."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, idx_mapping=result.local_batch.idx_mapping.to(torch.int32))


class EmptyBatchPadsToTwo(EmptyBatchPaddedTo):
    """INV-META-SCALARS: an empty batch pads to 2 rows per rank (0 or 1 are allowed)."""

    reqs_per_rank = 2


class LogprobRowsAdmittedOnly(LogprobsRewritingSharder):
    """INV-LOGPROBS-SHAPES: the gathered logprobs have the L admitted rows, not cu_num_logits_np[N] rows."""

    def rewrite_logprobs(self, lp, global_batch):
        rows = int(global_batch.cu_num_logits[-1]) if global_batch.num_reqs else 0
        return lp._replace(
            logprob_token_ids=lp.logprob_token_ids[:rows].clone(),
            logprobs=lp.logprobs[:rows].clone(),
            selected_token_ranks=lp.selected_token_ranks[:rows].clone(),
        )


class ExtensionRowsScheduled(ReferenceSharder):
    """INV-GATHER-EXTENSIONS: a per-row extension field keeps the scheduled bound's rows, like the logprobs.

    cu_num_logits_np[N] rows: the admitted rows come first and the rest are zeros; under adaptive
    verification with the budget binding, the field has rows no request has."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        fields = kwargs.get("extension_fields") or {}
        if out.extensions is None or global_batch.num_admitted_draft_tokens is None:
            return out
        bound = int(global_batch.cu_num_logits_np[-1])
        padded = dict(out.extensions)
        for name, spec in fields.items():
            value = padded[name]
            if spec.per != "request" and value.shape[0] < bound:
                padded[name] = torch.cat([value, value.new_zeros(bound - value.shape[0], *value.shape[1:])])
        return replace(out, extensions=padded)
