"""Adapter: vLLM's own ``batch_shard.py`` (a copy of the file, without vLLM) behind shardspec's API.

Point ``SHARDSPEC_UPSTREAM_FILE`` at the file and run the suite against it::

    SHARDSPEC_UPSTREAM_FILE=/path/to/vllm/v1/worker/gpu/sample/batch_shard.py \\
    PYTHONPATH=examples/upstream_vllm \\
        python -m shardspec.conformance --impl shardspec_upstream:make_sharder

or time it beside shardspec's sharders: ``python bench/bench_step.py --upstream FILE``.

The file imports a few vLLM modules. This adapter registers small stand-ins for
them under their vLLM names before it loads the file: the data types are
shardspec's own (their field names follow vLLM's), and the tensor-parallel
group is a thin object that sends the file's collectives to the rank's
shardspec :class:`~shardspec.comm.Communicator`. The stand-ins do less Python
work per collective than vLLM's group coordinator does, so timings of the file
here are, if anything, lower than in vLLM. Nothing of the file is copied into
this repository.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import sys
import threading
import types

import torch
import triton
import triton.language as tl

from shardspec.spec import model
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import ShardResult

_FILE_VARIABLE = "SHARDSPEC_UPSTREAM_FILE"
# The rank whose thread is running: in-process groups run every rank as a thread of one process.
_current = threading.local()


class _PyNcclOfTheGroup:
    """What vLLM 0.34's file reads of the TP group's PyNccl communicator (``device_communicator.pynccl_comm``):
    ``disabled`` and ``all_to_all_single(output, input, output_split_sizes, input_split_sizes)``. PyNccl is a
    communicator over the TP group's ranks; here its all-to-all is the rank's shardspec Communicator's, so the
    file's PyNccl branch runs on every backend (gloo, NCCL, in-process) and the suite records the call once,
    as the step's all-to-all."""

    disabled = False

    def __init__(self, comm):
        self.comm = comm

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        self.comm.all_to_all_single(output, input, list(output_split_sizes), list(input_split_sizes))


class _DeviceCommunicator:
    def __init__(self, comm):
        self.pynccl_comm = _PyNcclOfTheGroup(comm)


class _TensorParallelGroup:
    """What the file reads of vLLM's group coordinator, for the calling thread's rank."""

    def __init__(self, comm):
        self.comm = comm
        self.rank_in_group = comm.rank
        self.world_size = comm.world_size
        self.device_group = self  # handed back to the ``torch.distributed`` stand-in below
        self.device_communicator = _DeviceCommunicator(comm)


def get_tp_group() -> _TensorParallelGroup:
    group = getattr(_current, "group", None)
    if group is None:
        raise RuntimeError("the upstream file ran outside an UpstreamSharder call: no tensor-parallel group")
    return group


def tensor_model_parallel_all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """vLLM's all-gather along ``dim`` (only dim 0 is used by the file): a fresh, rank-major tensor."""
    if dim != 0:
        raise NotImplementedError(f"all-gather along dim {dim}: the adapter only gathers along dim 0")
    group = get_tp_group()
    gathered = tensor.new_empty((group.world_size * tensor.shape[0], *tensor.shape[1:]))
    group.comm.all_gather_into_tensor(gathered, tensor.contiguous())
    return gathered


def _all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, **_):
    group.comm.all_to_all_single(output, input, output_split_sizes, input_split_sizes)


def _torch_for_the_file() -> types.ModuleType:
    """A copy of the ``torch`` namespace whose ``distributed.all_to_all_single`` goes to the group's comm.

    A real module copy rather than a proxy: attribute lookups on it cost what they cost on ``torch``.
    """
    copied = types.ModuleType("torch")
    copied.__dict__.update(torch.__dict__)
    distributed = types.ModuleType("torch.distributed")
    distributed.__dict__.update(torch.distributed.__dict__)
    distributed.all_to_all_single = _all_to_all_single
    copied.distributed = distributed
    return copied


class VllmConfig:
    """vLLM 0.34's file imports ``vllm.config.VllmConfig`` for ``batch_sharded_sampling_enabled``, which the
    sharder never calls: a name to import, nothing more."""


def refuse_as_the_engine_config(tp: int, max_num_reqs: int) -> None:
    """What vLLM's config (``_validate_batch_sharded_sampling``, in the 0.33.0 and 0.34.0 wheels) refuses
    before the engine builds a ``BatchSharder``: tp <= 1, and fewer requests than ranks. The file alone has no
    config, so the adapter, standing in for the engine, refuses them (construction: sharded_groups); vLLM's
    installed check itself runs in ../vllm."""
    if tp <= 1:
        raise PreconditionError("PRE-TP-SIZE", "tp_size", f"the engine's config refuses tp {tp}")
    if max_num_reqs < tp:
        raise PreconditionError(
            "PRE-CAPACITY-TP", "max_num_reqs", f"the engine's config refuses max_num_seqs {max_num_reqs} < tp {tp}"
        )


def _register_vllm_stand_ins() -> None:
    names = {
        "vllm.config": {"VllmConfig": VllmConfig},
        "vllm.distributed.communication_op": {"tensor_model_parallel_all_gather": tensor_model_parallel_all_gather},
        "vllm.distributed.parallel_state": {"get_tp_group": get_tp_group},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.v1.core.sched.output": {"GrammarOutput": model.GrammarOutput},
        "vllm.v1.outputs": {"LogprobsTensors": model.LogprobsTensors},
        "vllm.v1.worker.gpu.input_batch": {"InputBatch": model.InputBatch},
        "vllm.v1.worker.gpu.sample.output": {"SamplerOutput": model.SamplerOutput},
    }
    for dotted, attributes in names.items():
        parts = dotted.split(".")
        for depth in range(1, len(parts) + 1):
            sys.modules.setdefault(".".join(parts[:depth]), types.ModuleType(".".join(parts[:depth])))
        vars(sys.modules[dotted]).update(attributes)


_loaded: dict = {}


def load_upstream(path: str | None = None) -> types.ModuleType:
    """The upstream file as a module (loaded once per path), with the stand-ins in place."""
    path = path or os.environ.get(_FILE_VARIABLE)
    if not path:
        raise RuntimeError(f"set {_FILE_VARIABLE} to the path of vLLM's batch_shard.py")
    path = os.path.abspath(path)
    if path not in _loaded:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{_FILE_VARIABLE}={path}: no such file")
        _register_vllm_stand_ins()
        spec = importlib.util.spec_from_file_location(f"_shardspec_upstream_{len(_loaded)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.torch = _torch_for_the_file()  # the file calls torch.distributed.all_to_all_single itself
        _loaded[path] = module
    return _loaded[path]


class _AdmittedCounts:
    """What vLLM 0.33 hands the file for ``num_admitted_draft_tokens``: counts in flight to the host."""

    def __init__(self, counts):
        self.counts = counts

    def wait(self):
        return self.counts


class UpstreamSharder:
    """The file's ``BatchSharder`` and module functions as one shardspec sharder.

    Files from vLLM 0.33 on take ``adaptive_verification_enabled`` and read the admitted draft counts
    through ``wait()``; older ones take neither. vLLM 0.34's exchanges through
    ``all_to_all_vocab_shards(shard, send_splits, num_local_rows)`` instead of ``all_to_all_logits(shard,
    metadata)``, and its ``BatchSharder`` takes an optional ``DraftLogitsCache``, which the adapter never
    passes: without one, 0.34 owns requests by batch position. The adapter gives each file what it asks.
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_num_logits_per_req: int,
        *,
        comm,
        device="cpu",
        path=None,
        adaptive_verification_enabled=False,
        rules=None,
    ):
        if rules is not None and rules.sharded_groups_only:  # the engine refuses these before a sharder exists
            refuse_as_the_engine_config(comm.world_size, max_num_reqs)
        self.upstream = load_upstream(path)
        self.group = _TensorParallelGroup(comm)
        self.device = torch.device(device)
        extra = {}
        if "adaptive_verification_enabled" in inspect.signature(self.upstream.BatchSharder).parameters:
            extra["adaptive_verification_enabled"] = adaptive_verification_enabled
        with self._rank():
            self.sharder = self.upstream.BatchSharder(max_num_reqs, max_num_logits_per_req, self.device, **extra)

    def _rank(self):
        return _Entered(self.group)

    def shard_sampler_inputs(self, batch, grammar) -> ShardResult:
        admitted = getattr(batch, "num_admitted_draft_tokens", None)
        if admitted is not None:
            batch = dataclasses.replace(batch, num_admitted_draft_tokens=_AdmittedCounts(admitted))
        with self._rank():
            result = ShardResult(*self.sharder.shard_sampler_inputs(batch, grammar))
        counts = getattr(result.local_batch, "num_admitted_draft_tokens", None)
        if isinstance(counts, _AdmittedCounts):  # back to shardspec's host array
            result = result._replace(
                local_batch=dataclasses.replace(result.local_batch, num_admitted_draft_tokens=counts.counts)
            )
        return result

    def all_to_all_logits(self, logits_shard, metadata):
        with self._rank():
            exchange = getattr(self.upstream, "all_to_all_vocab_shards", None)
            if exchange is not None:  # vLLM 0.34: the rows sent to each owner, the rows this rank receives
                return exchange(logits_shard, list(metadata.num_logits_per_rank), metadata.num_local_logits)
            return self.upstream.all_to_all_logits(logits_shard, metadata)

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
        # The file's gather has no such parameter: the declarations are not forwarded, so what the
        # suite sees of extension fields (INV-GATHER-EXTENSIONS) is what the file does with them.
        with self._rank():
            return self.upstream.gather_sampler_output(
                local_output,
                metadata,
                self.device,
                global_batch,
                local_batch,
                gather_num_nans=gather_num_nans,
                logprobs_dims=logprobs_dims,
            )


class _Entered:
    """Makes ``group`` the calling thread's group for the duration of one call."""

    __slots__ = ("group", "previous")

    def __init__(self, group):
        self.group = group

    def __enter__(self):
        self.previous = getattr(_current, "group", None)
        _current.group = self.group

    def __exit__(self, *exc):
        _current.group = self.previous


make_sharder = UpstreamSharder
