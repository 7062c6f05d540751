"""What crosses from a rank to the judge, spelled once: data only, no behaviour.

A rank runs a case's steps and hands over a :class:`StepOutputs` (what the
implementation returned at each step, and every collective it issued as a
:class:`WireCall`) with a rank record (:data:`RANK_RECORD_FIELDS`); the judge
turns those into one :class:`CaseResult` per case. The harness moves these
between processes (its frames and restricted unpickler); the judge imports
this module, the spec and the reference, and nothing of the harness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from shardspec.spec.case import Case
from shardspec.spec.model import SamplerOutput, ShardResult

# The operations of one step, in order; "construct" builds the sharder before the first.
STEPS = ("shard", "all_to_all", "sample", "gather")
STEP_ORDER = ("construct", *STEPS)
# What each step adds to the StepOutputs (the construct step adds nothing).
STEP_OUTPUT = {"shard": "shard", "all_to_all": "full_vocab_logits", "sample": "local_output", "gather": "gathered"}
# A collective issued on any group but the step's TP group (the group of the Communicator the sharder was
# given) is recorded as "<kind> on <group>", e.g. "all_reduce on the default group (world ranks [0, 1, 2, 3])".
OFF_GROUP = " on "
# Float dtypes numpy cannot hold travel (and are hashed) as same-size integers.
NUMPY_CARRIER = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


@dataclass
class WireCall:
    """One collective as the implementation issued it (send buffer cloned)."""

    kind: str  # "all_to_all_single" | "all_gather_into_tensor" | any other call, named by what issued it
    send: torch.Tensor
    output_shape: tuple
    output_split_sizes: list[int] | None = None
    input_split_sizes: list[int] | None = None
    # None: issued on the step's TP group. Otherwise the process group of exactly the TP group's ranks that the
    # implementation built and issued it on (vLLM builds its own), named alike on every rank: a step keeps to
    # one group, and every rank to the same one (INV-WIRE-SEQUENCE).
    group: str | None = None


@dataclass
class StepOutputs:
    shard: ShardResult | None = None
    # all_to_all_logits output, trimmed to nothing: [L_local, tp * shard_width].
    full_vocab_logits: torch.Tensor | None = None
    # The local sampler output that was passed to gather_sampler_output.
    local_output: SamplerOutput | None = None
    gathered: SamplerOutput | None = None
    wire: list[WireCall] = field(default_factory=list)
    # Set when the implementation raised: the step name and the traceback.
    failed_step: str | None = None
    error: BaseException | None = None
    error_traceback: str | None = None
    # Set when the rank went on past the point where it must reject the case's inputs (the suite stopped it).
    not_rejected: str | None = None
    # Names of inputs whose contents changed during the step.
    inputs_modified: list[str] = field(default_factory=list)
    # Fields of earlier steps' gathered results (same sharder) whose contents changed during this step:
    # {"field": "<case id>.gathered.<name>", "row": first changed row or None}.
    held_results_modified: list[dict] = field(default_factory=list)
    # Tensors of the gathered result in the storage of an input: {"field": "gathered.<name>", "input": ...}.
    results_sharing_inputs: list[dict] = field(default_factory=list)
    # Collectives the rank's process groups performed from the shard step to the step's end, as c10d counts
    # them (harness/performed.py); None where not counted (ranks that are threads of one process).
    collectives_performed: int | None = None


# What a rank's last frame of a job carries beside the streamed step parts: StepOutputs fields.
FINAL_FIELDS = (
    "failed_step",
    "error",
    "error_traceback",
    "not_rejected",
    "inputs_modified",
    "held_results_modified",
    "results_sharing_inputs",
    "collectives_performed",
)


@dataclass
class RankTranscript:
    """What one rank of a multi-process run sent for one job, as the harness decoded its frames."""

    steps: list[str] = field(default_factory=list)  # the steps that returned, in order
    # The job's last frame without its outputs: a rank record (RANK_RECORD_FIELDS), a timeout, a failure of
    # the suite itself or the status the implementation exited with (``exited``, sys.exit in a step); None
    # when the rank never sent it.
    final: dict[str, Any] | None = None
    complete: bool = False  # the last frame carried the rank's outputs: the rank finished the case
    # What the returned steps, the wire and (when complete) the last frame hold; None when it could not be
    # decoded (see decode_error).
    outputs: StepOutputs | None = None
    wire: list[WireCall] = field(default_factory=list)  # the calls decoded in issue order, up to one that was not
    undecodable: list[str] = field(default_factory=list)  # frames that could not be read, and why
    # (step, output, why) of outputs that could not be decoded, e.g. ("gather", "gathered.num_nans", ...).
    decode_error: tuple[str | None, str, str] | None = None
    next_step: str = "construct"  # the step the rank was in after the last one it finished
    waiting_in: str | None = None  # the collective its last frame entered (None: it was outside any)
    # Its record announced a look at the step's inputs and result once the peers finished, which never came:
    # the rank died, or was stopped, after its step returned.
    after_step_missing: bool = False


# The record a rank hands over for one case, beside its ``outputs`` (a StepOutputs): which case, rank and
# entry; the implementation's unexpected error and its expected rejection (each {"step", "type",
# "message", "traceback", "in_collective", "precondition_id"} or None); seconds per step; whether the error
# was raised inside a collective; and whether the group's collectives can still be aligned after it.
RANK_RECORD_FIELDS = ("case_id", "rank", "impl", "error", "rejection", "timings", "error_in_collective", "aligned")


@dataclass
class Expectation:
    """What the reference does for a case: per rank, and the unsharded path's output."""

    expected: list[StepOutputs]  # per rank
    replicated: SamplerOutput | None


PASS, FAIL, ERROR, NOT_RUN = "pass", "fail", "error", "not-run"


@dataclass
class CaseResult:
    case: Case
    impl: str
    status: str  # pass | fail | error | not-run
    violations: list[dict[str, Any]] = field(default_factory=list)
    # Per-rank failures of the run itself: raised, hung, or no result.
    errors: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    reason: str = ""  # for not-run
    generated: bool = False
    reproduce: str = ""
    shrunk: str = ""  # what shrinking the case found (see cases/shrink.py), where it was tried
    # Invariants this case judged on every rank (group checkers judge every complete case).
    judged: list[str] = field(default_factory=list)
    # The guarantee of the run's profile the case breaks (spec/guarantees.py), where a robustness run sent
    # it anyway: its result is a robustness finding, never a verdict of conformance. "" for the others.
    outside: str = ""

    @property
    def case_id(self) -> str:
        return self.case.case_id

    @property
    def tp(self) -> int:
        return self.case.tp_size

    def to_json(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "tp": self.tp,
            "impl": self.impl,
            "status": self.status,
            "violations": self.violations,
            "errors": self.errors,
            "timings": self.timings,
            "reason": self.reason,
            "generated": self.generated,
            "reproduce": self.reproduce,
            "shrunk": self.shrunk,
            "judged": self.judged,
            "outside": self.outside,
        }


def not_run(case: Case, impl: str, reason: str) -> CaseResult:
    return CaseResult(case=case, impl=impl, status=NOT_RUN, reason=reason)
