"""Controls: sharders that differ from the reference only where the spec leaves freedom.

They must pass every checker; a checker that flags one judges something the
spec does not specify.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from shardspec.comm import TorchDistComm
from shardspec.reference import ReferenceSharder

GARBAGE_ID = 7777


class GarbageWirePadding(ReferenceSharder):
    """Fills every wire padding row (CL-WIRE-PADDING) with junk: ids 7777, logprobs NaN."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        self._layout = (metadata, np.asarray(local_batch.cu_num_logits_np, dtype=np.int64))
        self._gathers_issued = 0
        # Kind of each all_gather in order: per request or per logits row (extension fields last).
        extensions = kwargs.get("extension_fields") or {}
        logprobs = ["logits_row"] * (2 if kwargs.get("logprobs_dims") is not None else 0)
        self._kinds = ["request", *logprobs, *(spec.per for spec in extensions.values())]
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)

    def _all_gather(self, send):
        metadata, cu = self._layout
        padding = torch.ones(send.shape[0], dtype=torch.bool, device=send.device)
        if self._kinds[self._gathers_issued] == "request":  # one row per local request
            padding[: metadata.num_local_reqs] = False
        else:  # per-row buffers: row j * W + p carries local request j's p-th row
            width = metadata.max_num_logits_per_req
            for j, count in enumerate(np.diff(cu)):
                padding[j * width : j * width + int(count)] = False
        self._gathers_issued += 1
        junk = float("nan") if send.is_floating_point() else GARBAGE_ID
        if send.dtype == torch.bool or send.dtype in (torch.uint8, torch.int8):
            junk = True if send.dtype == torch.bool else 77  # fits every small integer dtype
        mask = padding.reshape(-1, *[1] * (send.dim() - 1))
        return super()._all_gather(send.masked_fill(mask, junk))


class RankDependentRowsPastTheAdmitted(ReferenceSharder):
    """Fills the gathered logprob rows from L on (unspecified with admitted counts, CL-ADMITTED-DRAFTS) with
    junk that differs by rank, as vLLM 0.33's torch.empty rows do."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        lp = out.logprobs_tensors
        rows = int(global_batch.cu_num_logits[-1]) if global_batch.num_reqs else 0
        if lp is None or rows == lp.logprobs.shape[0]:
            return out
        junk = GARBAGE_ID + self.rank
        ids, values, ranks = lp.logprob_token_ids.clone(), lp.logprobs.clone(), lp.selected_token_ranks.clone()
        ids[rows:], values[rows:], ranks[rows:] = junk, float(junk), junk
        lp = lp._replace(logprob_token_ids=ids, logprobs=values, selected_token_ranks=ranks)
        return type(out)(**{**vars(out), "logprobs_tensors": lp})


class EveryCallOnAGroupOfItsOwn(ReferenceSharder):
    """Builds its own process group over exactly the TP group's ranks and issues every collective of the step
    on it, as vLLM does with the groups it builds (issue 34). Not a control of the in-process corpus: torch's
    threaded backend cannot build a group while ranks take turns; it runs in multi-process worlds
    (tests/conformance/test_unseen_collectives.py, test_multigroup.py)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        ranks = dist.get_process_group_ranks(self.comm.group)
        self.comm = TorchDistComm(dist.new_group(ranks, use_local_synchronization=True))


class ExchangeOnTheBackendObject(ReferenceSharder):
    """Issues the spec's all-to-all and all-gathers on the TP group's backend object
    (comm.group._get_backend(device).alltoall_base / _allgather_base): the same collectives on the same
    group as torch.distributed's functions issue, so a peer calling those meets them. Multi-process only, like
    EveryCallOnAGroupOfItsOwn (torch's threaded group has no backend object)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.comm = _OnTheBackend(self.comm)


class _OnTheBackend:
    def __init__(self, comm):
        self._comm = comm

    def _backend(self, tensor):
        return self._comm.group._get_backend(tensor.device)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        splits = (list(output_split_sizes), list(input_split_sizes))
        self._backend(input).alltoall_base(output, input, *splits).wait()

    def all_gather_into_tensor(self, output, input):
        self._backend(input)._allgather_base(output, input.contiguous()).wait()

    def __getattr__(self, name: str):
        return getattr(self._comm, name)
