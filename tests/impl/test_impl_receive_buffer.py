"""The all-to-all's receive buffer lives for one call: nothing the size of the logits stays with the sharder.

Between steps a sharder may keep only buffers sized by its capacity (requests, rows per request, tp), never
by the vocabulary: its peak memory per step must stay within 1/tp of a replicated sampler's plus
O(requests). The reorder copy is checked bit for bit against the plain layout, also in its widened form.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from impl_steps import DEVICE

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.impl import exchange as exchange_module
from shardspec.spec.builders import build_input_batch

TP = 4
MAX_REQS, MAX_ROWS = 32, 2


def _tensors(value, seen: set) -> list[torch.Tensor]:
    """Every tensor reachable from ``value`` through attributes, dicts, lists and tuples."""
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, list | tuple):
        items = list(value)
    elif hasattr(value, "__dict__") and type(value).__module__.startswith("shardspec.impl"):
        items = list(vars(value).values())
    else:
        return []
    return [t for item in items for t in _tensors(item, seen)]


def kept_bytes(sharder: ProductionSharder) -> int:
    """Bytes of the distinct storages the sharder references between calls."""
    storages = {}
    for tensor in _tensors(sharder, set()):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _step(sharder: ProductionSharder, vocab: int, dtype: torch.dtype, num_reqs: int = 24, rows: int = 2):
    rng = np.random.default_rng(vocab + num_reqs)
    slots = rng.permutation(MAX_REQS)[:num_reqs]
    batch = build_input_batch(slots, [rows] * num_reqs, device=DEVICE)
    shard = sharder.shard_sampler_inputs(batch, None)
    gen = torch.Generator(device=DEVICE).manual_seed(vocab)
    logits = torch.randn(batch.num_logits, vocab // TP, generator=gen, device=DEVICE).to(dtype)
    return shard.metadata, logits, sharder.all_to_all_logits(logits, shard.metadata)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nothing_kept_grows_with_the_vocabulary(dtype):
    kept = {}
    for vocab in (256, 8192):
        sharder = ProductionSharder(MAX_REQS, MAX_ROWS, comm=LoopbackComm(0, TP), device=DEVICE)
        before = kept_bytes(sharder)
        metadata, _, local = _step(sharder, vocab, dtype)
        assert local.shape == (metadata.num_local_logits, vocab)
        del local
        kept[vocab] = kept_bytes(sharder)
        assert kept[vocab] == before  # the step added nothing that stays
    assert kept[256] == kept[8192]


def test_results_of_consecutive_calls_are_independent():
    sharder = ProductionSharder(MAX_REQS, MAX_ROWS, comm=LoopbackComm(0, TP), device=DEVICE)
    _, logits, first = _step(sharder, 512, torch.float32)
    saved = first.clone()
    _step(sharder, 512, torch.float32)
    torch.testing.assert_close(first, saved, rtol=0, atol=0)


def _expected(logits: torch.Tensor, num_local: int, rows_per_rank: list[int]) -> torch.Tensor:
    """Every simulated peer sends what rank 0 sends: its own rows, its shard width, side by side."""
    mine = logits[: rows_per_rank[0]]
    return torch.cat([mine] * TP, dim=1)


@pytest.mark.parametrize("widen_from", [0, 1 << 60])
@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [
        (512, torch.float32),
        (512, torch.bfloat16),
        (8 * TP, torch.bfloat16),
        (4 * TP, torch.bfloat16),
        (2 * TP, torch.bfloat16),
        (TP, torch.float16),
        (TP, torch.float32),
    ],
)
def test_reorder_widened_or_not_is_the_plain_layout(monkeypatch, widen_from, vocab, dtype):
    monkeypatch.setattr(exchange_module, "_WIDEN_FROM_BYTES", widen_from)
    sharder = ProductionSharder(MAX_REQS, MAX_ROWS, comm=LoopbackComm(0, TP), device=DEVICE)
    rng = np.random.default_rng(vocab)
    batch = build_input_batch(rng.permutation(MAX_REQS)[:24], [2] * 24, device=DEVICE)
    metadata = sharder.shard_sampler_inputs(batch, None).metadata
    logits = torch.randint(-100, 100, (batch.num_logits, vocab // TP), device=DEVICE).to(dtype)
    local = sharder.all_to_all_logits(logits, metadata)
    assert local.dtype == dtype and local.is_contiguous()
    expected = _expected(logits, metadata.num_local_logits, metadata.num_logits_per_rank)
    assert torch.equal(local, expected)


@pytest.mark.parametrize("width", [8, 16, 24])
def test_widened_reorder_keeps_every_bit(width):
    """NaN payloads and signed zeros survive the copy as int64 or complex128 words."""
    received = torch.arange(6 * width, dtype=torch.int16).view(torch.bfloat16).view(6, width)
    received[0, 0] = float("nan")
    received[1, 1] = -0.0
    received.view(torch.int16)[2, 2] = 0x7F81  # a signalling NaN's bits
    plain = exchange_module._reorder(received, 3, 2, width)
    old = exchange_module._WIDEN_FROM_BYTES
    try:
        exchange_module._WIDEN_FROM_BYTES = 0
        wide = exchange_module._reorder(received, 3, 2, width)
    finally:
        exchange_module._WIDEN_FROM_BYTES = old
    expected = received.view(2, 3, width).transpose(0, 1).reshape(3, 2 * width).view(torch.int16)
    assert torch.equal(plain.view(torch.int16), expected)
    assert torch.equal(wide.view(torch.int16), expected)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("widen_from", [0, 1 << 60])
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((5, 16), torch.bfloat16), ((5, 4), torch.bfloat16), ((3, 3), torch.bfloat16), ((5, 8), torch.float32)],
)
def test_loopback_copies_as_words_are_the_plain_copies(monkeypatch, widen_from, shape, dtype):
    """The stand-in's collectives copy large buffers as 16- or 8-byte words: the same bits as the plain copy."""
    from shardspec import comm as comm_module

    monkeypatch.setattr(comm_module, "_WIDEN_FROM_BYTES", widen_from)
    loop = LoopbackComm(1, TP)
    sent = torch.randn(shape, device=DEVICE).to(dtype)
    sent.view(-1)[0] = float("nan")
    splits = [1, shape[0] - 2, 1, 0]
    received = torch.full((TP * splits[1], shape[1]), 7, dtype=dtype, device=DEVICE)
    loop.all_to_all_single(received, sent, [splits[1]] * TP, splits)
    assert torch.equal(_bits(received), _bits(sent[1 : 1 + splits[1]].repeat(TP, 1)))
    gathered = torch.full((TP * shape[0], shape[1]), 7, dtype=dtype, device=DEVICE)
    loop.all_gather_into_tensor(gathered, sent)
    assert torch.equal(_bits(gathered), _bits(sent.repeat(TP, 1)))
