"""What the reference does for a case, computed once for all ranks.

The reference runs every rank of the case in one process
(:class:`shardspec.comm.LockstepGroup`); the result is saved into the run
directory so that the ranks of a multi-process run load it instead of each
recomputing it.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, replace
from typing import Any

import torch

from shardspec.comm import LockstepGroup
from shardspec.conformance.harness.recording import run_lockstep
from shardspec.conformance.judge.checks.base import StepOutputs
from shardspec.conformance.step import run_step
from shardspec.reference import ReferenceSharder
from shardspec.reference.sampler import replicated_output
from shardspec.spec.case import Case, build_case_inputs
from shardspec.spec.model import SamplerOutput


@dataclass
class Expectation:
    expected: list[StepOutputs]  # per rank
    replicated: SamplerOutput | None


def reference_factory(max_num_reqs, max_num_logits_per_req, *, comm, device, profile, **profile_kwargs):
    return ReferenceSharder(
        max_num_reqs, max_num_logits_per_req, comm=comm, device=device, profile=profile, **profile_kwargs
    )


def rank_device_kind(tp_size: int) -> str:
    """Where the ranks of a group of ``tp_size`` run: one GPU each (NCCL), else the CPU (gloo).

    The expectation is computed on the same kind of device: float results
    such as log-softmax differ in the last bits between devices.
    """
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= tp_size else "cpu"


@contextlib.contextmanager
def single_thread():
    """Ranks run with one intra-op thread; reductions split differently across threads
    round differently, so the expectation is computed the same way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


_CACHE: dict[str, Expectation] = {}


def expectation_device(choice: str = "auto") -> str:
    """Where in-process runs put every rank, and so the default device of :func:`compute_expectation`.

    ``choice`` (``--in-process-device``): ``cpu``, ``cuda`` (all ranks
    on the current GPU, taking turns, so compiled kernels run), or ``auto`` (default): cuda where
    there is a GPU, since compiled Triton kernels cannot read CPU tensors.
    """
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def compute_expectation(case: Case, timeout_s: float = 60.0, device: str | None = None) -> Expectation:
    """The reference's run of ``case``; computed once per process (several implementations share it)."""
    device = device or expectation_device()
    key = f"{device}:{case!r}"
    if key not in _CACHE:
        _CACHE[key] = _compute(case, timeout_s, device)
    return _CACHE[key]


def _compute(case: Case, timeout_s: float, device: str) -> Expectation:
    with single_thread():
        inputs = build_case_inputs(case, device)
        group = LockstepGroup(case.tp_size, timeout_s=timeout_s)

        def one_rank(comm):
            return run_step(reference_factory, case, inputs, comm, device).outputs

        expected = run_lockstep(group, one_rank)
        return Expectation(expected=expected, replicated=replicated_of(case, inputs))


def replicated_of(case: Case, inputs) -> SamplerOutput | None:
    """The unsharded path of ``case`` under its profile, for toy-sampled cases with valid inputs (else None)."""
    if case.local_outputs != "toy" or case.expect_error is not None:
        return None
    batch = inputs.batch
    logits = inputs.token_logits[batch.logits_indices][:, : case.vocab_size]
    return replicated_output(
        logits,
        batch,
        inputs.grammar,
        gather_num_nans=case.gather_num_nans,
        logprobs_dims=case.logprobs_dims,
        profile=case.profile,
        adaptive_verification_enabled=case.adaptive_verification,
    )


# -- saving: exceptions do not always survive pickling (keyword-only args) ---


def _pack_error(exc: BaseException | None) -> dict[str, Any] | None:
    if exc is None:
        return None
    cls = type(exc)
    return {"module": cls.__module__, "name": cls.__qualname__, "args": exc.args, "attrs": dict(vars(exc))}


def _unpack_error(packed: dict[str, Any] | None) -> BaseException | None:
    if packed is None:
        return None
    try:
        cls = getattr(importlib.import_module(packed["module"]), packed["name"])
    except (ImportError, AttributeError):
        cls = RuntimeError
    exc = cls.__new__(cls)
    exc.args = tuple(packed["args"])
    vars(exc).update(packed["attrs"])
    return exc


def save_expectations(path, expectations: dict[str, Expectation]) -> None:
    packed = {
        case_id: {
            "expected": [replace(out, error=None) for out in exp.expected],
            "errors": [_pack_error(out.error) for out in exp.expected],
            "replicated": exp.replicated,
        }
        for case_id, exp in expectations.items()
    }
    torch.save(packed, path)


def load_expectations(path, device="cpu") -> dict[str, Expectation]:
    packed = torch.load(path, map_location=device, weights_only=False)
    loaded = {}
    for case_id, item in packed.items():
        expected = [
            replace(out, error=_unpack_error(err)) for out, err in zip(item["expected"], item["errors"], strict=False)
        ]
        loaded[case_id] = Expectation(expected=expected, replicated=item["replicated"])
    return loaded
