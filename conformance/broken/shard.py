"""Broken shard steps: ownership, order, metadata, local batch, grammar. One defect each."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.conformance.broken.support import EmptyBatchPaddedTo, MisreportingSharder
from shardspec.reference import ReferenceSharder
from shardspec.reference.plan import build_plan
from shardspec.spec.model import GrammarOutput


# -- ownership and order -------------------------------------------------------
class OwnerBySlotDivision(ReferenceSharder):
    """INV-OWNER: owner = (slot // tp) mod tp instead of slot mod tp."""

    def plan(self, batch, owner_table=None):
        slots = np.asarray(batch.idx_mapping_np) // self.tp_size
        return build_plan(slots, np.asarray(batch.cu_num_logits_np, np.int64), self.tp_size, self.rank)


class OwnerBySlotUnderPositionRule(ReferenceSharder):
    """INV-OWNER: owner = slot mod tp where the profile's owner rule is the batch position (vLLM 0.33's
    rule kept under vllm-0.34)."""

    def plan(self, batch, owner_table=None):
        cu = np.asarray(batch.cu_num_logits_np, np.int64)
        return build_plan(batch.idx_mapping_np, cu, self.tp_size, self.rank, "slot_mod_tp")


class RangesOfCeilSize(ReferenceSharder):
    """INV-OWNER: contiguous ranges of ceil(N / tp) positions each (torch.chunk's split), so the last ranks own
    fewer requests than the balanced split gives them, or none."""

    def plan(self, batch, owner_table=None):
        plan = super().plan(batch, owner_table)
        size = max(1, -(-batch.num_reqs // self.tp_size))
        # Each position's range index, below tp, stands in for a slot whose value mod tp is that index.
        slots = np.arange(batch.num_reqs) // size
        cu = np.asarray(plan.num_logits_per_req, np.int64).cumsum()
        return build_plan(slots, np.concatenate([[0], cu]), self.tp_size, self.rank, "slot_mod_tp")


class UnstableOwnerSort(ReferenceSharder):
    """INV-SORTED-LOGITS-INDICES: requests of one owner in reverse batch order (not a stable sort)."""

    def plan(self, batch, owner_table=None):
        plan = super().plan(batch, owner_table)
        order = np.lexsort((-np.arange(plan.owners.shape[0]), plan.owners))
        return replace(plan, owner_sorted_reqs=order)


class SourceIndicesReversed(ReferenceSharder):
    """INV-GATHERED-SRC-INDICES: index within owner counted from the owner's last request."""

    def plan(self, batch, owner_table=None):
        plan = super().plan(batch, owner_table)
        reversed_index = plan.num_reqs_per_rank[plan.owners] - 1 - plan.index_within_owner
        return replace(plan, index_within_owner=reversed_index)


# -- metadata ------------------------------------------------------------------
class SplitsAsNumpyInts(MisreportingSharder):
    """INV-SPLITS: num_logits_per_rank holds numpy int64 scalars, not Python ints."""

    def corrupt(self, batch, result):
        counts = [np.int64(n) for n in result.metadata.num_logits_per_rank]
        return result._replace(metadata=replace(result.metadata, num_logits_per_rank=counts))


class SplitsCountRequests(MisreportingSharder):
    """INV-SPLITS: num_logits_per_rank counts requests per rank instead of logits rows."""

    def corrupt(self, batch, result):
        owners = np.asarray(batch.idx_mapping_np) % self.tp_size
        counts = [int(n) for n in np.bincount(owners, minlength=self.tp_size)]
        return result._replace(
            metadata=replace(result.metadata, num_logits_per_rank=counts, num_local_logits=counts[self.rank])
        )


class EmptyBatchZeroReqsPerRank(EmptyBatchPaddedTo):
    """INV-META-SCALARS: an empty batch gets max_num_reqs_per_rank 0 instead of 1."""

    reqs_per_rank = 0


# -- the local batch ------------------------------------------------------------
class ReqIdsReversed(MisreportingSharder):
    """INV-LOCAL-REQS: local req_ids listed in reverse batch order."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, req_ids=list(reversed(result.local_batch.req_ids)))


class IdxMappingInt64(MisreportingSharder):
    """INV-LOCAL-IDX-MAPPING: local idx_mapping keeps the batch's int64 dtype instead of int32."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, idx_mapping=result.local_batch.idx_mapping.to(torch.int64))


class IdxMappingHostStale(MisreportingSharder):
    """INV-LOCAL-IDX-MAPPING: the host copy idx_mapping_np is not localized (still the batch's)."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, idx_mapping_np=np.asarray(batch.idx_mapping_np).copy())


class CuNumLogitsDeviceOffByOne(MisreportingSharder):
    """INV-LOCAL-CU-NUM-LOGITS: the device copy starts at 1 instead of 0 (host copy right)."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, cu_num_logits=result.local_batch.cu_num_logits + 1)


class EmptyRankCuNumLogitsEmpty(MisreportingSharder):
    """INV-LOCAL-CU-NUM-LOGITS: a rank owning nothing returns cu_num_logits [] instead of [0]."""

    def corrupt(self, batch, result):
        if result.local_batch.num_reqs:
            return result
        local = result.local_batch
        return self.corrupt_local_batch(
            result, cu_num_logits=local.cu_num_logits[:0], cu_num_logits_np=local.cu_num_logits_np[:0]
        )


class IdleRankPrefixSumsInt32(MisreportingSharder):
    """INV-LOCAL-CU-NUM-LOGITS: a rank owning nothing returns cu_num_logits int32 [1] whatever the batch's dtype
    (what CL-EMPTY-RANK's prose once said, against CL-LOCAL-DTYPES)."""

    def corrupt(self, batch, result):
        local = result.local_batch
        if local.num_reqs or local.cu_num_logits.dtype == torch.int32:
            return result
        return self.corrupt_local_batch(result, cu_num_logits=local.cu_num_logits.to(torch.int32))


class LogitsIndicesLeadingRows(MisreportingSharder):
    """INV-LOCAL-LOGITS-INDICES: local logits_indices are the batch's first L_local rows, not the owned ones."""

    def corrupt(self, batch, result):
        num_local = result.metadata.num_local_logits
        return self.corrupt_local_batch(result, logits_indices=batch.logits_indices[:num_local].to(torch.int64))


class ExpandedLocalPosZero(MisreportingSharder):
    """INV-LOCAL-EXPANDED: expanded_local_pos is 0 on every row (as if one row per request)."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(
            result, expanded_local_pos=torch.zeros_like(result.local_batch.expanded_local_pos)
        )


class SeqLensGlobal(MisreportingSharder):
    """INV-LOCAL-SEQ-LENS: local seq_lens is the whole batch's, not the owned requests'."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, seq_lens=batch.seq_lens.clone())


class SeqLensOnHost(MisreportingSharder):
    """INV-LOCAL-SEQ-LENS: local seq_lens is a host numpy array instead of a device tensor."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, seq_lens=result.local_batch.seq_lens.cpu().numpy())


class DraftsNotSliced(MisreportingSharder):
    """INV-LOCAL-DRAFTS: num_draft_tokens_per_req and num_draft_tokens stay the whole batch's."""

    def corrupt(self, batch, result):
        drafts = batch.num_draft_tokens_per_req
        return self.corrupt_local_batch(
            result,
            num_draft_tokens=batch.num_draft_tokens,
            num_draft_tokens_per_req=None if drafts is None else drafts.copy(),
        )


class QueryStartLocLocalized(MisreportingSharder):
    """INV-LOCAL-GLOBAL-FIELDS: query_start_loc rebuilt from the owned requests' query lengths."""

    def corrupt(self, batch, result):
        qsl = batch.query_start_loc
        owned = torch.from_numpy(np.flatnonzero(np.asarray(batch.idx_mapping_np) % self.tp_size == self.rank))
        lengths = (qsl[1:] - qsl[:-1])[owned.to(qsl.device)]
        local = torch.zeros(lengths.shape[0] + 1, dtype=qsl.dtype, device=qsl.device)
        local[1:] = torch.cumsum(lengths, 0)
        return self.corrupt_local_batch(result, query_start_loc=local)


class MisalignedIdxMapping(MisreportingSharder):
    """INV-LOCAL-ALIGNMENT (SHOULD): idx_mapping is a view 4 bytes into a packed buffer."""

    def corrupt(self, batch, result):
        values = result.local_batch.idx_mapping
        packed = torch.empty(values.shape[0] + 1, dtype=values.dtype, device=values.device)
        packed[1:] = values
        return self.corrupt_local_batch(result, idx_mapping=packed[1:])


# -- the local grammar output --------------------------------------------------
class GrammarInBatchOrder(MisreportingSharder):
    """INV-LOCAL-GRAMMAR: owned grammar requests listed in batch order, not the grammar output's order."""

    def corrupt(self, batch, result):
        grammar = result.local_grammar_output
        if grammar is None:
            return result
        position = {req_id: i for i, req_id in enumerate(batch.req_ids)}
        cu = np.asarray(batch.cu_num_logits_np)
        ids = list(grammar.structured_output_request_ids)
        starts = np.cumsum([0] + [int(cu[position[r] + 1] - cu[position[r]]) for r in ids])
        ordered = sorted(range(len(ids)), key=lambda k: position[ids[k]])
        rows = [row for k in ordered for row in range(starts[k], starts[k + 1])]
        bitmask = grammar.grammar_bitmask[torch.tensor(rows, dtype=torch.int64, device=grammar.grammar_bitmask.device)]
        return result._replace(local_grammar_output=GrammarOutput([ids[k] for k in ordered], bitmask))


class GrammarEmptyInsteadOfNone(MisreportingSharder):
    """INV-LOCAL-GRAMMAR: a rank owning no grammar request gets an empty grammar output, not None."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        self._grammar = grammar
        return super().shard_sampler_inputs(batch, grammar, **kwargs)

    def corrupt(self, batch, result):
        if self._grammar is None or result.local_grammar_output is not None:
            return result
        empty = self._grammar.grammar_bitmask[:0]
        return result._replace(local_grammar_output=GrammarOutput([], empty))


class GrammarDropped(MisreportingSharder):
    """INV-E2E-TRANSPARENCY: the local grammar output is always None, so no bitmask is applied."""

    def corrupt(self, batch, result):
        return result._replace(local_grammar_output=None)
