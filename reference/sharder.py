"""The reference sharder: the three operations of one sampling step.

1. ``shard_sampler_inputs``: owner-sort the batch, build this rank's local
   batch, local grammar output and the shard metadata.
2. ``all_to_all_logits``: exchange vocab-sharded logits rows so the owner holds
   full-vocab rows of its requests.
3. ``gather_sampler_output``: all-gather the padded per-rank sampler results
   and restore batch order.

Wire layout of the all-gathers (the ``wire.*`` outputs of ``spec/data_model.yaml``): with W the agreed
sampled-id width, M = max_num_reqs_per_rank and C the logprob width, each
rank sends

* int64 ``[M, W + 2 (+1)]``: sampled ids, num_sampled, num_rejected (, NaN sum);
* with logprobs, int64 ``[M * W, C + 1]``: logprob token ids, selected rank;
* with logprobs, float32 ``[M * W, C]``: logprobs;
* with extension fields, one buffer per declared field in its dtype: ``[M, *E]`` per request,
  ``[M * W, *E]`` per logits row.

Row j (column block p for logprobs) belongs to the rank's j-th local request
(its p-th logits row); other rows are padding whose content is unspecified.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.comm import Communicator
from shardspec.reference import output_preconditions, preconditions, profile_rules
from shardspec.reference.plan import OWNER_RULES, ShardPlan, build_plan
from shardspec.spec.model import (
    BatchShardMetadata,
    ExtensionSpec,
    GrammarOutput,
    InputBatch,
    LogprobsTensors,
    SamplerOutput,
    ShardResult,
    num_logprob_columns,
)
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules

# Values that fill what a rank's sampler did not produce (INV-GATHER-SAMPLED-IDS,
# INV-LOGPROBS-VALUES, INV-LOGPROBS-MISSING).
PAD_TOKEN_ID = 0
PAD_LOGPROB = float("-inf")
PAD_SELECTED_RANK = 0


class ReferenceSharder:
    # The version of the specification this implementation targets (docs/validate-your-implementation.md).
    SPEC_VERSION = "0.5.0"
    # It follows the rules of any profile (spec/rules.py) but these owner rules; the suite passes the run's
    # profile's rules as ``rules``.
    SPEC_RULES = {"owner": OWNER_RULES}

    def __init__(
        self,
        max_num_reqs: int,
        max_num_logits_per_req: int,
        *,
        comm: Communicator,
        device: torch.device | str = "cpu",
        check_preconditions: bool = True,
        rules: Rules | None = None,
        adaptive_verification_enabled: bool = False,
    ):
        """``rules``: the profile's rules the sharder follows (None: the default profile's)."""
        rules = rules or default_rules()
        # Refused before anything is allocated, whatever check_preconditions says: one comparison per sharder.
        self.check_construction(rules, comm, max_num_reqs)
        self.max_num_reqs = max_num_reqs
        self.max_num_logits_per_req = max_num_logits_per_req
        self.comm = comm
        self.rank = comm.rank
        self.tp_size = comm.world_size
        self.device = torch.device(device)
        self.check_preconditions = check_preconditions
        self.rules = rules
        # A construction argument where the profile has adaptive verification (CL-ADMITTED-DRAFTS).
        self.adaptive_verification_enabled = adaptive_verification_enabled and rules.adaptive

    def check_construction(self, rules, comm: Communicator, max_num_reqs: int) -> None:
        """PRE-TP-SIZE, PRE-CAPACITY-TP (the profile's construction rule)."""
        preconditions.check_construction(rules, comm.world_size, max_num_reqs, rank=comm.rank)

    # -- step 1 ------------------------------------------------------------
    def shard_sampler_inputs(
        self, batch: InputBatch, grammar: GrammarOutput | None, *, owner_table: np.ndarray | None = None
    ) -> ShardResult:
        """``owner_table``: the engine's per-slot owner table, an argument of owner rule owner_table only
        (CL-OWNER-TABLE); read, never written."""
        if owner_table is not None and not self.rules.owner_by_table:
            raise TypeError(f"owner_table: an argument of owner rule owner_table, not of {self.rules.owner}")
        if self.check_preconditions:
            preconditions.check_input_batch(
                batch,
                max_num_reqs=self.max_num_reqs,
                max_num_logits_per_req=self.max_num_logits_per_req,
                rank=self.rank,
                rules=self.rules,
            )
            if self.rules.owner_by_table:
                preconditions.check_owner_table(
                    owner_table, batch, max_num_reqs=self.max_num_reqs, tp_size=self.tp_size, rank=self.rank
                )
            preconditions.check_grammar_output(grammar, batch, rank=self.rank, rules=self.rules)
        # Rows as the device fields lay them out: the admitted ones in vllm-0.33 (CL-ADMITTED-DRAFTS).
        cu_num_logits = profile_rules.device_cu_num_logits(batch, self.rules)
        plan = self.plan(batch, owner_table)
        local_reqs = plan.local_reqs
        # Owner-sorted logits rows, mapped to the token each one reads.
        sorted_rows = plan.logits_rows_of(plan.owner_sorted_reqs, cu_num_logits)
        logits_indices = batch.logits_indices.to(self.device, torch.int64)
        sorted_logits_indices = logits_indices[torch.from_numpy(sorted_rows).to(self.device)]
        local_batch = self._local_batch(batch, plan, local_reqs, cu_num_logits, logits_indices)
        metadata = BatchShardMetadata(
            tp_size=self.tp_size,
            num_logits_per_rank=[int(n) for n in plan.num_logits_per_rank],
            num_local_logits=int(plan.num_logits_per_rank[self.rank]),
            num_local_reqs=int(local_reqs.shape[0]),
            max_num_reqs_per_rank=plan.max_num_reqs_per_rank,
            gathered_src_indices=torch.from_numpy(plan.gathered_src_indices.astype(np.int64)).to(self.device),
            max_num_logits_per_req=plan.max_num_logits_per_req,
            adaptive_verification_enabled=self.adaptive_verification_enabled,
        )
        local_grammar = profile_rules.local_grammar_output(grammar, batch, local_reqs, self.rules)
        return ShardResult(local_batch, sorted_logits_indices, local_grammar, metadata)

    def plan(self, batch: InputBatch, owner_table: np.ndarray | None = None) -> ShardPlan:
        """This rank's plan: a pure function of the replicated host copies (and the owner table)."""
        cu_num_logits = profile_rules.device_cu_num_logits(batch, self.rules)
        rules = self.rules
        return build_plan(
            batch.idx_mapping_np,
            cu_num_logits,
            self.tp_size,
            self.rank,
            rules.owner,
            owner_table,
            rules.empty_batch_padding,
        )

    def _local_batch(self, batch, plan, local_reqs, cu_num_logits, logits_indices) -> InputBatch:
        device = self.device
        local_counts = plan.num_logits_per_req[local_reqs]
        local_cu = np.zeros(local_reqs.shape[0] + 1, dtype=np.int32)
        np.cumsum(local_counts, out=local_cu[1:])
        local_rows = torch.from_numpy(plan.logits_rows_of(local_reqs, cu_num_logits)).to(device)
        slots = np.asarray(batch.idx_mapping_np)[local_reqs].astype(np.intp)
        local_pos = np.concatenate([np.arange(n) for n in local_counts]) if local_reqs.size else np.zeros(0)
        drafts = batch.num_draft_tokens_per_req
        local_drafts = None if drafts is None else np.asarray(drafts)[local_reqs].astype(np.int32)
        index = torch.from_numpy(local_reqs).to(device)
        rules = self.rules

        def dtype_of(name: str, seed_dtype: torch.dtype) -> torch.dtype:
            return profile_rules.local_dtype(getattr(batch, name), seed_dtype, rules)

        return replace(
            batch,
            req_ids=[batch.req_ids[i] for i in local_reqs.tolist()],
            num_reqs=int(local_reqs.shape[0]),
            idx_mapping=torch.from_numpy(slots).to(device, dtype_of("idx_mapping", torch.int32)),
            idx_mapping_np=slots,
            expanded_idx_mapping=torch.from_numpy(np.repeat(slots, local_counts)).to(
                device, dtype_of("expanded_idx_mapping", torch.int32)
            ),
            expanded_local_pos=torch.from_numpy(local_pos).to(device, dtype_of("expanded_local_pos", torch.int32)),
            # query_start_loc is token space and stays global (CL-LOCAL-FIELDS).
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens.to(device)[index].to(dtype_of("seq_lens", torch.int32)),
            logits_indices=logits_indices[local_rows],
            cu_num_logits=torch.from_numpy(local_cu).to(device, dtype_of("cu_num_logits", torch.int32)),
            cu_num_logits_np=local_cu,
            num_draft_tokens=profile_rules.local_num_draft_tokens(batch, local_reqs, rules),
            num_draft_tokens_per_req=local_drafts,
            **profile_rules.local_profile_fields(batch, local_reqs, rules),
        )

    # -- step 2 ------------------------------------------------------------
    def all_to_all_logits(self, logits_shard: torch.Tensor, metadata: BatchShardMetadata) -> torch.Tensor:
        """[L, V/tp] owner-sorted rows of this rank's vocab shard -> [L_local, V]."""
        if self.check_preconditions:
            output_preconditions.check_logits_shard(logits_shard, metadata, rank=self.rank)
        tp, num_local = metadata.tp_size, metadata.num_local_logits
        shard_width = logits_shard.shape[1]
        received = logits_shard.new_empty(tp * num_local, shard_width)
        self.comm.all_to_all_single(received, logits_shard.contiguous(), [num_local] * tp, metadata.num_logits_per_rank)
        # Chunk r came from rank r, which holds vocab columns [r*Vs, (r+1)*Vs).
        return received.view(tp, num_local, shard_width).permute(1, 0, 2).reshape(num_local, tp * shard_width)

    # -- step 3 ------------------------------------------------------------
    def gather_sampler_output(
        self,
        local_output: SamplerOutput | None,
        metadata: BatchShardMetadata,
        global_batch: InputBatch,
        local_batch: InputBatch,
        *,
        gather_num_nans: bool = False,
        logprobs_dims: tuple[int, int] | None = None,
        extension_fields: dict[str, ExtensionSpec] | None = None,
    ) -> SamplerOutput:
        if self.check_preconditions:
            # The declarations are replicated: checked first, so every rank rejects them alike.
            output_preconditions.check_extension_declarations(extension_fields, rank=self.rank)
            output_preconditions.check_local_output(
                local_output,
                local_batch,
                gather_num_nans=gather_num_nans,
                logprobs_dims=logprobs_dims,
                rank=self.rank,
            )
            output_preconditions.check_local_extensions(local_output, local_batch, extension_fields, rank=self.rank)
        packed = self._pack_sampled(local_output, metadata, local_batch, gather_num_nans)
        gathered = self._all_gather(packed)
        logprobs_tensors = None
        if logprobs_dims is not None:
            logprobs_tensors = self._gather_logprobs(local_output, metadata, global_batch, local_batch, logprobs_dims)
        extensions = None
        if extension_fields is not None:
            extensions = self._gather_extensions(local_output, metadata, global_batch, local_batch, extension_fields)
        width = metadata.max_num_logits_per_req
        rows = gathered[metadata.gathered_src_indices]
        return SamplerOutput(
            sampled_token_ids=rows[:, :width].clone(),
            logprobs_tensors=logprobs_tensors,
            num_nans=rows[:, width + 2].to(torch.int32) if gather_num_nans else None,
            num_sampled=rows[:, width].to(torch.int32),
            num_rejected=rows[:, width + 1].to(torch.int32),
            extensions=extensions,
        )

    def _all_gather(self, send: torch.Tensor) -> torch.Tensor:
        received = send.new_empty(self.tp_size * send.shape[0], *send.shape[1:])
        self.comm.all_gather_into_tensor(received, send)
        return received

    def _pack_sampled(self, local_output, metadata, local_batch, gather_num_nans) -> torch.Tensor:
        width = metadata.max_num_logits_per_req
        num_cols = width + 2 + (1 if gather_num_nans else 0)
        # Padding rows are unspecified on the wire; zeros keep the reference readable.
        packed = torch.zeros(metadata.max_num_reqs_per_rank, num_cols, dtype=torch.int64, device=self.device)
        num_local = metadata.num_local_reqs
        if local_output is None or num_local == 0:
            return packed
        ids = local_output.sampled_token_ids
        copied = min(ids.shape[1], width)  # narrower: zero-filled; wider: truncated
        packed[:num_local, :copied] = ids[:, :copied].to(torch.int64)
        packed[:num_local, width] = local_output.num_sampled.to(torch.int64)
        packed[:num_local, width + 1] = local_output.num_rejected.to(torch.int64)
        if gather_num_nans:
            owner = _row_owner(local_batch.cu_num_logits_np, self.device)
            nan_sums = torch.zeros(num_local, dtype=torch.int64, device=self.device)
            nan_sums.index_add_(0, owner, local_output.num_nans.to(self.device, torch.int64))
            packed[:num_local, width + 2] = nan_sums
        return packed

    def _gather_logprobs(self, local_output, metadata, global_batch, local_batch, logprobs_dims) -> LogprobsTensors:
        width = metadata.max_num_logits_per_req
        num_cols = num_logprob_columns(logprobs_dims)
        num_send_rows = metadata.max_num_reqs_per_rank * width
        # int64, inferred from the fill value
        send_ids = torch.full((num_send_rows, num_cols + 1), PAD_TOKEN_ID, device=self.device)
        send_ids[:, num_cols] = PAD_SELECTED_RANK
        send_logprobs = torch.full((num_send_rows, num_cols), PAD_LOGPROB, dtype=torch.float32, device=self.device)
        lp = None if local_output is None else local_output.logprobs_tensors
        if lp is not None and local_batch.num_logits > 0:
            wire_rows = _local_wire_rows(local_batch.cu_num_logits_np, width, self.device)
            copied = min(lp.logprob_token_ids.shape[1], num_cols)
            send_ids[wire_rows, :copied] = lp.logprob_token_ids[:, :copied].to(torch.int64)
            send_ids[wire_rows, num_cols] = lp.selected_token_ranks.to(torch.int64)
            send_logprobs[wire_rows, :copied] = lp.logprobs[:, :copied].to(torch.float32)
        gathered_ids = self._all_gather(send_ids)
        gathered_logprobs = self._all_gather(send_logprobs)
        cu = profile_rules.device_cu_num_logits(global_batch, self.rules)
        src_rows = _gathered_row_sources(cu, metadata, self.device)
        # Ls rows: the admitted rows first, the rest (only with admitted counts) padding (INV-LOGPROBS-SHAPES).
        num_rows = profile_rules.num_gathered_logprob_rows(global_batch)
        # int64, inferred from the fill value
        ids = torch.full((num_rows, num_cols + 1), PAD_TOKEN_ID, device=self.device)
        ids[:, num_cols] = PAD_SELECTED_RANK
        values = torch.full((num_rows, num_cols), PAD_LOGPROB, dtype=torch.float32, device=self.device)
        ids[: src_rows.shape[0]] = gathered_ids[src_rows]
        values[: src_rows.shape[0]] = gathered_logprobs[src_rows]
        return LogprobsTensors(
            logprob_token_ids=ids[:, :num_cols].clone(),
            logprobs=values,
            selected_token_ranks=ids[:, num_cols].clone(),
            **profile_rules.gathered_cu_num_generated(global_batch, self.adaptive_verification_enabled, self.rules),
        )

    def _gather_extensions(
        self, local_output, metadata, global_batch, local_batch, extension_fields: dict[str, ExtensionSpec]
    ) -> dict[str, torch.Tensor]:
        """One all-gather per declared field, in declaration order, in the named fields' padded layouts.

        A per-request field travels like the sampled ids (row j is local request j, M rows); a
        per-row field like the logprobs (row j * W + p is local request j's p-th row, M * W rows).
        """
        width, num_local = metadata.max_num_logits_per_req, metadata.num_local_reqs
        local = (local_output.extensions if local_output is not None else None) or {}
        wire_rows = _local_wire_rows(local_batch.cu_num_logits_np, width, self.device)
        cu = profile_rules.device_cu_num_logits(global_batch, self.rules)
        gathered_fields = {}
        for name, spec in extension_fields.items():
            per_request = spec.per == "request"
            num_send_rows = metadata.max_num_reqs_per_rank * (1 if per_request else width)
            # Padding rows are unspecified on the wire; zeros keep the reference readable.
            send = torch.zeros((num_send_rows, *spec.shape), dtype=spec.dtype, device=self.device)
            value = local.get(name)
            if value is not None and value.shape[0] > 0:
                target = slice(0, num_local) if per_request else wire_rows
                send[target] = value.to(self.device)
            gathered = self._all_gather(send)
            sources = metadata.gathered_src_indices if per_request else _gathered_row_sources(cu, metadata, self.device)
            gathered_fields[name] = gathered[sources].clone()
        return gathered_fields


def _local_wire_rows(local_cu_num_logits, width: int, device) -> torch.Tensor:
    """[L_local] wire row of each local logits row: local request j's p-th row goes to j * W + p."""
    cu = np.asarray(local_cu_num_logits)
    owner = _row_owner(cu, device)
    pos = torch.arange(int(cu[-1]), device=device) - torch.from_numpy(cu).to(device)[owner]
    return owner * width + pos


def _gathered_row_sources(cu: np.ndarray, metadata: BatchShardMetadata, device) -> torch.Tensor:
    """[L] row of each batch logits row in the rank-major gathered per-row buffers."""
    owner = _row_owner(cu, device)
    pos = torch.arange(int(cu[-1]), device=device) - torch.from_numpy(cu).to(device)[owner]
    return metadata.gathered_src_indices[owner] * metadata.max_num_logits_per_req + pos


def _row_owner(cu_num_logits, device) -> torch.Tensor:
    """[L] index of the request each logits row belongs to."""
    counts = np.diff(cu_num_logits)
    return torch.from_numpy(np.repeat(np.arange(counts.shape[0]), counts)).to(device)
