"""Adapter: the installed vLLM's ``vllm.v1.worker.gpu.sample.batch_shard`` behind shardspec's API.

Run the suite against it (vLLM installed without its dependencies, see README.md), e.g. 0.34.0::

    PYTHONPATH=examples/vllm python -m shardspec.conformance \\
        --impl shardspec_vllm:make_sharder --profile vllm-0.34 --tp 2,3 --no-shrink --max-crashes 0 \\
        --xfails-file examples/vllm/known_failures_0.34.yaml

One adapter for every supported release: it reads what the installed package offers (the exchange
``all_to_all_vocab_shards`` of 0.34 or ``all_to_all_logits`` of 0.33, ``GrammarOutput``'s fields,
ownership by batch position or by slot), not its version string, and declares the rules it follows
(``SPEC_RULES``). Everything the sharder touches is vLLM's own: its ``BatchSharder``, exchange and
``gather_sampler_output``, its ``InputBatch``, ``GrammarOutput``, ``SamplerOutput`` and
``LogprobsTensors`` classes, and its tensor-parallel group (``vllm.distributed.parallel_state``), set
up on the run's ``torch.distributed`` process group with ``init_distributed_environment`` and
``initialize_model_parallel``. This module only converts shardspec's records to vLLM's and back, field
by field.

Only multi-process runs (the suite's default): vLLM keeps its groups in module globals, one set per
process, so the in-process modes (every rank a thread of one process) cannot hold a group per rank,
and shrinking (which replays in one process) cannot run it: pass ``--no-shrink``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import threading
from typing import Any

import numpy as np
import torch

if not torch.cuda.is_available():
    # Both before vLLM (and any @triton.jit) is imported. Without an active GPU driver,
    # vllm.triton_utils replaces Triton with a placeholder whose jit returns the undecorated
    # function (the kernels then cannot be launched); it keeps the real Triton when
    # CUDA_VISIBLE_DEVICES is set and empty, as in a distributed worker before CUDA is up.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch.distributed as dist  # noqa: E402
import vllm.triton_utils  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.distributed import parallel_state  # noqa: E402
from vllm.v1.core.sched.output import GrammarOutput as VllmGrammarOutput  # noqa: E402
from vllm.v1.outputs import LogprobsTensors as VllmLogprobsTensors  # noqa: E402
from vllm.v1.worker.gpu import input_batch as vllm_input_batch  # noqa: E402
from vllm.v1.worker.gpu.sample import batch_shard  # noqa: E402
from vllm.v1.worker.gpu.sample.output import SamplerOutput as VllmSamplerOutput  # noqa: E402

from shardspec.comm import start_up  # noqa: E402
from shardspec.spec import model  # noqa: E402
from shardspec.spec.errors import PreconditionError  # noqa: E402
from shardspec.spec.profiles import rules_of  # noqa: E402

if not vllm.triton_utils.HAS_TRITON:
    raise ImportError(
        "vllm.triton_utils found no usable Triton (HAS_TRITON is False), so vLLM's kernels are "
        "undecorated functions; on a machine without a GPU leave CUDA_VISIBLE_DEVICES unset or empty"
    )

VllmInputBatch = vllm_input_batch.InputBatch
SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(model.InputBatch))

# What the installed release's API offers, read from its objects (not from its version string):
# - the exchange: 0.34 has all_to_all_vocab_shards(shard, send_splits, num_local_rows), 0.33
#   all_to_all_logits(shard, metadata);
# - GrammarOutput: 0.33 has a third field, num_acceptable_drafts, 0.34 two;
# - ownership: 0.34's module has shard_owners (batch position % tp without a draft-logits cache),
#   0.33 owns by slot % tp.
VOCAB_SHARDS_EXCHANGE = hasattr(batch_shard, "all_to_all_vocab_shards")
GRAMMAR_HAS_ACCEPTABLE_DRAFTS = "num_acceptable_drafts" in {f.name for f in dataclasses.fields(VllmGrammarOutput)}
POSITION_OWNERS = hasattr(batch_shard, "shard_owners")
# - the config check: VllmConfig._validate_batch_sharded_sampling refuses batch-sharded sampling for
#   tp <= 1 and max_num_seqs < tp before the engine builds a BatchSharder (0.34.0 and the 0.33.0 wheel have it,
#   and profiles vllm-0.33 and vllm-0.34 both say construction: sharded_groups).
CONFIG_CHECK = getattr(VllmConfig, "_validate_batch_sharded_sampling", None)
# - 0.34's BatchSharder takes a draft-logits cache; a sharded one decides the owners (owner rule owner_table).
TABLE_OWNERS = "draft_logits" in inspect.signature(batch_shard.BatchSharder.__init__).parameters
# The rules the installed release follows (spec/rules.py): the suite refuses a profile that sets another
# value of one of them.
RULES = {
    "owner": (("position_mod_tp", "owner_table") if TABLE_OWNERS else ("position_mod_tp",))
    if POSITION_OWNERS
    else ("slot_mod_tp",),
    "exchange": ("all_to_all_vocab_shards",) if VOCAB_SHARDS_EXCHANGE else ("all_to_all_logits",),
    "acceptable_drafts": ("sliced",) if GRAMMAR_HAS_ACCEPTABLE_DRAFTS else ("none",),
}


def refuse_as_vllm_config(tp: int, max_num_reqs: int) -> None:
    """What the engine's config refuses before it builds a BatchSharder, decided by vLLM's own check (on a
    config of the two settings it reads here; no model, so max_logprobs and return_sampling_mask are not
    asked, as they are not the spec's): its ValueError as the precondition it is (PRE-TP-SIZE,
    PRE-CAPACITY-TP), naming vLLM's reasons."""
    if CONFIG_CHECK is None:
        return
    from types import SimpleNamespace

    config = SimpleNamespace(
        parallel_config=SimpleNamespace(enable_batch_sharded_sampling=True, tensor_parallel_size=tp),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_reqs),
        model_config=None,
    )
    try:
        CONFIG_CHECK(config)
    except ValueError as exc:
        refused = "PRE-TP-SIZE" if tp <= 1 else "PRE-CAPACITY-TP"
        field = "tp_size" if refused == "PRE-TP-SIZE" else "max_num_reqs"
        raise PreconditionError(refused, field, f"vLLM's config refuses it: {exc}") from None


# -- vLLM's tensor-parallel group, once per process ---------------------------------------------

_group_lock = threading.Lock()
_group_of: list = []  # the process group vLLM's groups were set up on (at most one entry)


def _set_up_vllm_groups(group, device: torch.device) -> None:
    """vLLM's world and model-parallel groups on the run's process group, tp = its whole size."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    backend = str(dist.get_backend(group))
    world_size, rank = dist.get_world_size(), dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    # A bare VllmConfig() infers the device from the platform, and finds none on a CPU machine with
    # the CUDA wheel ("Failed to infer device type"); naming the device is all it needs.
    config = VllmConfig(device_config=DeviceConfig(device=device.type))
    with set_current_vllm_config(config):
        # torch.distributed is initialised already: this only builds vLLM's world group on it.
        parallel_state.init_distributed_environment(
            world_size=world_size, rank=rank, local_rank=local_rank, backend=backend
        )
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size, backend=backend)


def _vllm_tp_group(comm, device: torch.device):
    group = getattr(comm, "group", None)
    if group is None:
        raise RuntimeError(
            "shardspec_vllm runs vLLM's own tensor-parallel group, which needs a torch.distributed "
            "process group: run the suite one process per rank (the default), not --in-process"
        )
    backend = str(dist.get_backend(group))
    if backend not in ("gloo", "nccl") or group is not dist.group.WORLD:
        raise RuntimeError(
            f"vLLM's groups need the process's default {{gloo, nccl}} group; got a {backend} group "
            "(the in-process torch-threads group holds every rank in one process, vLLM one per process)"
        )
    with _group_lock:
        if _group_of:
            if _group_of[0] is not group:
                raise RuntimeError("vLLM's groups were set up on another process group in this process")
            return parallel_state.get_tp_group()
        # vLLM's setup talks to the peers (new_group, then broadcast_object_list, barrier and
        # all_reduce to count nodes). An engine does this once at start-up, not in a sampling step:
        # shardspec.comm.start_up says so to the suite, which honours it while a sharder is
        # constructed (as here) and records every collective of the steps, on every thread.
        with start_up(comm):
            _set_up_vllm_groups(group, device)
        _group_of.append(group)
    tp_group = parallel_state.get_tp_group()
    if tp_group.world_size != comm.world_size or tp_group.rank_in_group != comm.rank:
        raise RuntimeError(
            f"vLLM's TP group is rank {tp_group.rank_in_group} of {tp_group.world_size}, "
            f"the run's comm rank {comm.rank} of {comm.world_size}"
        )
    return tp_group


# -- shardspec records -> vLLM's ------------------------------------------------------------------


class AdmittedCounts:
    """What vLLM's sharder reads of its AdmittedDraftCounts (the admitted draft counts in flight to the
    host): ``wait()``, which returns them as a host array. vLLM's own class waits on a CUDA event, and
    its module (vllm.v1.worker.gpu.spec_decode.adaptive_verification) imports the model loader and
    attention layers (its import stopped at a missing einops); here the counts are on the host already."""

    def __init__(self, counts):
        self.counts = counts

    def wait(self) -> np.ndarray:
        return np.asarray(self.counts)


_batch_classes: dict[type, type] = {}


def _vllm_batch_class(batch_type: type) -> type:
    """vLLM's InputBatch, or a subclass of it with an engine batch's extra fields (default None)."""
    if batch_type not in _batch_classes:
        extra = [f for f in dataclasses.fields(batch_type) if f.name not in SPEC_FIELDS]
        if not extra:
            _batch_classes[batch_type] = VllmInputBatch
        else:
            _batch_classes[batch_type] = dataclasses.make_dataclass(
                f"Vllm{batch_type.__name__}",
                [(f.name, Any, dataclasses.field(default=None, kw_only=True)) for f in extra],
                bases=(VllmInputBatch,),
            )
    return _batch_classes[batch_type]


def to_vllm_batch(batch: model.InputBatch) -> VllmInputBatch:
    """vLLM's InputBatch with the spec's fields of ``batch`` (and an engine batch's own)."""
    counts = batch.num_admitted_draft_tokens
    # The fields below are vLLM's alone and never read by its sharder: zeros for no tokens, which no
    # malformed batch of a rejection case can make fail here instead of in vLLM.
    num_reqs = len(batch.idx_mapping_np)
    zeros = np.zeros(num_reqs, dtype=np.int32)
    device = batch.idx_mapping.device
    extra = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if f.name not in SPEC_FIELDS}
    return _vllm_batch_class(type(batch))(
        req_ids=batch.req_ids,
        num_reqs=batch.num_reqs,
        num_reqs_after_padding=batch.num_reqs,
        idx_mapping=batch.idx_mapping,
        idx_mapping_np=batch.idx_mapping_np,
        expanded_idx_mapping=batch.expanded_idx_mapping,
        expanded_local_pos=batch.expanded_local_pos,
        num_scheduled_tokens=zeros,
        num_tokens=0,
        num_tokens_after_padding=0,
        num_draft_tokens=batch.num_draft_tokens,
        num_draft_tokens_per_req=batch.num_draft_tokens_per_req,
        query_start_loc=batch.query_start_loc,
        query_start_loc_np=np.zeros(num_reqs + 1, dtype=np.int32),
        seq_lens=batch.seq_lens,
        seq_lens_cpu_upper_bound=batch.seq_lens_cpu_upper_bound,
        dcp_local_seq_lens=None,
        num_computed_tokens_np=zeros,
        prefill_len_np=zeros,
        num_computed_prefill_tokens_np=zeros,
        is_prefilling_np=np.zeros(num_reqs, dtype=bool),
        has_prefill=False,
        decode_graph_eligible=True,
        input_ids=torch.zeros(0, dtype=torch.int32, device=device),
        positions=torch.zeros(0, dtype=torch.int64, device=device),
        is_padding=torch.zeros(0, dtype=torch.bool, device=device),
        logits_indices=batch.logits_indices,
        cu_num_logits=batch.cu_num_logits,
        cu_num_logits_np=batch.cu_num_logits_np,
        has_structured_output_reqs=False,
        prompt_lens=None,
        num_admitted_draft_tokens=None if counts is None else AdmittedCounts(counts),
        **extra,
    )


def from_vllm_batch(local: VllmInputBatch, batch_type: type) -> model.InputBatch:
    """The spec's fields (and an engine batch's own) of vLLM's local batch, as ``batch_type``."""
    fields = {f.name: getattr(local, f.name) for f in dataclasses.fields(batch_type)}
    counts = local.num_admitted_draft_tokens
    if isinstance(counts, AdmittedCounts):
        # What vLLM left there: the batch's object carried over hands back the batch's own array.
        fields["num_admitted_draft_tokens"] = counts.counts
    return batch_type(**fields)


def to_vllm_grammar(grammar: model.GrammarOutput | None) -> VllmGrammarOutput | None:
    if grammar is None:
        return None
    # vLLM's bitmask is a host numpy array (the scheduler's); shardspec's a tensor on the device.
    fields = {
        "structured_output_request_ids": grammar.structured_output_request_ids,
        "grammar_bitmask": grammar.grammar_bitmask.cpu().numpy(),
    }
    if GRAMMAR_HAS_ACCEPTABLE_DRAFTS:
        fields["num_acceptable_drafts"] = grammar.num_acceptable_drafts
    return VllmGrammarOutput(**fields)


def from_vllm_grammar(local: VllmGrammarOutput | None, device: torch.device) -> model.GrammarOutput | None:
    if local is None:
        return None
    return model.GrammarOutput(
        structured_output_request_ids=local.structured_output_request_ids,
        grammar_bitmask=torch.from_numpy(np.asarray(local.grammar_bitmask)).to(device),
        num_acceptable_drafts=getattr(local, "num_acceptable_drafts", None),
    )


def to_vllm_metadata(metadata: model.BatchShardMetadata) -> batch_shard.BatchShardMetadata:
    return batch_shard.BatchShardMetadata(
        **{f.name: getattr(metadata, f.name) for f in dataclasses.fields(batch_shard.BatchShardMetadata)}
    )


def from_vllm_metadata(metadata: batch_shard.BatchShardMetadata) -> model.BatchShardMetadata:
    return model.BatchShardMetadata(
        **{f.name: getattr(metadata, f.name) for f in dataclasses.fields(model.BatchShardMetadata)}
    )


def _logprobs(value, cls):
    return None if value is None else cls(*value)


def to_vllm_output(output: model.SamplerOutput | None) -> VllmSamplerOutput | None:
    # vLLM's SamplerOutput has no extension fields; its own sampling_mask_tensors stay None.
    if output is None:
        return None
    return VllmSamplerOutput(
        sampled_token_ids=output.sampled_token_ids,
        logprobs_tensors=_logprobs(output.logprobs_tensors, VllmLogprobsTensors),
        num_nans=output.num_nans,
        num_sampled=output.num_sampled,
        num_rejected=output.num_rejected,
    )


def from_vllm_output(output: VllmSamplerOutput) -> model.SamplerOutput:
    return model.SamplerOutput(
        sampled_token_ids=output.sampled_token_ids,
        logprobs_tensors=_logprobs(output.logprobs_tensors, model.LogprobsTensors),
        num_nans=output.num_nans,
        num_sampled=output.num_sampled,
        num_rejected=output.num_rejected,
    )


# -- the sharder ------------------------------------------------------------------------------------


class OwnerTableCache:
    """What vLLM 0.34's BatchSharder reads of a sharded ``DraftLogitsCache``: ``owners_of(idx_mapping_np)``,
    the batch's owners and the per-slot owner table on the device. The engine's cache keeps that table
    itself and rewrites it in ``assign()`` after each verification; here the table is the one the suite
    passes with each step (``owner_table``, CL-OWNER-TABLE), handed over as the cache would hold it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.table: np.ndarray | None = None

    def owners_of(self, idx_mapping_np: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        table = self.table
        return table[idx_mapping_np], torch.from_numpy(np.ascontiguousarray(table)).to(self.device)


class VllmSharder:
    """vLLM's BatchSharder and module functions as one shardspec sharder (the installed release's profile)."""

    SPEC_VERSION = "0.5.0"
    SPEC_RULES = RULES
    RELEASE = f"vLLM {vllm.__version__}"  # the column of the page of releases (report releases)

    def __init__(
        self,
        max_num_reqs: int,
        max_num_logits_per_req: int,
        *,
        comm,
        device="cpu",
        adaptive_verification_enabled: bool = False,
        profile: str = model.DEFAULT_PROFILE,
        **ignored,
    ):
        # Where the profile's rules refuse what vLLM's config refuses (construction: sharded_groups), the
        # engine's check runs first, before vLLM's groups are set up; elsewhere the sharder is built as is.
        if rules_of(profile).sharded_groups_only:
            refuse_as_vllm_config(comm.world_size, max_num_reqs)
        self.device = torch.device(device)
        self.tp_group = _vllm_tp_group(comm, self.device)
        # Under owner rule owner_table, vLLM's sharder reads its owners from a sharded cache's table.
        self.cache = OwnerTableCache(self.device) if rules_of(profile).owner_by_table else None
        extra = {} if self.cache is None else {"draft_logits": self.cache}
        self.sharder = batch_shard.BatchSharder(
            max_num_reqs, max_num_logits_per_req, self.device, adaptive_verification_enabled, **extra
        )

    def shard_sampler_inputs(self, batch, grammar, *, owner_table=None) -> model.ShardResult:
        if self.cache is not None:
            self.cache.table = owner_table
        local, sorted_logits_indices, local_grammar, metadata = self.sharder.shard_sampler_inputs(
            to_vllm_batch(batch), to_vllm_grammar(grammar)
        )
        grammar_device = grammar.grammar_bitmask.device if grammar is not None else self.device
        return model.ShardResult(
            from_vllm_batch(local, type(batch)),
            sorted_logits_indices,
            from_vllm_grammar(local_grammar, grammar_device),
            from_vllm_metadata(metadata),
        )

    def all_to_all_logits(self, logits_shard, metadata):
        if VOCAB_SHARDS_EXCHANGE:
            # 0.34: the send splits are the rows per owner, the rows received those of this rank.
            return batch_shard.all_to_all_vocab_shards(
                logits_shard, list(metadata.num_logits_per_rank), metadata.num_local_logits
            )
        return batch_shard.all_to_all_logits(logits_shard, to_vllm_metadata(metadata))

    def gather_sampler_output(
        self,
        local_output,
        metadata,
        global_batch,
        local_batch,
        *,
        gather_num_nans=False,
        logprobs_dims=None,
        extension_fields=None,
    ):
        # vLLM's gather takes no extension fields: the declarations are not forwarded, so what the
        # suite sees of them (INV-GATHER-EXTENSIONS) is what vLLM does with such an output.
        gathered = batch_shard.gather_sampler_output(
            to_vllm_output(local_output),
            to_vllm_metadata(metadata),
            self.device,
            to_vllm_batch(global_batch),
            to_vllm_batch(local_batch),
            gather_num_nans=gather_num_nans,
            logprobs_dims=logprobs_dims,
        )
        return from_vllm_output(gathered)


make_sharder = VllmSharder
