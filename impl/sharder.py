"""The production sharder: the spec's three operations on Triton kernels.

Same signatures, results and wire layout as the reference sharder (the wire
layout is in ``reference/sharder.py``'s docstring and ``spec/wire.yaml``; the
padding rows are written exactly as the reference writes them, so mixed groups
agree byte for byte). What differs is how:

* the plan's device fields come from one kernel launch (``shard_plan_kernel``)
  that reads the batch's device copies; the host derives only what must be
  Python or numpy (split sizes, local host copies) from the host copies, so a
  step never waits on the device;
* local batch tensors and metadata indices are views of one preallocated,
  16-byte aligned workspace: they stay valid until the next
  ``shard_sampler_inputs`` call on this sharder;
* the sampled outputs and logprobs are packed by one launch and unpacked by
  one launch; the gathered results are fresh tensors each step.

Every profile (spec/SPEC.md section 7) runs the same launches; where their rules differ is host work
(``profiles.py``, ``profile_checks.py``, ``grammar.py``), which workspace regions the plan kernel
writes (under local_dtypes batch the local fields take the batch's dtypes: int32 and int64 regions
exist for each), and how the plan kernel and the host find owners (the owner rule, a constexpr; under
owner_table and contiguous_ranges the host finds the owners and hands them to the kernel).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from shardspec.comm import Communicator
from shardspec.impl import checks, extensions, output_checks, profile_checks, profiles
from shardspec.impl.exchange import exchange_logits
from shardspec.impl.gather import WireLaunches
from shardspec.impl.grammar import local_grammar_output
from shardspec.impl.kernels import next_power_of_2
from shardspec.impl.launch import Launcher
from shardspec.impl.local_batch import SEED_DTYPES, convert_views, local_input_batch, local_regions
from shardspec.impl.profiles import check_owner_rule
from shardspec.impl.shard_kernel import shard_plan_kernel
from shardspec.impl.workspace import REGION_DTYPES, carve, local_region, plan_layout
from shardspec.spec.model import (
    BatchShardMetadata,
    ExtensionSpec,
    GrammarOutput,
    InputBatch,
    SamplerOutput,
    ShardResult,
    num_logprob_columns,
)
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules

# The interpreter pays per program, not per element: give it few, large blocks.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_TILE_ELEMENTS = 1 << 16 if _INTERPRETED else 1 << 12


_MAX_CACHED_VIEWS = 256
# The plan kernel's outputs, in its argument order.
_PLAN_OUTPUTS = (
    "sorted_logits_indices",
    "gathered_src_indices",
    "local_idx_mapping",
    "local_cu_num_logits",
    "local_logits_indices",
    "local_expanded_idx_mapping",
    "local_expanded_local_pos",
    "local_seq_lens",
)
_launch_plan = Launcher(shard_plan_kernel)


def _block(per_request_elements: int, cap: int) -> int:
    """Requests per program so that one program's tile holds about _TILE_ELEMENTS values, at most the
    capacity ``cap`` rounded up to a power of two (1 for an empty capacity)."""
    fitting = max(1, _TILE_ELEMENTS // max(1, per_request_elements))
    return min(next_power_of_2(cap), 1 << (fitting.bit_length() - 1))


class ProductionSharder(WireLaunches):
    # The version of the specification this implementation targets; it follows the rules of any profile
    # but these owner rules (spec/rules.py).
    SPEC_VERSION = "0.5.0"
    SPEC_RULES = {"owner": profiles.OWNER_RULES}

    def __init__(
        self,
        max_num_reqs: int,
        max_num_logits_per_req: int,
        *,
        comm: Communicator,
        device: torch.device | str = "cpu",
        check_preconditions: bool = True,
        check_device_copies: bool | None = None,
        rules: Rules | None = None,
        adaptive_verification_enabled: bool = False,
    ):
        """``check_device_copies``: with ``check_preconditions``, compare the values of idx_mapping and
        cu_num_logits with their host copies before launching (PRE-HOST-DEVICE-MATCH). None (default):
        where that needs no wait, the device copies being in host memory; True: on a GPU too, at the
        cost of a device-to-host copy and a wait every step; False: never. Unchecked, a mismatch gives
        a wrong plan but no access out of bounds. ``rules``: the profile's rules the sharder follows
        (None: the default profile's); ``adaptive_verification_enabled``: the argument of profiles with
        adaptive verification (CL-ADMITTED-DRAFTS), ignored elsewhere, as the reference ignores it."""
        rules = rules or default_rules()
        check_owner_rule(rules)
        checks.check_construction(rules, comm.world_size, max_num_reqs, comm.rank)  # before the workspace
        self.max_num_reqs = max_num_reqs
        self.max_num_logits_per_req = max_num_logits_per_req
        self.comm = comm
        self.rank = comm.rank
        self.tp_size = comm.world_size
        self.device = _indexed(torch.device(device))
        self.check_preconditions = check_preconditions
        self.check_device_copies = check_device_copies
        self.rules = rules
        self.adaptive_verification_enabled = bool(adaptive_verification_enabled) and rules.adaptive
        self._ws = carve(plan_layout(max_num_reqs, max_num_logits_per_req, self.tp_size), self.device)
        # Entry 0 of the local prefix sums is 0 forever; the kernel writes entries 1..n.
        for dtype in (torch.int32, torch.int64):
            self._ws[local_region("cu_num_logits", dtype)][:1].zero_()
        self._rows_pad = next_power_of_2(max_num_logits_per_req)
        self._tp_pad = next_power_of_2(self.tp_size)
        # Block sizes follow the capacity, never the batch, so no batch size recompiles a kernel.
        self._plan_block = _block(self._tp_pad * 4 + self._rows_pad * 2, max(1, max_num_reqs))
        self._plan_constexprs = dict(
            TP=self.tp_size,
            RANK=self.rank,
            TP_PAD=self._tp_pad,
            BLOCK=self._plan_block,
            ROWS_PAD=self._rows_pad,
            LOOP_END=0,
            BY_POSITION=rules.owner == "position_mod_tp",
            HOST_OWNERS=rules.owner in profiles.HOST_OWNER_RULES,
        )
        # The owners the host found, per batch position (profiles.HOST_OWNER_RULES); the other rules'
        # kernel never reads them.
        self._owners = torch.zeros(max(1, max_num_reqs), dtype=torch.int32, device=self.device)
        self._plan_key = (self.device.index, *self._plan_constexprs.values())
        self._plan_regions: dict = {}  # local dtypes (None: vllm-seed's) -> regions the plan kernel writes
        self._seed_regions = self._regions(None)
        self._logprob_cols = -1  # columns the logprob wire buffers are sized for
        self._lp_ws: dict = {}
        self._views: dict = {}  # step shapes -> views of the workspace and launch configurations
        self._owned_by_size: dict = {}  # N -> ownership, under owner rules of batch positions (_ownership)

    # -- step 1 ------------------------------------------------------------
    def shard_sampler_inputs(
        self, batch: InputBatch, grammar: GrammarOutput | None, *, owner_table: np.ndarray | None = None
    ) -> ShardResult:
        """``owner_table``: the engine's per-slot owner table, an argument of owner rule owner_table only
        (CL-OWNER-TABLE); read, never written, never kept."""
        rank, tp, rules = self.rank, self.tp_size, self.rules
        if owner_table is not None and not rules.owner_by_table:
            raise TypeError(f"owner_table: an argument of owner rule owner_table, not of {rules.owner}")
        # cu, counts and width are those of the rows the device fields lay out (CL-ADMITTED-DRAFTS).
        if self.check_preconditions:
            cu, counts, width = checks.check_input_batch(
                batch,
                max_num_reqs=self.max_num_reqs,
                max_num_logits_per_req=self.max_num_logits_per_req,
                rank=rank,
                compare_device_copies=self.check_device_copies,
                rules=rules,
            )
        else:
            # Capacity, slot range and the shapes the kernels read are checked even so.
            cu, counts, width = checks.check_guards(
                batch,
                max_num_reqs=self.max_num_reqs,
                max_num_logits_per_req=self.max_num_logits_per_req,
                rank=rank,
                rules=rules,
            )
        table_owners = None
        if rules.owner_by_table:
            # Checked with the checks off too (its entries index the per-rank counts), before the grammar
            # output as the reference checks it.
            slots = batch.idx_mapping_np.astype(np.intp, copy=False)
            table_owners = profile_checks.table_owners(owner_table, slots, self.max_num_reqs, tp, rank)
        position = None
        if grammar is not None:
            position = {req_id: i for i, req_id in enumerate(batch.req_ids)}
            if self.check_preconditions:
                checks.check_grammar_output(grammar, batch, position, counts, rank, rules)
        num_reqs = batch.num_reqs
        slots = batch.idx_mapping_np.astype(np.intp, copy=False)
        owners, owned, local_reqs, reqs_per_rank = self._ownership(slots, table_owners)
        num_logits = int(cu[-1])
        rows_per_rank = (
            reqs_per_rank if width == 1 else np.bincount(owners, weights=counts, minlength=tp).astype(np.int64).tolist()
        )
        max_reqs_per_rank = profiles.padded_reqs_per_rank(reqs_per_rank, num_reqs)
        num_local = local_reqs.shape[0]
        num_local_logits = rows_per_rank[rank]

        # The local fields in the batch's dtypes (local_dtypes batch, CL-LOCAL-DTYPES), or int32 (None).
        dtypes = profiles.local_dtypes(batch) if rules.batch_dtypes else None
        if num_reqs:
            if self._plan_constexprs["HOST_OWNERS"]:
                self._upload_owners(owners)
            self._launch_plan(batch, (num_reqs, num_logits, num_local, num_local_logits, max_reqs_per_rank), dtypes)
        views = self._shard_views(num_reqs, num_logits, num_local, num_local_logits, dtypes)
        if dtypes is not None and self._regions(dtypes)[3]:
            views = convert_views(views, dtypes)
        local_batch = local_input_batch(batch, slots, counts, local_reqs, width, views, rules=rules)
        metadata = BatchShardMetadata(
            tp_size=tp,
            num_logits_per_rank=rows_per_rank,
            num_local_logits=num_local_logits,
            num_local_reqs=num_local,
            max_num_reqs_per_rank=max_reqs_per_rank,
            gathered_src_indices=views["gathered_src_indices"],
            max_num_logits_per_req=width,
            adaptive_verification_enabled=self.adaptive_verification_enabled,
        )
        local_grammar = None
        if grammar is not None:
            acceptable = rules.acceptable_drafts == "sliced"
            local_grammar = local_grammar_output(grammar, position, owned, cu, rules.grammar_blocks, acceptable)
        return ShardResult(local_batch, views["sorted_logits_indices"], local_grammar, metadata)

    def _ownership(self, slots: np.ndarray, table_owners: np.ndarray | None) -> tuple:
        """(owners [N], owned [N] bool, the owned positions, requests per rank as a list) of the batch.

        Under owner rules of batch positions (profiles.POSITION_OWNER_RULES) these depend on N alone and are
        kept per N, read-only: that part of the step's host work then no longer grows with the batch.
        """
        by_position = self.rules.owner in profiles.POSITION_OWNER_RULES
        found = self._owned_by_size.get(slots.shape[0]) if by_position else None
        if found is None:
            tp = self.tp_size
            owners = profiles.owners(slots, tp, self.rules.owner) if table_owners is None else table_owners
            owned = owners == self.rank
            # owned is 1-D: no flatnonzero wrapper; per-rank counts as a list (tp is small, list max is cheap).
            found = (owners, owned, owned.nonzero()[0], np.bincount(owners, minlength=tp).tolist())
            if by_position:
                for array in found[:3]:
                    array.flags.writeable = False
                if len(self._owned_by_size) >= _MAX_CACHED_VIEWS:
                    self._owned_by_size.clear()
                self._owned_by_size[slots.shape[0]] = found
        return found

    def _upload_owners(self, owners: np.ndarray) -> None:
        """The host's owners into the plan kernel's owner buffer. On a GPU from pinned memory without a wait
        (a copy from pageable memory waits for the device): torch's caching host allocator keeps the pinned
        block until the copy is done, so the next step's owners cannot overwrite them in flight."""
        host = torch.from_numpy(owners.astype(np.int32, copy=False))
        if self.device.type == "cuda":
            host = host.pin_memory()
        self._owners[: owners.shape[0]].copy_(host, non_blocking=True)

    def _regions(self, dtypes: tuple | None) -> tuple:
        """(regions by name, the plan kernel's outputs, their addresses, whether some local field needs
        converting after the launch) for local fields of ``dtypes``."""
        found = self._plan_regions.get(dtypes)
        if found is None:
            dtypes_or_seed = SEED_DTYPES if dtypes is None else dtypes
            regions = {**self._ws, **local_regions(self._ws, dtypes_or_seed)}
            outputs = tuple(regions[name] for name in _PLAN_OUTPUTS)
            convert = any(d not in REGION_DTYPES for d in dtypes_or_seed)
            found = (regions, outputs, tuple(t.data_ptr() for t in outputs), convert)
            self._plan_regions[dtypes] = found
        return found

    def _shard_views(
        self, num_reqs: int, num_logits: int, num_local: int, num_local_logits: int, dtypes: tuple | None = None
    ) -> dict:
        """Leading slices of the plan regions; cached, since batch shapes recur from step to step."""
        key = (num_reqs, num_logits, num_local, num_local_logits, dtypes)
        views = self._views.get(key)
        if views is None:
            lengths = {
                "sorted_logits_indices": num_logits,
                "gathered_src_indices": num_reqs,
                "local_idx_mapping": num_local,
                "local_cu_num_logits": num_local + 1,
                "local_seq_lens": num_local,
                "local_logits_indices": num_local_logits,
                "local_expanded_idx_mapping": num_local_logits,
                "local_expanded_local_pos": num_local_logits,
            }
            regions = self._regions(dtypes)[0]
            views = self._remember(key, {name: regions[name][:n] for name, n in lengths.items()})
        return views

    def _remember(self, key: tuple, value):
        if len(self._views) >= _MAX_CACHED_VIEWS:
            self._views.clear()
        self._views[key] = value
        return value

    def _launch_plan(self, batch: InputBatch, sizes: tuple, dtypes: tuple | None = None) -> None:
        """``sizes``: (num_reqs, num_logits, num_local_reqs, num_local_logits, max_reqs_per_rank), from the host;
        ``dtypes``: the local fields' (None: vllm-seed's int32)."""
        slots, cu, indices, seq_lens = batch.idx_mapping, batch.cu_num_logits, batch.logits_indices, batch.seq_lens
        # Engines pass views: every input goes with its stride (1-D, so stride(0) is all of it).
        inputs = (slots, slots.stride(0), cu, cu.stride(0), indices, indices.stride(0), seq_lens, seq_lens.stride(0))
        _, outputs, addresses, _ = self._seed_regions if dtypes is None else self._regions(dtypes)
        key = (*self._plan_key, slots.dtype, cu.dtype, indices.dtype, seq_lens.dtype, dtypes)
        num_reqs = sizes[0]
        constexprs = {**self._plan_constexprs, "LOOP_END": num_reqs} if _INTERPRETED else self._plan_constexprs
        # The plan's outputs never move: a direct launch takes their addresses instead.
        owners = self._owners
        _launch_plan(
            -(-num_reqs // self._plan_block),
            key,
            (*inputs, *outputs, owners, *sizes),
            constexprs,
            (*inputs, *addresses, owners.data_ptr(), *sizes),
        )

    # -- step 2 ------------------------------------------------------------
    def all_to_all_logits(self, logits_shard: torch.Tensor, metadata: BatchShardMetadata) -> torch.Tensor:
        """[L, V/tp] owner-sorted rows of this rank's vocab shard -> [L_local, V] (:mod:`.exchange`)."""
        if self.check_preconditions:
            output_checks.check_logits_shard(logits_shard, metadata, self.rank)
        return exchange_logits(self.comm, logits_shard, metadata, self.device)

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
        num_local = metadata.num_local_reqs
        if self.check_preconditions:
            # The declarations are replicated: checked first, so every rank rejects them alike.
            extensions.check_declarations(extension_fields, self.rank)
            output_checks.check_local_output(
                local_output,
                num_local,
                local_batch.num_logits,
                gather_num_nans=gather_num_nans,
                logprobs_dims=logprobs_dims,
                rank=self.rank,
            )
            extensions.check_local_fields(local_output, num_local, local_batch.num_logits, extension_fields, self.rank)
        width, per_rank = metadata.max_num_logits_per_req, metadata.max_num_reqs_per_rank
        sampled_cols = width + 2 + (1 if gather_num_nans else 0)
        num_cols = num_logprob_columns(logprobs_dims) if logprobs_dims is not None else 0
        send, received, lp = self._wire_views(
            per_rank, width, sampled_cols, num_cols if logprobs_dims is not None else None
        )
        self._launch_pack(local_output, local_batch, send, lp, num_local, per_rank, width, num_cols, gather_num_nans)
        self.comm.all_gather_into_tensor(received, send)
        if lp is not None:
            self.comm.all_gather_into_tensor(lp["recv_ids"], lp["send_ids"])
            self.comm.all_gather_into_tensor(lp["recv_vals"], lp["send_vals"])
        # The batch's rows as its device fields lay them out: the admitted ones (CL-ADMITTED-DRAFTS).
        layout = global_batch.cu_num_logits_np
        if self.rules.admits_drafts and global_batch.num_admitted_draft_tokens is not None:
            layout = profiles.admitted_cu(global_batch)
        gathered = self._unpack(
            received, lp, metadata, global_batch, layout, width, sampled_cols, num_cols, gather_num_nans
        )
        if extension_fields is not None:
            gathered.extensions = extensions.gather_extensions(
                self.comm,
                local_output,
                metadata,
                layout,
                local_batch.cu_num_logits_np,
                extension_fields,
                self.device,
            )
        return gathered

    def _block_of(self, per_request_elements: int) -> int:
        """Requests per program of a launch over the batch (at most the capacity's)."""
        return _block(per_request_elements, self.max_num_reqs)


def _indexed(device: torch.device) -> torch.device:
    """A CUDA device with its index (the current one where none is given): launches name their device."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
