"""Captured steps: production's step recorded once per shape bucket and replayed from CUDA graphs.

**Not the spec's wire.** The spec's all-to-all sends each rank exactly the rows it owns
(INV-A2A-SPLITS: split sizes ``num_logits_per_rank``, which change from batch to batch) and
INV-WIRE-SEQUENCE fixes the collectives and their sizes. A CUDA graph cannot change split sizes
between replays, so this module pads the wire instead: in a bucket of ``P`` requests per rank and
``W`` rows per request, every rank sends every rank ``R = P * W`` rows, the all-gathers carry
``P`` requests per rank, and the rows past the batch's own are padding. A rank running this
module therefore cannot share a group with ranks running the conforming eager step (or vLLM's
file): every rank of a group must use it, with the same bucket. It is an option for engines that
replay their step from graphs, offered beside :class:`~shardspec.impl.ProductionSharder`, not a
replacement for it; the conformance suite does not run it, which is why it lives here and not in
``shardspec.impl`` (spec/README.md, "Decisions"). What it costs in bytes is :func:`wire_bytes`.

What it returns equals the eager step's results for the same batch (``tests/cuda_graph_step``
checks it): the local batch, the local logits rows and the gathered outputs, as
views trimmed to the real batch. How:

* **Bucket.** ``P`` = the most requests any rank owns, ``W`` = the most rows of any request,
  each rounded up to a power of two (:func:`bucket_for`). A batch fits a bucket if no rank owns
  more than ``P`` requests and no request has more than ``W`` rows.
* **Recorded once per bucket** (three graphs: shard, exchange, gather, so that the engine's LM
  head runs between the first two and its sampler between the last two): production's own
  kernels and collectives, called on a *capture batch* of ``tp * P`` requests of ``W`` rows each
  that every rank owns ``P`` of. Its sizes are what the kernels and collectives are recorded
  with: ``num_reqs = tp * P``, ``R`` rows per rank, equal split sizes ``R``. The shard graph also
  turns the plan's owner-sorted row order into the padded one (``sorted_logits_indices``: rank
  r's rows at ``[r * R, r * R + num_logits_per_rank[r])``, padding rows point at token
  ``PAD_TOKEN_INDEX``).
* **Per step, outside the graphs (host):** the precondition checks (production's own, on the
  host copies), the per-rank counts (one ``bincount``), the choice of bucket, four device copies
  of the batch's slots, prefix sum, logits indices and sequence lengths into the bucket's static
  buffers plus one fill that marks the requests past the batch as padding (their prefix sum stays
  flat: no rows), and the trimmed views of the results. The batch's requests come first, so the
  padding requests change no real request's place, row or gathered row.
* **Inputs the engine writes:** the padded send buffer (``plan.logits_input``, ``[tp * R,
  V / tp]``, the engine's vocab shard gathered by ``plan.sorted_logits_indices``) and the local
  sampler output (``plan.local_output``, static buffers sized by the bucket). Passing other
  tensors copies them in (one copy per tensor).
* **Outputs** are views of the graphs' static outputs and of the one workspace: valid until the
  next step of any bucket, since every bucket's graphs share one memory pool (clone to keep them).
  The gathered result is therefore not the caller's as INV-GATHER-RESULT-STABLE (spec 0.3) asks of
  the eager step: an engine that keeps step n's tokens while step n+1 runs clones them first.
  The static inputs are allocated outside the pool.
* **Memory** per recorded bucket, by construction: the send buffer, the receive buffer and the
  local rows, each ``tp * R`` or ``R`` rows of ``V / tp`` or ``V`` values (about three times
  ``tp * R * V / tp`` elements), plus the gathered outputs; engines should record few buckets.

Grammar bitmasks and extension fields are not handled here (production's eager paths for them
are host-side work; an engine can call ``shardspec.impl.grammar.local_grammar_output`` itself).

**Profiles.** ``profile`` is any whose owner rule is by slot or by batch position (an owner table
is refused), with two limits where the profile has admitted drafts or local dtypes that follow the
batch (vllm-0.33, vllm-0.34): batches with admitted draft counts (CL-ADMITTED-DRAFTS) are refused, since the bucket's
rows would then differ from the host counts the graphs were recorded for, and so are batches whose
local fields' dtypes (CL-LOCAL-DTYPES) differ from the capture batch's (idx_mapping int64, the
others int32): the graphs' static buffers have one dtype. Adaptive verification is not offered.

Seen on an H200 with torch 2.11: in a one-rank NCCL group, ``destroy_process_group`` did not return
once NCCL collectives had been captured in these graphs (pytorch/pytorch issue 115388, open since
2023; ``tests/cuda_graph_step`` runs that case in a subprocess that exits without it).

Without CUDA (or with ``graphs=False``) the same padded procedure runs eagerly, with the same
API and results: that is what the CPU tests check, with the Triton interpreter.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field

import numpy as np
import torch
from shardspec_cuda_graph_buckets import Bucket, bucket_for, wire_bytes

from shardspec.comm import Communicator
from shardspec.impl import checks, output_checks
from shardspec.impl.kernels import next_power_of_2
from shardspec.impl.local_batch import local_input_batch
from shardspec.impl.profiles import local_dtypes
from shardspec.impl.profiles import owners as owners_of
from shardspec.impl.sharder import ProductionSharder
from shardspec.impl.workspace import LOCAL_FIELDS
from shardspec.spec.model import (
    DEFAULT_PROFILE,
    InputBatch,
    LogprobsTensors,
    SamplerOutput,
    num_logprob_columns,
)
from shardspec.spec.profiles import rules_of

__all__ = ["PAD_TOKEN_INDEX", "Bucket", "CapturedPlan", "CapturedSteps", "bucket_for", "wire_bytes"]

# Where a padding row of the send buffer points: any token the engine's LM head output has.
PAD_TOKEN_INDEX = 0


@dataclass
class CapturedPlan:
    """One step's plan on the padded wire: host counts, trimmed views, and the inputs the engine writes."""

    bucket: Bucket
    num_reqs: int
    num_logits: int
    width: int
    num_logits_per_rank: list[int]
    num_reqs_per_rank: list[int]
    # [tp * R] int64: row j of chunk r is the token of rank r's j-th owner-sorted row, PAD_TOKEN_INDEX past
    # num_logits_per_rank[r]. The engine's vocab shard gathered by it is the send buffer.
    sorted_logits_indices: torch.Tensor
    # [tp * R, V / tp]: the static send buffer the exchange graph reads.
    logits_input: torch.Tensor
    # The eager step's local batch (same fields and values), its device fields views of static buffers.
    local_batch: InputBatch
    # Static buffers for the local sampler's results, sized by the bucket: [P, W] ids, [P] counts, [R] NaN
    # counts and logprob rows. A sampler that writes its first num_local_reqs / num_local_logits rows here
    # needs no copy.
    local_output: SamplerOutput
    _entry: _Entry = field(repr=False)
    _batch: InputBatch = field(repr=False)

    @property
    def num_local_reqs(self) -> int:
        return self.local_batch.num_reqs

    @property
    def num_local_logits(self) -> int:
        return int(self.local_batch.cu_num_logits_np[-1])


class _Entry:
    """One bucket: static inputs, the capture batch, the recorded graphs and their static outputs."""

    def __init__(self, owner: CapturedSteps, bucket: Bucket):
        tp, device = owner.tp_size, owner.device
        self.bucket = bucket
        P, W, R = bucket.reqs_per_rank, bucket.rows_per_req, bucket.rows_per_rank
        num_reqs, num_logits = tp * P, tp * R
        self.num_reqs, self.num_logits = num_reqs, num_logits
        slots_np = np.arange(num_reqs, dtype=np.intp)  # request i is owned by rank i % tp: P per rank
        cu_np = (np.arange(num_reqs + 1) * W).astype(np.int32)
        self.slots = torch.tensor(slots_np, dtype=torch.int64, device=device)
        self.cu = torch.tensor(cu_np, device=device)  # a copy: on the CPU, from_numpy would share cu_np
        self.logits_indices = torch.arange(num_logits, dtype=torch.int64, device=device)
        self.seq_lens = torch.full((num_reqs,), W, dtype=torch.int32, device=device)
        self.capture_batch = InputBatch(
            req_ids=[f"pad-{i}" for i in range(num_reqs)],
            num_reqs=num_reqs,
            idx_mapping=self.slots,
            idx_mapping_np=slots_np,
            expanded_idx_mapping=torch.zeros(num_logits, dtype=torch.int32, device=device),
            expanded_local_pos=torch.zeros(num_logits, dtype=torch.int32, device=device),
            query_start_loc=torch.zeros(num_reqs + 1, dtype=torch.int32, device=device),
            seq_lens=self.seq_lens,
            logits_indices=self.logits_indices,
            cu_num_logits=self.cu,
            cu_num_logits_np=cu_np,
        )
        self.positions = torch.arange(R, dtype=torch.int64, device=device)
        # Each capture request's owner, read in the shard graph: by slot, the slots the step copies in; by
        # batch position, fixed (the batch's requests come first, at their own positions).
        self.by_position = owner.rules.owner == "position_mod_tp"
        self.position_owners = torch.arange(num_reqs, dtype=torch.int64, device=device) % tp
        self.logits_input = torch.zeros((num_logits, owner.vocab // tp), dtype=owner.logits_dtype, device=device)
        dims = owner.logprobs_dims
        cols = num_logprob_columns(dims) if dims is not None else 0
        self.local_output = SamplerOutput(
            sampled_token_ids=torch.zeros((P, W), dtype=torch.int64, device=device),
            logprobs_tensors=None
            if dims is None
            else LogprobsTensors(
                torch.zeros((R, cols), dtype=torch.int64, device=device),
                torch.zeros((R, cols), dtype=torch.float32, device=device),
                torch.zeros(R, dtype=torch.int64, device=device),
            ),
            num_nans=torch.zeros(R, dtype=torch.int32, device=device) if owner.gather_num_nans else None,
            num_sampled=torch.zeros(P, dtype=torch.int32, device=device),
            num_rejected=torch.zeros(P, dtype=torch.int32, device=device),
        )
        self.owner = owner
        self.views: dict = {}
        self.graphs = None
        self.outputs = None

    # -- the device work of one step, in three parts ------------------------------------------
    def shard(self):
        owner = self.owner
        result = owner._sharder.shard_sampler_inputs(self.capture_batch, None)
        tp = owner.tp_size
        # The plan's owner-sorted order (rank r's rows after every lower rank's) -> chunks of R rows each.
        counts = (self.cu[1:] - self.cu[:-1]).to(torch.int64)
        owners = self.position_owners if self.by_position else self.slots % tp
        per_rank = torch.zeros(tp, dtype=torch.int64, device=owner.device).index_add_(0, owners, counts)
        starts = torch.cumsum(per_rank, 0) - per_rank
        compact = result.sorted_logits_indices
        picked = compact[(starts[:, None] + self.positions[None, :]).clamp_(max=compact.shape[0] - 1)]
        padded = torch.where(self.positions[None, :] < per_rank[:, None], picked, PAD_TOKEN_INDEX).view(-1)
        return result, padded

    def exchange(self, result):
        return self.owner._sharder.all_to_all_logits(self.logits_input, result.metadata)

    def gather(self, result):
        owner = self.owner
        return owner._sharder.gather_sampler_output(
            self.local_output,
            result.metadata,
            self.capture_batch,
            result.local_batch,
            gather_num_nans=owner.gather_num_nans,
            logprobs_dims=owner.logprobs_dims,
        )

    def record(self, graphs: bool) -> None:
        """Run each part once (compiling the kernels); on CUDA, then capture each as a graph."""
        if not graphs:
            return
        side = torch.cuda.Stream(self.owner.device)
        side.wait_stream(torch.cuda.current_stream(self.owner.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                result, _ = self.shard()
                self.exchange(result)
                self.gather(result)
        torch.cuda.current_stream(self.owner.device).wait_stream(side)
        pool = self.owner._pool
        graphs = [torch.cuda.CUDAGraph() for _ in range(3)]
        with _no_collection():
            with torch.cuda.graph(graphs[0], pool=pool):
                result, padded = self.shard()
            with torch.cuda.graph(graphs[1], pool=pool):
                local_logits = self.exchange(result)
            with torch.cuda.graph(graphs[2], pool=pool):
                gathered = self.gather(result)
        self.graphs = graphs
        self.outputs = (result, padded, local_logits, gathered)


@contextlib.contextmanager
def _no_collection():
    """No garbage collection while graphs are captured: collect before, none during. A collection inside a capture
    can free objects of earlier steps (pinned host copies among them) and so run CUDA calls that invalidate it: on
    an H100 a capture after the earlier GPU tests failed with cudaErrorStreamCaptureInvalidated, never alone."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CapturedSteps:
    """Production's step on a padded wire, one recorded graph set per bucket (see the module docstring).

    ``vocab`` (all ranks) and ``logits_dtype`` fix the send buffer; ``gather_num_nans`` and
    ``logprobs_dims`` fix what the gather carries, as the eager step's arguments of the same names.
    ``graphs``: None (default) records CUDA graphs on a CUDA device and runs eagerly elsewhere.
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_num_logits_per_req: int,
        *,
        comm: Communicator,
        vocab: int,
        logits_dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        gather_num_nans: bool = False,
        logprobs_dims: tuple[int, int] | None = None,
        check_preconditions: bool = True,
        check_device_copies: bool | None = None,
        graphs: bool | None = None,
        profile: str = DEFAULT_PROFILE,
    ):
        self.max_num_reqs = max_num_reqs
        self.max_num_logits_per_req = max_num_logits_per_req
        self.comm, self.rank, self.tp_size = comm, comm.rank, comm.world_size
        if vocab % self.tp_size:
            raise ValueError(f"vocab {vocab} is not divisible by tp {self.tp_size}")
        self.vocab, self.logits_dtype = vocab, logits_dtype
        self.gather_num_nans, self.logprobs_dims = gather_num_nans, logprobs_dims
        self.check_preconditions, self.check_device_copies = check_preconditions, check_device_copies
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.graphs = device.type == "cuda" if graphs is None else graphs
        if self.graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        # The largest bucket: a rank owns at most ceil(capacity / tp) slots; widths up to the capacity's.
        self.max_bucket = Bucket(
            next_power_of_2(-(-max_num_reqs // self.tp_size)), next_power_of_2(max_num_logits_per_req)
        )
        # One sharder for every bucket, checks off (the real batch is checked here, on the host): its
        # capacity holds the largest capture batch, and the workspace is shared by every bucket's graphs.
        self.profile = profile
        self.rules = rules_of(profile)
        self._sharder = ProductionSharder(
            max(max_num_reqs, self.tp_size * self.max_bucket.reqs_per_rank),
            self.max_bucket.rows_per_req,
            comm=comm,
            device=device,
            check_preconditions=False,
            rules=self.rules,
        )
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self._entries: dict[Bucket, _Entry] = {}

    # -- buckets ---------------------------------------------------------------------------------
    def bucket_for(self, batch: InputBatch) -> Bucket:
        """The smallest bucket the batch fits (host copies only)."""
        return self._counts(batch)[4]

    def prepare(self, bucket: Bucket) -> None:
        """Record the bucket's graphs now rather than at its first step."""
        self._entry(bucket)

    def _entry(self, bucket: Bucket) -> _Entry:
        entry = self._entries.get(bucket)
        if entry is None:
            top = self.max_bucket
            if not (0 < bucket.reqs_per_rank <= top.reqs_per_rank and 0 < bucket.rows_per_req <= top.rows_per_req):
                raise ValueError(f"{bucket} exceeds the capacity's largest bucket {top}")
            entry = _Entry(self, bucket)
            entry.record(self.graphs)
            self._entries[bucket] = entry
        return entry

    def _counts(self, batch: InputBatch):
        rules = self.rules
        if rules.owner not in ("slot_mod_tp", "position_mod_tp"):
            raise NotImplementedError(f"profile {self.profile}: the captured step owns requests by slot or position")
        if rules.admits_drafts or rules.batch_dtypes:
            self._refuse_unrecorded(batch, rules)
        if self.check_preconditions:
            cu, counts, width = checks.check_input_batch(
                batch,
                max_num_reqs=self.max_num_reqs,
                max_num_logits_per_req=self.max_num_logits_per_req,
                rank=self.rank,
                compare_device_copies=self.check_device_copies,
                rules=self.rules,
            )
        else:
            cu, counts, width = checks.check_guards(
                batch,
                max_num_reqs=self.max_num_reqs,
                max_num_logits_per_req=self.max_num_logits_per_req,
                rank=self.rank,
                rules=self.rules,
            )
        tp = self.tp_size
        slots = batch.idx_mapping_np.astype(np.intp, copy=False)
        # Vectorised INV-OWNER (a Python loop over 1024 requests would cost more than the replay).
        owners = owners_of(slots, tp, rules.owner)
        reqs_per_rank = np.bincount(owners, minlength=tp).tolist()
        rows_per_rank = (
            reqs_per_rank if width == 1 else np.bincount(owners, weights=counts, minlength=tp).astype(np.int64).tolist()
        )
        return cu, counts, width, (slots, owners, reqs_per_rank, rows_per_rank), bucket_for(reqs_per_rank, width)

    def _refuse_unrecorded(self, batch: InputBatch, rules) -> None:
        """Batches the recorded graphs cannot replay under admitted drafts or the batch's local dtypes
        (see the module docstring)."""
        if rules.admits_drafts and batch.num_admitted_draft_tokens is not None:
            raise ValueError(
                f"profile {self.profile}: admitted draft counts (num_admitted_draft_tokens, CL-ADMITTED-DRAFTS) "
                "are not supported by the captured step; use ProductionSharder for such batches"
            )
        dtypes = local_dtypes(batch)
        if rules.batch_dtypes and dtypes != _CAPTURE_DTYPES:
            raise ValueError(
                f"profile {self.profile}: the captured step records local fields (CL-LOCAL-DTYPES) of dtypes "
                f"{_named(_CAPTURE_DTYPES)}; this batch's are {_named(dtypes)}: use ProductionSharder for it"
            )

    # -- step 1 ----------------------------------------------------------------------------------
    def shard(self, batch: InputBatch, bucket: Bucket | None = None) -> CapturedPlan:
        """The plan of ``batch`` in ``bucket`` (default: the smallest that fits), replayed from its graph."""
        cu, counts, width, (slots, owners, reqs_per_rank, rows_per_rank), smallest = self._counts(batch)
        if bucket is None:
            bucket = smallest
        elif smallest.reqs_per_rank > bucket.reqs_per_rank or width > bucket.rows_per_req:
            raise ValueError(
                f"the batch does not fit {bucket}: a rank owns {max(reqs_per_rank)} requests, "
                f"a request has {width} rows; the smallest bucket that fits is {smallest}"
            )
        entry = self._entry(bucket)
        num_reqs, num_logits = batch.num_reqs, int(cu[-1])
        # The batch's requests first; past them, the prefix sum stays flat: padding requests of no rows.
        entry.slots[:num_reqs].copy_(batch.idx_mapping)
        entry.cu[: num_reqs + 1].copy_(batch.cu_num_logits)
        entry.cu[num_reqs + 1 :].fill_(num_logits)
        entry.logits_indices[:num_logits].copy_(batch.logits_indices)
        entry.seq_lens[:num_reqs].copy_(batch.seq_lens)
        if entry.graphs is not None:
            entry.graphs[0].replay()
            result, padded = entry.outputs[:2]
        else:
            result, padded = entry.shard()
            entry.outputs = (result, padded, None, None)
        rank = self.rank
        owned = owners == rank
        local_reqs = owned.nonzero()[0]
        num_local, num_local_logits = local_reqs.shape[0], rows_per_rank[rank]
        views = self._local_views(entry, result, num_local, num_local_logits)
        rules = self.rules
        local_batch = local_input_batch(batch, slots, counts, local_reqs, width, views, prefix="", rules=rules)
        return CapturedPlan(
            bucket=bucket,
            num_reqs=num_reqs,
            num_logits=num_logits,
            width=width,
            num_logits_per_rank=rows_per_rank,
            num_reqs_per_rank=reqs_per_rank,
            sorted_logits_indices=padded,
            logits_input=entry.logits_input,
            local_batch=local_batch,
            local_output=entry.local_output,
            _entry=entry,
            _batch=batch,
        )

    @staticmethod
    def _local_views(entry: _Entry, result, num_local: int, num_local_logits: int) -> dict:
        """Leading slices of the plan's local fields (regions of the one workspace every bucket shares)."""
        key = (num_local, num_local_logits)
        views = entry.views.get(key)
        if views is None:
            local = result.local_batch
            views = {
                "idx_mapping": local.idx_mapping[:num_local],
                "seq_lens": local.seq_lens[:num_local],
                "cu_num_logits": local.cu_num_logits[: num_local + 1],
                "logits_indices": local.logits_indices[:num_local_logits],
                "expanded_idx_mapping": local.expanded_idx_mapping[:num_local_logits],
                "expanded_local_pos": local.expanded_local_pos[:num_local_logits],
            }
            _remember(entry.views, key, views)
        return views

    # -- step 2 ----------------------------------------------------------------------------------
    def all_to_all_logits(self, plan: CapturedPlan, logits_shard: torch.Tensor | None = None) -> torch.Tensor:
        """The local rows ``[num_local_logits, V]``, equal to the eager step's ``all_to_all_logits``.

        ``logits_shard``: None if the engine wrote ``plan.logits_input`` (its vocab shard gathered by
        ``plan.sorted_logits_indices``); else a tensor of that shape, copied into it.
        """
        entry = plan._entry
        if logits_shard is not None and logits_shard is not entry.logits_input:
            if logits_shard.shape != entry.logits_input.shape:
                raise ValueError(
                    f"logits_shard has shape {tuple(logits_shard.shape)}; the padded wire of {plan.bucket} needs "
                    f"{tuple(entry.logits_input.shape)} (rows laid out by plan.sorted_logits_indices)"
                )
            entry.logits_input.copy_(logits_shard)
        if entry.graphs is not None:
            entry.graphs[1].replay()
            local_logits = entry.outputs[2]
        else:
            local_logits = entry.exchange(entry.outputs[0])
        return local_logits[: plan.num_local_logits]

    # -- step 3 ----------------------------------------------------------------------------------
    def gather_sampler_output(self, plan: CapturedPlan, local_output: SamplerOutput | None = None) -> SamplerOutput:
        """The gathered outputs of the batch, equal to the eager step's ``gather_sampler_output`` with this
        object's ``gather_num_nans`` and ``logprobs_dims``.

        ``local_output``: None if the sampler wrote ``plan.local_output``; else the local sampler's results
        (checked like the eager step's when checks are on), copied into it.
        """
        entry = plan._entry
        if local_output is not None and local_output is not entry.local_output:
            self._stage_output(plan, local_output)
        if entry.graphs is not None:
            entry.graphs[2].replay()
            gathered = entry.outputs[3]
        else:
            gathered = entry.gather(entry.outputs[0])
        n, num_logits, width = plan.num_reqs, plan.num_logits, plan.width
        logprobs = None
        if gathered.logprobs_tensors is not None:
            lp = gathered.logprobs_tensors
            cu_np = plan._batch.cu_num_logits_np
            logprobs = LogprobsTensors(
                lp.logprob_token_ids[:num_logits],
                lp.logprobs[:num_logits],
                lp.selected_token_ranks[:num_logits],
                np.asarray(cu_np).tolist() if num_logits != n else None,
            )
        return SamplerOutput(
            sampled_token_ids=gathered.sampled_token_ids[:n, :width],
            logprobs_tensors=logprobs,
            num_nans=None if gathered.num_nans is None else gathered.num_nans[:n],
            num_sampled=gathered.num_sampled[:n],
            num_rejected=gathered.num_rejected[:n],
        )

    def _stage_output(self, plan: CapturedPlan, out: SamplerOutput) -> None:
        num_local, num_local_logits = plan.num_local_reqs, plan.num_local_logits
        if self.check_preconditions:
            output_checks.check_local_output(
                out,
                num_local,
                num_local_logits,
                gather_num_nans=self.gather_num_nans,
                logprobs_dims=self.logprobs_dims,
                rank=self.rank,
            )
        static = plan._entry.local_output
        ids, cols = out.sampled_token_ids, min(out.sampled_token_ids.shape[-1], plan.bucket.rows_per_req)
        static.sampled_token_ids[:num_local, :cols].copy_(ids[:, :cols])
        if cols < plan.bucket.rows_per_req:  # the eager pack zero-fills narrower ids
            static.sampled_token_ids[:num_local, cols:].zero_()
        static.num_sampled[:num_local].copy_(out.num_sampled)
        static.num_rejected[:num_local].copy_(out.num_rejected)
        if static.num_nans is not None:
            static.num_nans[:num_local_logits].copy_(out.num_nans)
        if static.logprobs_tensors is not None:
            lp, dst = out.logprobs_tensors, static.logprobs_tensors
            if lp is None:  # the eager pack sends token 0, logprob -inf and rank 0 for every row
                lp_cols = 0
                dst.selected_token_ranks[:num_local_logits].zero_()
            else:
                lp_cols = min(lp.logprob_token_ids.shape[-1], lp.logprobs.shape[-1], dst.logprobs.shape[-1])
                dst.logprob_token_ids[:num_local_logits, :lp_cols].copy_(lp.logprob_token_ids[:, :lp_cols])
                dst.logprobs[:num_local_logits, :lp_cols].copy_(lp.logprobs[:, :lp_cols])
                dst.selected_token_ranks[:num_local_logits].copy_(lp.selected_token_ranks)
            if lp_cols < dst.logprobs.shape[-1]:  # and pads narrower logprobs with token 0, logprob -inf
                dst.logprob_token_ids[:num_local_logits, lp_cols:].zero_()
                dst.logprobs[:num_local_logits, lp_cols:].fill_(float("-inf"))

    # -- all three -------------------------------------------------------------------------------
    def step(
        self,
        batch: InputBatch,
        logits_shard: torch.Tensor | None = None,
        local_output: SamplerOutput | None = None,
        bucket: Bucket | None = None,
    ) -> tuple[CapturedPlan, torch.Tensor, SamplerOutput]:
        """Shard, exchange and gather back to back (the sampler's results already in place or given)."""
        plan = self.shard(batch, bucket)
        local_logits = self.all_to_all_logits(plan, logits_shard)
        return plan, local_logits, self.gather_sampler_output(plan, local_output)


_MAX_CACHED_VIEWS = 256
# The dtypes of the capture batch's fields the local ones are cut from, in workspace.LOCAL_FIELDS order.
_CAPTURE_DTYPES = (torch.int64, torch.int32, torch.int32, torch.int32, torch.int32)


def _named(dtypes: tuple) -> str:
    return ", ".join(f"{name} {str(d).removeprefix('torch.')}" for name, d in zip(LOCAL_FIELDS, dtypes, strict=True))


def _remember(cache: dict, key, value) -> None:
    if len(cache) >= _MAX_CACHED_VIEWS:
        cache.clear()
    cache[key] = value
