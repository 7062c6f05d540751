"""Known failures keyed by property: an invariant and what a case is, never a generated case's id.

An xfails file (``--xfails-file``) may hold, beside entries keyed by invariant ID or case id, a list
under ``known_failures``. Each item names the invariants it covers and the properties of the cases it
covers; every property given must hold (an item without ``when`` covers every case)::

    known_failures:
      - invariants: [INV-LOGPROBS-MISSING, INV-WIRE-LOGPROBS]
        when: {local_logprobs: absent}
        why: vllm-defect            # or spec-choice (any "<engine>-defect" is a defect)
        reason: the logprob rows of a rank without logprobs are never written
      - invariants: [run-error]      # the case's run failed: a rank raised, hung or died (not-run:
                                     # the case was not run)
        when: {must_reject: true}
        why: spec-choice
        reason: no precondition is checked

Generated case ids change whenever the case selection does; the properties below do not. A property
takes one value or a list of values (any of them matches):

``tp``
    the group size.
``layout``
    some input is passed in this layout (``strided``, ``offset``, ``row-padded``, ``column-slice``).
``edit``
    the case applies this edit of its inputs (spec/case_edits.py), e.g. ``seq-lens-upper-bound-absent``.
``rejects``
    the precondition ID the case violates on purpose.
``batch_dtype``
    some device field of the batch is in this dtype (``int32``), or this field is (``cu_num_logits=int64``).
``present`` / ``absent``
    these optional inputs are all present / all absent: ``grammar``, ``logprobs``,
    ``num_admitted_draft_tokens``, ``num_acceptable_drafts``, ``extension_fields`` (declared, even empty),
    ``seq_lens_cpu_upper_bound`` and ``local_logprobs`` (absent: some rank's local sampler output
    carries no logprobs while the gather asks for them).
``must_reject``, ``empty_batch``, ``rank_owns_nothing``, ``multi_step``, ``generated``
    true or false: the case must be rejected; the batch has no request; some rank owns no request
    under the case's owner rule; the case is a step of a multi-step case; the case was generated.
``case``
    a shell pattern over case ids, for fixtures (their ids are stable): ``tp*-reject-capacity-reqs``.

An item that covered nothing in a run is reported like a stale id entry ("did not fail in this run").
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardspec.conformance.report.model import SPEC_CHOICE
from shardspec.spec.guarantees import extensions_declared

# The invariant name an item uses for a case whose run failed (a rank raised, hung or died).
RUN_ERROR = "run-error"
# ... and for a case that was not run (e.g. left out after several cases of its entry crashed alike).
NOT_RUN = "not-run"

OPTIONAL_INPUTS = (
    "grammar",
    "logprobs",
    "num_admitted_draft_tokens",
    "num_acceptable_drafts",
    "extension_fields",
    "seq_lens_cpu_upper_bound",
    "local_logprobs",
)
_FLAGS = ("must_reject", "empty_batch", "rank_owns_nothing", "multi_step", "generated")
_VALUED = ("tp", "layout", "edit", "rejects", "batch_dtype", "case")
PROPERTIES = (*_VALUED, "present", "absent", *_FLAGS)
_DEFECT_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
_UPPER_BOUND_ABSENT = "seq-lens-upper-bound-absent"  # spec/case_edits.UPPER_BOUND_ABSENT (no torch here)


def _owners(case) -> set[int]:
    """The ranks that own some request of ``case`` under its profile's owner rule."""
    tp, entries = case.tp_size, case.owner_table or {}
    table = {int(s): int(entries.get(int(s), int(s) % tp)) for s in case.slots}  # CL-OWNER-TABLE's initial table
    return set(case.rules.owners(case.slots, tp, table))


def _present(case, name: str) -> bool:
    if name == "grammar":
        return case.grammar_positions is not None
    if name == "logprobs":
        return case.logprobs_dims is not None
    if name == "num_admitted_draft_tokens":
        return case.admitted_drafts is not None
    if name == "num_acceptable_drafts":
        return case.num_acceptable_drafts is not None
    if name == "extension_fields":  # declared, even as no field at all
        return extensions_declared(case)
    if name == "seq_lens_cpu_upper_bound":
        return _UPPER_BOUND_ABSENT not in (case.edits or [])
    # local_logprobs: every rank's local output carries logprobs when the gather asks for them.
    outputs = case.local_outputs
    if case.logprobs_dims is None or not isinstance(outputs, dict):
        return case.logprobs_dims is not None
    return all(
        outputs.get(rank) is not None and outputs[rank].logprob_token_ids is not None for rank in range(case.tp_size)
    )


def _facts(result) -> dict[str, Callable[[], Any]]:
    """What each property is for ``result``'s case (computed when asked)."""
    case = result.case
    return {
        "tp": lambda: {case.tp_size},
        "layout": lambda: set((case.layouts or {}).values()),
        "edit": lambda: set(case.edits or []),
        "rejects": lambda: {case.expect_error} - {None},
        "batch_dtype": lambda: {
            form for name, dtype in (case.batch_dtypes or {}).items() for form in (dtype, f"{name}={dtype}")
        },
        "case": lambda: {case.case_id},
        "must_reject": lambda: case.expect_error is not None,
        "empty_batch": lambda: len(case.slots) == 0,
        "rank_owns_nothing": lambda: len(_owners(case)) < case.tp_size,
        "multi_step": lambda: bool(case.then) or case.continues is not None,
        "generated": lambda: bool(getattr(result, "generated", False)),
    }


@dataclass
class KnownFailure:
    """One item: the invariants it covers, where (property -> values), whether a defect, and why."""

    invariants: tuple[str, ...]
    when: dict[str, Any]
    why: str
    reason: str
    defect: str | None = None  # the defect report's id (examples/<engine>/defects/<id>.md) of a *-defect item
    used: bool = field(default=False, compare=False)

    @property
    def label(self) -> str:
        where = ", ".join(f"{k}={'|'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in self.when.items())
        return f"{'/'.join(self.invariants)} when {where or 'any case'}"

    def covers(self, invariant_id: str, result) -> bool:
        """Whether this item covers ``invariant_id`` ("" for a run error) failing in ``result``."""
        wanted = invariant_id or (NOT_RUN if getattr(result, "status", "") == "not-run" else RUN_ERROR)
        if wanted not in self.invariants or not self.matches(result):
            return False
        self.used = True
        return True

    def matches(self, result) -> bool:
        facts = _facts(result)
        case = result.case
        for name, expected in self.when.items():
            if name == "present":
                if not all(_present(case, n) for n in expected):
                    return False
            elif name == "absent":
                if any(_present(case, n) for n in expected):
                    return False
            elif name in _FLAGS:
                if facts[name]() is not expected:
                    return False
            elif name == "case":
                if not any(fnmatch.fnmatchcase(case.case_id, pattern) for pattern in expected):
                    return False
            elif not facts[name]() & set(expected):
                return False
        return True


def _values(name: str, value: Any) -> Any:
    if name in _FLAGS:
        if not isinstance(value, bool):
            raise ValueError(f"known_failures: {name}: {value!r} is not true or false")
        return value
    values = value if isinstance(value, list) else [value]
    if name == "tp":
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            raise ValueError(f"known_failures: tp: {value!r} is not a group size or a list of them")
        return tuple(values)
    if not values or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"known_failures: {name}: {value!r} is not a name or a list of names")
    if name in ("present", "absent"):
        unknown = [v for v in values if v not in OPTIONAL_INPUTS]
        if unknown:
            raise ValueError(
                f"known_failures: {name}: unknown input {unknown[0]!r} (inputs: {', '.join(OPTIONAL_INPUTS)})"
            )
    return tuple(values)


def parse(items: Any) -> list[KnownFailure]:
    """The ``known_failures`` list of an xfails file; a ValueError naming what is wrong."""
    if not isinstance(items, list):
        raise ValueError("known_failures: not a list of entries")
    out = []
    for index, item in enumerate(items):
        where = f"known_failures[{index}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: not a mapping")
        unknown = set(item) - {"invariant", "invariants", "when", "why", "reason", "defect"}
        if unknown:
            raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        invariants = item.get("invariants", item.get("invariant"))
        invariants = invariants if isinstance(invariants, list) else [invariants]
        if not all(isinstance(i, str) and i for i in invariants):
            raise ValueError(f"{where}: invariants: an invariant ID, {RUN_ERROR}, {NOT_RUN}, or a list of them")
        why = item.get("why")
        if not isinstance(why, str) or not (why == SPEC_CHOICE or why.endswith("defect")):
            raise ValueError(f"{where}: why: {why!r} is neither {SPEC_CHOICE} nor a defect (e.g. vllm-defect)")
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"{where}: reason: say why it fails")
        when = item.get("when") or {}
        if not isinstance(when, dict):
            raise ValueError(f"{where}: when: not a mapping of property -> value")
        for name in when:
            if name not in PROPERTIES:
                raise ValueError(f"{where}: when: unknown property {name!r} (properties: {', '.join(PROPERTIES)})")
        parsed = {name: _values(name, value) for name, value in when.items()}
        defect = item.get("defect")
        if defect is not None and not (isinstance(defect, str) and _DEFECT_ID.fullmatch(defect)):
            raise ValueError(f"{where}: defect: {defect!r} is not a report id (lower-case words joined by '-')")
        if defect is not None and why == SPEC_CHOICE:
            raise ValueError(f"{where}: defect: a {SPEC_CHOICE} item has no defect report")
        out.append(KnownFailure(tuple(invariants), parsed, why, " ".join(reason.split()), defect))
    return out


def stale(items: list[KnownFailure], known_ids: set[str]) -> list[str]:
    """A warning per item that names an unknown invariant or covered nothing in the run."""
    out = []
    for item in items:
        unknown = [i for i in item.invariants if i not in (RUN_ERROR, NOT_RUN) and i not in known_ids]
        if unknown:
            out.append(f"known failure {item.label!r}: {unknown[0]} is no invariant of this run")
        elif not item.used:
            out.append(f"known failure {item.label!r} did not fail in this run (remove it?)")
    return out
