"""A file shaped like vLLM's batch_shard.py, for tests of examples/upstream_vllm.

It imports what the real file imports, under the same vLLM names, and calls the
collectives the way the real file does (``torch.distributed.all_to_all_single``
with the tensor-parallel group's ``device_group``, and
``tensor_model_parallel_all_gather``). The sharding itself is shardspec's
reference, so any failure of a suite run over this file is the adapter's.
"""

from dataclasses import dataclass, replace

import torch
import torch.distributed
from vllm.distributed.communication_op import tensor_model_parallel_all_gather
from vllm.distributed.parallel_state import get_tp_group
from vllm.triton_utils import tl, triton  # noqa: F401  (imported by the real file)
from vllm.v1.core.sched.output import GrammarOutput  # noqa: F401
from vllm.v1.outputs import LogprobsTensors  # noqa: F401
from vllm.v1.worker.gpu.input_batch import InputBatch  # noqa: F401
from vllm.v1.worker.gpu.sample.output import SamplerOutput  # noqa: F401

from shardspec.reference import ReferenceSharder
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of


class _CollectivesOfTheFile:
    """A shardspec Communicator made only of the calls the real file makes."""

    def __init__(self):
        group = get_tp_group()
        self.rank, self.world_size = group.rank_in_group, group.world_size

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        torch.distributed.all_to_all_single(
            output,
            input,
            output_split_sizes=output_split_sizes,
            input_split_sizes=input_split_sizes,
            group=get_tp_group().device_group,
        )

    def all_gather_into_tensor(self, output, input):
        output.copy_(tensor_model_parallel_all_gather(input, dim=0))


@dataclass
class _Capacity:
    max_num_reqs: int
    max_num_logits_per_req: int


_capacity = {}


# vLLM's file builds a sharder for any group (its engine's config refuses a group of one, not the file).
_RULES = replace(rules_of(DEFAULT_PROFILE), construction="any_group")


def _reference(device) -> ReferenceSharder:
    capacity = _capacity[get_tp_group().rank_in_group]
    return ReferenceSharder(
        capacity.max_num_reqs,
        capacity.max_num_logits_per_req,
        comm=_CollectivesOfTheFile(),
        device=device,
        rules=rules_of(_RULES),
    )


class BatchSharder:
    def __init__(self, max_num_reqs, max_num_logits_per_req, device):
        self.device = device
        _capacity[get_tp_group().rank_in_group] = _Capacity(max_num_reqs, max_num_logits_per_req)

    def shard_sampler_inputs(self, input_batch, grammar_output):
        return tuple(_reference(self.device).shard_sampler_inputs(input_batch, grammar_output))


def all_to_all_logits(logits_shard, metadata):
    return _reference(logits_shard.device).all_to_all_logits(logits_shard, metadata)


def gather_sampler_output(
    local_output, metadata, device, global_batch, local_batch, gather_num_nans=False, logprobs_dims=None
):
    return _reference(device).gather_sampler_output(
        local_output, metadata, global_batch, local_batch, gather_num_nans=gather_num_nans, logprobs_dims=logprobs_dims
    )
