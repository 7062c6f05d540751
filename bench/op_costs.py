"""Host cost of the operations a sharder step is made of, on this machine's device.

Prints wall microseconds per call for torch views, allocations and copies, and
for the ways of launching one compiled Triton kernel, so that step timings can
be read as a count of such operations.

    python bench/op_costs.py
"""

from __future__ import annotations

import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def per_call_us(fn, iters=5000) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / iters * 1e6)
    return best


def main() -> int:
    dev = torch.device("cuda")
    a = torch.zeros(4096, 64, device=dev)
    b = torch.zeros(4096, 64, device=dev)
    flat = torch.zeros(1 << 20, dtype=torch.uint8, device=dev)
    send = torch.zeros(128, 21, dtype=torch.int64, device=dev)
    recv = torch.zeros(8 * 128, 21, dtype=torch.int64, device=dev)
    by_row = torch.zeros(8 * 128, 4096, device=dev).view(8, 128, 4096).transpose(0, 1)
    compiled = _copy_kernel[(4,)](a, b, a.numel(), BLOCK=1024)
    stream = torch._C._cuda_getCurrentRawStream(0)
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    pa, pb, n = a.data_ptr(), b.data_ptr(), a.numel()
    cases = {
        "a.view(64, 4096)": lambda: a.view(64, 4096),
        "a[:100]": lambda: a[:100],
        "a.narrow(0, 0, 100)": lambda: a.narrow(0, 0, 100),
        "a.transpose(0, 1)": lambda: a.transpose(0, 1),
        "a.unbind(0) (4096 views)": lambda: a[:3].unbind(0),
        "flat[:4096].view(torch.int64)": lambda: flat[:4096].view(torch.int64),
        "torch.empty(4096, int64)": lambda: torch.empty(4096, dtype=torch.int64, device=dev),
        "torch.empty((64, 20), float32)": lambda: torch.empty((64, 20), dtype=torch.float32, device=dev),
        "b.copy_(a)": lambda: b.copy_(a),
        "b.view(4096, 64).copy_(a) broadcast [1]": lambda: b.view(64, 64, 64).copy_(a[:64]),
        "all-gather stand-in: view + broadcast copy_": lambda: recv.view(8, 128, 21).copy_(send),
        "all-gather stand-in: torch.cat(out=)": lambda: torch.cat([send] * 8, out=recv),
        "transpose copy: reshape [8,128,4096]->[128,32768]": lambda: by_row.reshape(128, 8 * 4096),
        "transpose copy: empty + view + copy_": lambda: (
            torch.empty(128, 8 * 4096, device=dev).view(128, 8, 4096).copy_(by_row)
        ),
        "a.stride(0)": lambda: a.stride(0),
        "a.data_ptr()": lambda: a.data_ptr(),
        "a.shape[0]": lambda: a.shape[0],
        "getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "kernel[grid](...) (JIT path)": lambda: _copy_kernel[(4,)](a, b, n, BLOCK=1024),
        "compiled[grid](...)": lambda: compiled[(4, 1, 1)](a, b, n, 1024),
        "compiled.run(tensors)": lambda: run(4, 1, 1, stream, function, packed, None, None, None, a, b, n, 1024),
        "compiled.run(int pointers)": lambda: run(4, 1, 1, stream, function, packed, None, None, None, pa, pb, n, 1024),
    }
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name(dev)}")
    for name, fn in cases.items():
        print(f"{name:>44}: {per_call_us(fn):6.2f} us")
    assert torch.equal(a, b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
