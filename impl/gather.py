"""The gather's launches: the wire buffers of the all-gathers, the pack launch that fills this rank's
send buffers and the unpack launch that puts the gathered rows back in batch order.

:class:`WireLaunches` is a part of :class:`~shardspec.impl.sharder.ProductionSharder` (its base
class), kept here so that each file reads in one sitting. It uses the sharder's workspace
(``_ws``), caches (``_views``, ``_remember``), capacity and profile attributes, and ``_block_of``
for its block sizes.
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.impl import profiles
from shardspec.impl.gather_kernels import pack_kernel, unpack_kernel
from shardspec.impl.kernels import next_power_of_2
from shardspec.impl.launch import Launcher
from shardspec.impl.workspace import carve, logprobs_layout
from shardspec.spec.model import LogprobsTensors, SamplerOutput

_launch_pack = Launcher(pack_kernel)
_launch_unpack = Launcher(unpack_kernel)
# The first item of this class's keys in the sharder's cache (``_views``), which the sharder's own
# entries share: it keeps the three kinds of entry apart.
_WIRE, _PACK, _UNPACK = "wire", "pack", "unpack"


class WireLaunches:
    def _wire_views(self, per_rank: int, width: int, sampled_cols: int, num_cols: int | None):
        """(send, receive, logprob buffers or None) of the all-gathers, shaped for this step; cached."""
        key = (_WIRE, per_rank, width, sampled_cols, num_cols)
        views = self._views.get(key)
        if views is None:
            tp = self.tp_size
            send = self._ws["send_sampled"][: per_rank * sampled_cols].view(per_rank, sampled_cols)
            received = self._ws["recv_sampled"][: tp * send.numel()].view(tp * per_rank, sampled_cols)
            lp = None if num_cols is None else self._logprob_buffers(num_cols, per_rank * width)
            views = self._remember(key, (send, received, lp))
        return views

    def _logprob_buffers(self, num_cols: int, send_rows: int) -> dict:
        """Views of the logprob wire buffers for ``send_rows`` rows; grown when columns grow."""
        if num_cols > self._logprob_cols:
            layout = logprobs_layout(self.max_num_reqs, self.max_num_logits_per_req, self.tp_size, num_cols)
            self._lp_ws, self._logprob_cols = carve(layout, self.device), num_cols
            self._views.clear()  # views of the replaced buffers
        tp, lp = self.tp_size, self._lp_ws
        return {
            "send_ids": lp["send_ids"][: send_rows * (num_cols + 1)].view(send_rows, num_cols + 1),
            "send_vals": lp["send_vals"][: send_rows * num_cols].view(send_rows, num_cols),
            "recv_ids": lp["recv_ids"][: tp * send_rows * (num_cols + 1)].view(tp * send_rows, num_cols + 1),
            "recv_vals": lp["recv_vals"][: tp * send_rows * num_cols].view(tp * send_rows, num_cols),
        }

    def _launch_pack(self, out, local_batch, send, lp, num_local, per_rank, width, num_cols, gather_num_nans):
        has_output = out is not None and num_local > 0
        ids = out.sampled_token_ids if has_output else send
        nans = out.num_nans if has_output and gather_num_nans else send
        local_lp = out.logprobs_tensors if has_output and lp is not None else None
        block, constexprs, key_prefix = self._pack_config(
            has_output, gather_num_nans, lp is not None, local_lp is not None, width, num_cols
        )
        if local_lp is not None:
            lp_ids, lp_vals, lp_ranks = local_lp.logprob_token_ids, local_lp.logprobs, local_lp.selected_token_ranks
        else:
            lp_ids, lp_vals, lp_ranks = send, send, send
        lp_send_ids, lp_send_vals = (lp["send_ids"], lp["send_vals"]) if lp is not None else (send, send)
        sampled = out.num_sampled if has_output else send
        rejected = out.num_rejected if has_output else send
        local_cu = local_batch.cu_num_logits if has_output else send
        if has_output and not self.check_preconditions:
            # Unchecked shapes: read no request past the shortest per-request tensor.
            num_local = min(num_local, ids.shape[0], sampled.shape[0], rejected.shape[0], local_cu.shape[0] - 1)
        key = (
            *key_prefix,
            local_cu.dtype,
            ids.dtype,
            sampled.dtype,
            rejected.dtype,
            nans.dtype,
            lp_ids.dtype,
            lp_vals.dtype,
            lp_ranks.dtype,
        )
        ids_strides, lp_ids_strides, lp_vals_strides = ids.stride(), lp_ids.stride(), lp_vals.stride()
        # Rows the local prefix sum points at are bounded by what the tensors hold.
        lp_len = min(lp_ids.shape[0], lp_vals.shape[0], lp_ranks.shape[0]) if local_lp is not None else 0
        _launch_pack(
            -(-per_rank // block),
            key,
            (
                send,
                local_cu,
                local_cu.stride(0),
                ids,
                ids_strides[0],
                ids_strides[-1],
                ids.shape[-1],
                sampled,
                sampled.stride(0),
                rejected,
                rejected.stride(0),
                nans,
                nans.stride(0),
                lp_send_ids,
                lp_send_vals,
                lp_ids,
                lp_ids_strides[0],
                lp_ids_strides[-1],
                lp_vals,
                lp_vals_strides[0],
                lp_vals_strides[-1],
                lp_ids.shape[-1],
                lp_ranks,
                lp_ranks.stride(0),
                nans.shape[0],
                lp_len,
                num_local,
                per_rank,
                width,
                send.shape[1],
                num_cols,
            ),
            constexprs,
        )

    def _pack_config(self, has_output, gather_num_nans, has_logprobs, local_logprobs, width, num_cols):
        """(requests per program, constexprs, launch key prefix) of pack_kernel; cached per configuration."""
        key = (_PACK, has_output, gather_num_nans, has_logprobs, local_logprobs, width, num_cols)
        config = self._views.get(key)
        if config is None:
            cols_pad = next_power_of_2(num_cols + 1)
            block = self._block_of(self._rows_pad * cols_pad + self._rows_pad + 3)
            constexprs = dict(
                HAS_OUTPUT=has_output,
                HAS_NANS=gather_num_nans,
                HAS_LOGPROBS=has_logprobs,
                LOCAL_LOGPROBS=local_logprobs,
                BLOCK=block,
                ROWS_PAD=self._rows_pad,
                SAMPLED_PAD=next_power_of_2(width + 3),
                COLS_PAD=cols_pad,
            )
            config = self._remember(key, (block, constexprs, (self.device.index, *constexprs.values())))
        return config

    def _unpack_config(self, gather_num_nans, has_logprobs, num_cols):
        """(requests per program, constexprs, launch key prefix) of unpack_kernel; cached per configuration."""
        key = (_UNPACK, gather_num_nans, has_logprobs, num_cols)
        config = self._views.get(key)
        if config is None:
            cols_pad = next_power_of_2(num_cols + 1)
            block = self._block_of(self._rows_pad * cols_pad + self._rows_pad)
            constexprs = dict(
                HAS_NANS=gather_num_nans,
                HAS_LOGPROBS=has_logprobs,
                BLOCK=block,
                ROWS_PAD=self._rows_pad,
                COLS_PAD=cols_pad,
            )
            config = self._remember(key, (block, constexprs, (self.device.index, *constexprs.values())))
        return config

    def _unpack(self, received, lp, metadata, global_batch, layout, width, sampled_cols, num_cols, gather_num_nans):
        """``layout``: the batch's host prefix sums of the rows its device fields lay out; the logprobs
        have cu_num_logits_np[N] rows, the first layout[N] of them gathered (INV-LOGPROBS-SHAPES)."""
        num_reqs = metadata.gathered_src_indices.shape[0]
        num_rows, num_logits = int(global_batch.cu_num_logits_np[-1]), int(layout[-1])
        device = self.device
        sampled_token_ids = torch.empty((num_reqs, width), dtype=torch.int64, device=device)
        # num_sampled, num_rejected (and num_nans): rows of one allocation.
        counts = torch.empty((3 if gather_num_nans else 2, num_reqs), dtype=torch.int32, device=device).unbind(0)
        logprobs = None
        if lp is not None:
            if self.adaptive_verification_enabled:
                generated = profiles.adaptive_generated_tokens(global_batch, device)
            else:  # INV-CU-NUM-GENERATED: the host list where L != N
                generated = (np.asarray(global_batch.cu_num_logits_np).tolist() if num_rows != num_reqs else None, None)
            logprobs = LogprobsTensors(
                torch.empty((num_rows, num_cols), dtype=torch.int64, device=device),
                torch.empty((num_rows, num_cols), dtype=torch.float32, device=device),
                torch.empty(num_rows, dtype=torch.int64, device=device),
                *generated,
            )
            if num_rows > num_logits:
                # Rows of drafts that were not admitted: unspecified, written as the reference pads them.
                logprobs.logprob_token_ids[num_logits:].zero_()
                logprobs.logprobs[num_logits:].fill_(float("-inf"))
                logprobs.selected_token_ranks[num_logits:].zero_()
        if num_reqs:
            block, constexprs, key_prefix = self._unpack_config(gather_num_nans, lp is not None, num_cols)
            src_indices, cu = metadata.gathered_src_indices, global_batch.cu_num_logits
            key = (*key_prefix, src_indices.dtype, cu.dtype)
            # Absent outputs are never written (their constexpr flag is off): any tensor stands in.
            lp_args = (lp["recv_ids"], lp["recv_vals"], *logprobs[:3]) if lp is not None else (received,) * 5
            _launch_unpack(
                -(-num_reqs // block),
                key,
                (
                    received,
                    src_indices,
                    cu,
                    cu.stride(0),
                    cu.shape[0],
                    sampled_token_ids,
                    *counts[:2],
                    counts[-1],
                    *lp_args,
                    num_reqs,
                    num_logits,
                    received.shape[0],
                    width,
                    sampled_cols,
                    num_cols,
                ),
                constexprs,
            )
        return SamplerOutput(
            sampled_token_ids=sampled_token_ids,
            logprobs_tensors=logprobs,
            num_nans=counts[2] if gather_num_nans else None,
            num_sampled=counts[0],
            num_rejected=counts[1],
        )
