"""What the reference does for a case, computed once for all ranks.

The reference runs every rank of the case in one process
(:class:`shardspec.comm.LockstepGroup`); the result is saved into the run
directory so that the ranks of a multi-process run load it instead of each
recomputing it.
"""

from __future__ import annotations

import collections
import contextlib
import os

import torch

from shardspec.comm import LockstepGroup
from shardspec.conformance.harness.rank_step import run_step
from shardspec.conformance.record import Expectation
from shardspec.reference import ReferenceSharder
from shardspec.reference.sampler import replicated_output
from shardspec.spec.case import Case, build_case_inputs
from shardspec.spec.errors import names_precondition
from shardspec.spec.model import SamplerOutput


def reference_factory(max_num_reqs, max_num_logits_per_req, *, comm, device, rules, **profile_kwargs):
    return ReferenceSharder(
        max_num_reqs, max_num_logits_per_req, comm=comm, device=device, rules=rules, **profile_kwargs
    )


def rank_placement(world_size: int, share_gpus: bool = False, num_gpus: int | None = None) -> tuple[str, str]:
    """(device kind, collective backend) of a launched world of ``world_size`` ranks: one GPU each on
    NCCL; with ``share_gpus`` and fewer GPUs than ranks, GPUs shared on gloo (NCCL refuses a second rank
    on a GPU, gloo moves CUDA tensors through host memory); else the CPU on gloo.

    The expectation is computed on the same kind of device: float results
    such as log-softmax differ in the last bits between devices.
    """
    if num_gpus is None:
        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if num_gpus >= world_size:
        return "cuda", "nccl"
    return ("cuda", "gloo") if share_gpus and num_gpus else ("cpu", "gloo")


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


def expectation_device(choice: str = "auto") -> str:
    """Where in-process runs put every rank, and so the default device of :func:`compute_expectation`.

    ``choice`` (``--in-process-device``): ``cpu``, ``cuda`` (all ranks
    on the current GPU, taking turns, so compiled kernels run), or ``auto`` (default): cuda where
    there is a GPU, since compiled Triton kernels cannot read CPU tensors.
    """
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def interpret_triton_without_gpu() -> None:
    """Without a GPU, Triton kernels run in Triton's interpreter: called before any kernel is defined (before an
    implementation is imported)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


class BoundedCache:
    """The most recently used values, at most ``size`` of them: a run of thousands of cases keeps the few the
    entries of one group size share, not every case's tensors."""

    def __init__(self, size: int):
        self.size = size
        self._values: collections.OrderedDict = collections.OrderedDict()

    def get(self, key, make):
        if key in self._values:
            self._values.move_to_end(key)
        else:
            self._values[key] = make()
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return self._values[key]


# Every entry of a run meets a case at one group size, in turn: the bound holds those of one size.
_CACHE = BoundedCache(2048)


def compute_expectation(case: Case, timeout_s: float = 60.0, device: str | None = None) -> Expectation:
    """The reference's run of ``case``; computed once per process (several implementations share it)."""
    device = device or expectation_device()
    return _CACHE.get(f"{device}:{case!r}", lambda: _compute(case, timeout_s, device))


def contradiction(case: Case, timeout_s: float = 60.0, device: str | None = None) -> str | None:
    """Why the reference contradicts ``case`` (None where it agrees): its ``expect_error`` names a
    precondition the reference raises on no rank, or it expects no error where the reference raises one.
    Such a case would be judged by no checker: a case named on the command line is refused, and the
    shrinker keeps no such variant."""
    try:
        expected = compute_expectation(case, timeout_s, device).expected
    except Exception as exc:  # the reference's own group failed: the case cannot be judged
        return f"case {case.case_id}: the reference cannot run it ({type(exc).__name__}: {_first_line(exc)})"
    raised = [(rank, out) for rank, out in enumerate(expected) if out.error is not None]
    if case.expect_error is None:
        if not raised:
            return None
        rank, out = next(((r, o) for r, o in raised if getattr(o.error, "precondition_id", None)), raised[0])
        return (
            f"case {case.case_id} expects no error, but the reference raises {_named(out.error)} on rank {rank} "
            f"in step {out.failed_step}; set expect_error or fix the inputs"
        )
    if any(names_precondition(out.error, case.expect_error) for _, out in raised):
        return None
    instead = f"; it raises {_named(raised[0][1].error)}" if raised else "; it completes the step"
    return (
        f"case {case.case_id} expects {case.expect_error}, but the reference does not raise it{instead} "
        "(a case is judged against the reference: fix expect_error or the inputs)"
    )


def _named(error: BaseException) -> str:
    precondition = getattr(error, "precondition_id", None)
    return str(precondition) if precondition else f"{type(error).__name__} ({_first_line(error)})"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else ""


def _compute(case: Case, timeout_s: float, device: str) -> Expectation:
    with single_thread():
        inputs = build_case_inputs(case, device)
        group = LockstepGroup(case.tp_size, timeout_s=timeout_s)

        def one_rank(comm):
            return run_step(reference_factory, case, inputs, comm, device).outputs

        expected = group.run(one_rank, partial=True)
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
        rules=case.rules,
        adaptive_verification_enabled=case.adaptive_verification,
    )
