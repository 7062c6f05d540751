"""The cost of an implementation that crashes: after a few of its cases end alike, the rest are not run.

A case whose rank dies or hangs ends its launch, and the suite relaunches
the group for the cases after it: one relaunch per crash, and a hang costs
the whole case timeout first. When ``max_crashes`` cases of one entry at one
group size have ended the same way (the same kind of end in the same step),
that entry's remaining cases there are reported not run, with that reason,
instead of paying for each again (like pytest's ``--maxfail``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardspec.conformance.record import CaseResult

# Errors that end a launch: the rank's process died, or hung past its watchdog.
CRASH_KINDS = ("died", "timeout")


def crash_of(result: CaseResult) -> tuple[str, str] | None:
    """How ``result``'s case ended its launch (kind, step), or None when it did not."""
    first = result.errors[0] if result.errors else None
    if first is None or first["kind"] not in CRASH_KINDS:
        return None
    return first["kind"], str(first.get("step") or "an unknown step")


@dataclass
class CrashBudget:
    max_crashes: int  # 0: never stop an entry
    seen: dict[tuple[str, tuple[str, str]], list[str]] = field(default_factory=dict)

    def note(self, result: CaseResult) -> None:
        crash = crash_of(result)
        if crash is not None:
            self.seen.setdefault((result.impl, crash), []).append(result.case_id)

    def spent(self, label: str, tp: int) -> str | None:
        """Why ``label``'s remaining cases at ``tp`` are not run, or None while they still run."""
        if self.max_crashes <= 0:
            return None
        for (impl, (kind, step)), cases in self.seen.items():
            if impl == label and len(cases) >= self.max_crashes:
                how = "a rank died" if kind == "died" else "a rank hung"
                return (
                    f"not run: {len(cases)} cases of {label} at tp {tp} ended alike ({how} in step {step}: "
                    f"{', '.join(cases)}); --max-crashes 0 runs every case"
                )
        return None
