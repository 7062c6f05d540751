"""Where a rank must have rejected a case's invalid inputs, and how the suite stops one that did not.

On a case whose inputs violate a must-reject precondition, the reference raises on a rank in some step,
after some number of collectives. An implementation that goes on past that point on this
rank has already failed INV-REJECT-INVALID there, and its peers (which may have rejected) would wait for
it in a collective until the case times out: the suite stops the rank before its next collective, or
as the step that must raise returns, and the checker reports the acceptance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shardspec.spec.case import Case
from shardspec.spec.errors import names_precondition
from shardspec.spec.loader import must_reject_ids


class NotRejected(BaseException):
    """Raised by the suite on a rank whose implementation went past the point where it must reject; not an
    Exception, so that an implementation's ``except Exception`` does not keep it."""


@dataclass
class RejectionPoint:
    step: str | None  # the step that must raise on this rank; None: it need not reject, and is never stopped
    collectives: int = 0  # how many collectives the rank issues before the raise (from the shard step on)
    stopped: str | None = None  # where the suite stopped the rank, once it did

    def steps(self, on_step: Callable | None) -> Callable | None:
        """``on_step`` (called as each step returns), then a stop after the step that must raise."""
        if self.step is None:
            return on_step

        def stepped(step: str, run) -> None:
            if on_step is not None:
                on_step(step, run)
            if step == self.step:
                self.stop(f"returned from step {step}")

        return stepped

    def calls(self, on_call: Callable | None) -> Callable | None:
        """``on_call`` (called before each collective is issued), after a stop before any collective the
        reference does not issue before raising."""
        if self.step is None:
            return on_call
        issued = []

        def calling(call) -> None:
            if len(issued) >= self.collectives:
                self.stop(f"went on to issue collective {len(issued)} ({call.kind})")
            issued.append(call.kind)
            if on_call is not None:
                on_call(call)

        return calling

    def stop(self, what: str) -> None:
        self.stopped = self.stopped or (
            f"the rank {what} instead of raising in step {self.step} after {self.collectives} collective(s); "
            "the suite stopped it there"
        )
        raise NotRejected(self.stopped)


def rejection_point(case: Case, expected) -> RejectionPoint:
    """Where the reference rejects ``case`` on the rank whose outputs are ``expected``; one that never stops
    the rank where the reference does not reject there or the precondition's violation is undefined."""
    precondition = case.expect_error
    if precondition is None:
        return RejectionPoint(None)
    if precondition not in must_reject_ids() or not names_precondition(expected.error, precondition):
        return RejectionPoint(None)
    return RejectionPoint(expected.failed_step, len(expected.wire))
