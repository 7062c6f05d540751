"""Build consistent inputs from a few numbers (tests, fixtures, benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from shardspec.spec.model import GrammarOutput, InputBatch


def default_query_lens(slots: Sequence[int], num_logits_per_req: Sequence[int]) -> np.ndarray:
    """Each request's query length when none is given: its logits rows plus slot % 3, so requests
    differ in how many of their tokens are not sampled."""
    slots_np = np.asarray(slots, dtype=np.int64).reshape(-1)
    return np.asarray(num_logits_per_req, dtype=np.int64).reshape(-1) + slots_np % 3


def sampled_token_ranges(slots: Sequence[int], num_logits_per_req: Sequence[int]) -> list[range]:
    """Per request, the tokens whose logits rows are sampled (the last n_i of its query), as
    build_input_batch lays them out without ``query_lens``."""
    ends = np.cumsum(default_query_lens(slots, num_logits_per_req)).tolist()
    return [range(end - int(n), end) for end, n in zip(ends, num_logits_per_req, strict=True)]


def build_input_batch(
    slots: Sequence[int],
    num_logits_per_req: Sequence[int],
    *,
    spec_decode: bool | None = None,
    query_lens: Sequence[int] | None = None,
    seq_lens: Sequence[int] | None = None,
    req_ids: Sequence[str] | None = None,
    device: torch.device | str = "cpu",
    admitted_drafts: Sequence[int] | None = None,
    seq_lens_upper_bound: bool = True,
    dtypes: dict[str, str] | None = None,
    seq_lens_growth: int = 0,
) -> InputBatch:
    """A batch that meets every precondition.

    ``spec_decode`` defaults to "some request has more than one logits row";
    with it, ``num_draft_tokens_per_req`` is n_i - 1. Each query is at least
    n_i tokens (``query_lens``, default n_i + (slot % 3)), and logits rows are
    the last n_i tokens of it.

    vllm-0.33 (CL-ADMITTED-DRAFTS): with ``admitted_drafts``, ``num_logits_per_req`` are the scheduled
    rows; the device fields lay out 1 + admitted rows per request, cu_num_logits_np and
    num_draft_tokens_per_req keep the scheduled counts. ``seq_lens_upper_bound`` (default: on, as
    vLLM's model runner has always built it since 0.33, and profiles with seq_lens_upper_bound: always
    require) adds seq_lens_cpu_upper_bound (a CPU tensor at or above seq_lens); off, it is None.
    ``dtypes`` gives device fields another integer dtype. ``seq_lens_growth`` makes every default seq_len
    that many tokens longer (the same requests some decode steps later).
    """
    if admitted_drafts is not None:
        scheduled = np.asarray(num_logits_per_req, dtype=np.int64).reshape(-1)
        admitted = np.asarray(admitted_drafts, dtype=np.int32).reshape(-1)
        batch = build_input_batch(
            slots,
            1 + admitted,
            spec_decode=True,
            query_lens=query_lens,
            seq_lens=seq_lens,
            req_ids=req_ids,
            device=device,
            seq_lens_upper_bound=seq_lens_upper_bound,
            dtypes=dtypes,
            seq_lens_growth=seq_lens_growth,
        )
        cu = np.zeros(batch.num_reqs + 1, dtype=np.int32)
        np.cumsum(scheduled, out=cu[1:])
        return replace(
            batch,
            cu_num_logits_np=cu,
            num_draft_tokens_per_req=(scheduled - 1).astype(np.int32),
            num_draft_tokens=int(admitted.sum()),
            num_admitted_draft_tokens=admitted,
        )
    slots_np = np.asarray(slots, dtype=np.intp).reshape(-1)
    counts = np.asarray(num_logits_per_req, dtype=np.int64).reshape(-1)
    num_reqs = slots_np.shape[0]
    if spec_decode is None:
        spec_decode = bool((counts > 1).any())
    q_lens = default_query_lens(slots_np, counts) if query_lens is None else np.asarray(query_lens, dtype=np.int64)
    qsl = np.zeros(num_reqs + 1, dtype=np.int64)
    np.cumsum(q_lens, out=qsl[1:])
    cu = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(counts, out=cu[1:])
    owner = np.repeat(np.arange(num_reqs), counts)
    local_pos = np.arange(int(cu[-1])) - cu[owner]
    logits_indices = qsl[owner + 1] - counts[owner] + local_pos
    s_lens = (q_lens + 7 + slots_np + seq_lens_growth) if seq_lens is None else np.asarray(seq_lens, dtype=np.int64)
    drafts = (counts - 1).astype(np.int32) if spec_decode else None
    dev = torch.device(device)
    dtype = {name: getattr(torch, value) for name, value in (dtypes or {}).items()}
    batch = InputBatch(
        req_ids=list(req_ids) if req_ids is not None else [f"req-{s}" for s in slots_np.tolist()],
        num_reqs=num_reqs,
        idx_mapping=torch.from_numpy(slots_np.astype(np.int64)).to(dev),
        idx_mapping_np=slots_np,
        expanded_idx_mapping=torch.from_numpy(slots_np[owner].astype(np.int32)).to(dev),
        expanded_local_pos=torch.from_numpy(local_pos.astype(np.int32)).to(dev),
        query_start_loc=torch.from_numpy(qsl.astype(np.int32)).to(dev),
        seq_lens=torch.from_numpy(np.asarray(s_lens, dtype=np.int32)).to(dev),
        logits_indices=torch.from_numpy(logits_indices.astype(np.int64)).to(dev),
        cu_num_logits=torch.from_numpy(cu).to(dev),
        cu_num_logits_np=cu,
        num_draft_tokens=0 if drafts is None else int(drafts.sum()),
        num_draft_tokens_per_req=drafts,
        # A bound above seq_lens, as the host knows it before the device's count (vllm-0.33).
        seq_lens_cpu_upper_bound=torch.from_numpy(np.asarray(s_lens, dtype=np.int32) + 1)
        if seq_lens_upper_bound
        else None,
    )
    return replace(batch, **{name: getattr(batch, name).to(value) for name, value in dtype.items()})


def build_grammar_output(
    batch: InputBatch,
    req_positions: Sequence[int],
    vocab_size: int,
    *,
    seed: int = 0,
    block_rows: int | None = None,
    num_acceptable_drafts: Sequence[int] | None = None,
) -> GrammarOutput | None:
    """Random bitmasks for the requests at ``req_positions`` (in that order).

    Every row allows at least one token, so a masked row is never all -inf. One row per logits row
    (vllm-seed), or with ``block_rows`` a block of that many rows per listed request, padding rows
    included (vllm-0.33, CL-GRAMMAR-BLOCKS). No positions: a grammar output that lists no request (G = 0).
    """
    generator = torch.Generator().manual_seed(seed)
    cu = batch.cu_num_logits_np
    rows = sum(int(cu[i + 1] - cu[i]) for i in req_positions) if block_rows is None else block_rows * len(req_positions)
    num_words = (vocab_size + 31) // 32
    words = torch.randint(-(2**31), 2**31 - 1, (rows, num_words), generator=generator, dtype=torch.int64)
    words[:, 0] |= 1  # token 0 always allowed
    device = batch.idx_mapping.device
    return GrammarOutput(
        structured_output_request_ids=[batch.req_ids[i] for i in req_positions],
        grammar_bitmask=words.to(torch.int32).to(device),
        num_acceptable_drafts=None if num_acceptable_drafts is None else [int(n) for n in num_acceptable_drafts],
    )


def build_token_logits(
    num_tokens: int, padded_vocab: int, *, seed: int = 0, nan_rows: Sequence[int] = ()
) -> torch.Tensor:
    """[T, Vp] float32 logits of every token; NaN in a few columns of ``nan_rows``."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, padded_vocab, generator=generator)
    for k, row in enumerate(nan_rows):
        logits[row, (k * 7) % padded_vocab :: max(1, padded_vocab // 3)] = float("nan")
    return logits
