"""The cost of an implementation that crashes: after a few of its cases end alike, the rest are not run.

A case whose rank dies or hangs ends its launch, and the suite relaunches
the group for the cases after it: one relaunch per crash, and a hang costs
the whole case timeout first. When ``max_crashes`` cases of one entry at one
group size have ended the same way (the same kind of end in the same step),
that entry's remaining cases there are reported not run, with that reason,
instead of paying for each again (like pytest's ``--maxfail``). A constructor that raises
the same error (type and message) in ``max_crashes`` cases spends the budget too: a sharder that
cannot be built fails every case alike, each with a relaunch and a traceback per rank.

Crashes on cases of invalid inputs (a precondition broken on purpose: must be rejected, or undefined; or,
in a robustness run, a guarantee of the profile's callers broken) are counted apart and stop only the
entry's other invalid-input cases: an implementation that trusts its
scheduler (vLLM checks few preconditions) may abort on invalid input and still run every valid case right,
and those valid cases are what its users run.

A valid case whose rank was killed by a signal after other cases ran in the same processes is run again
on its own before the crash is blamed on it (:func:`suspect_crash`): an earlier case can corrupt the
heap without crashing (an implementation that trusts its inputs writes out of bounds), and glibc aborts
in whichever case frees memory next.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardspec.conformance.record import CaseResult
from shardspec.spec.guarantees import broken_guarantee

# Errors that end a launch: the rank's process died, or hung past its watchdog.
CRASH_KINDS = ("died", "timeout")


# The step in which the sharder is built: an error raised there fails every later case of the entry alike.
CONSTRUCT = "construct"
# How much of a constructor's error message says which way it failed.
_MESSAGE_CHARS = 300


def crash_of(result: CaseResult) -> tuple[str, str] | None:
    """How ``result``'s case ended its launch (kind, step), or ("construct", the error) where its sharder
    could not be built; None otherwise."""
    first = result.errors[0] if result.errors else None
    if first is None:
        return None
    if first["kind"] == "raised" and first.get("step") == CONSTRUCT:
        message = str(first.get("message") or "").strip().splitlines()
        text = message[0].replace(f" in step {CONSTRUCT}:", ":", 1) if message else "an error"
        return CONSTRUCT, text[:_MESSAGE_CHARS]
    if first["kind"] not in CRASH_KINDS:
        return None
    return first["kind"], str(first.get("step") or "an unknown step")


def invalid_input(case) -> bool:
    """The case breaks a precondition on purpose (one that must be rejected, or one left undefined), or a
    guarantee its profile's callers keep (a robustness run's case outside the contract: spec/guarantees.py)."""
    if getattr(case, "expect_error", None) is not None:
        return True
    return hasattr(case, "profile") and broken_guarantee(case, case.rules) is not None


def suspect_crash(result: CaseResult) -> bool:
    """Whether a rank of ``result``'s case was killed by a signal (SIGABRT, SIGSEGV, ...) in a case that must
    not be rejected: a crash that an earlier case of the same processes may have caused. A later step of a
    multi-step case is not: it cannot run without the steps before it."""
    case = result.case
    valid = not invalid_input(case) and getattr(case, "continues", None) is None
    first = result.errors[0] if result.errors else {}
    # SIGKILL is the suite's own end of a hung group (or the OOM killer's), not a crash of the case.
    killed = " was killed by " in first.get("message", "") and "SIGKILL" not in first.get("message", "")
    return valid and first.get("kind") == "died" and killed


@dataclass
class CrashBudget:
    max_crashes: int  # 0: never stop an entry
    # (entry, whether the cases' inputs are invalid, how they ended) -> their case ids
    seen: dict[tuple[str, bool, tuple[str, str]], list[str]] = field(default_factory=dict)

    def note(self, result: CaseResult) -> None:
        crash = crash_of(result)
        if crash is not None:
            self.seen.setdefault((result.impl, invalid_input(result.case), crash), []).append(result.case_id)

    def spent(self, label: str, tp: int, invalid: bool = False) -> str | None:
        """Why ``label``'s remaining cases at ``tp`` are not run, or None while they still run. ``invalid``: the
        case's inputs are invalid (:func:`invalid_input`); crashes on such cases stop only cases like it."""
        if self.max_crashes <= 0:
            return None
        for (impl, on_invalid, (kind, step)), cases in self.seen.items():
            if impl == label and len(cases) >= self.max_crashes and (invalid or not on_invalid):
                how = {"died": "a rank died in step ", "timeout": "a rank hung in step "}.get(kind, "")
                how = f"{how}{step}" if how else f"its constructor raised {step}"
                which = "invalid-input cases" if on_invalid else "cases"
                return (
                    f"not run: {len(cases)} {which} of {label} at tp {tp} ended alike ({how}: "
                    f"{', '.join(cases)}); --max-crashes 0 runs every case"
                )
        return None
