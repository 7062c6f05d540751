"""Adapter: the upstream-style functions behind shardspec's plug-in API.

Run the suite against it (from the repository root)::

    PYTHONPATH=examples/out_of_tree_adapter \
        python -m shardspec.conformance --impl shardspec_adapter:make_sharder

The suite calls ``make_sharder(max_num_reqs, max_num_logits_per_req, comm=...,
device=..., adaptive_verification_enabled=...)`` (the last under profile vllm-0.34) once per case
and rank, then the three methods below.
"""

from __future__ import annotations

import torch
import upstream_style

from shardspec.spec.model import ShardResult


class UpstreamStyleSharder:
    SPEC_VERSION = "0.5.0"
    SPEC_PROFILES = ("vllm-0.34",)

    def __init__(
        self, max_num_reqs: int, max_num_logits_per_req: int, *, comm, device, adaptive_verification_enabled=False
    ):
        group = getattr(comm, "group", None)
        if group is None:
            raise RuntimeError(
                "this adapter calls torch.distributed itself: run the suite multi-process "
                "(the default), not --in-process"
            )
        self.state = upstream_style.SharderState(
            max_num_reqs, max_num_logits_per_req, torch.device(device), group, adaptive_verification_enabled
        )
        # Built once here as the engine does at start-up: vllm-0.34 refuses a group of one and fewer request
        # slots than ranks before any step (PRE-TP-SIZE, PRE-CAPACITY-TP).
        self.state._sharder()

    def shard_sampler_inputs(self, batch, grammar) -> ShardResult:
        # Upstream returns a plain tuple; the suite expects the named one.
        return ShardResult(*upstream_style.shard_sampler_inputs(batch, grammar, self.state))

    def all_to_all_logits(self, logits_shard, metadata):
        return upstream_style.all_to_all_logits(logits_shard, metadata, self.state)

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
        return upstream_style.gather_sampler_output(
            local_output,
            metadata,
            self.state.device,
            global_batch,
            local_batch,
            gather_num_nans=gather_num_nans,
            logprobs_dims=logprobs_dims,
            extension_fields=extension_fields,
            sharder_state=self.state,
        )


make_sharder = UpstreamStyleSharder
