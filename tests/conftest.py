"""Shared test setup: Triton kernels run in the interpreter where no GPU is present."""

import os

import torch

# Must be set before any @triton.jit function is defined (import time).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
