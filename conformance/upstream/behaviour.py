"""``python -m shardspec.conformance upstream PATH --behaviour``: which profile's rules does vLLM's sharder follow?

The field check (drift.py) reads the code; this runs it. The sharder (``installed``: the vllm package,
through examples/vllm; a ``batch_shard.py``: that file, through examples/upstream_vllm's stand-ins) runs a
few valid generated cases, an empty batch and a batch whose slots and positions name different owners,
under each bundled profile, one process per rank, judged by the suite. verdicts.py then reads
which values of each rule of spec/rules.py the run is consistent with and which bundled profile matches.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

import torch

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.harness.group import Job
from shardspec.conformance.harness.multiprocess import LaunchOptions, run_jobs_multiprocess
from shardspec.conformance.judge.verdicts import Judge
from shardspec.conformance.replay import suite_judge
from shardspec.conformance.upstream.verdicts import report
from shardspec.spec.case import Case
from shardspec.spec.profiles import PROFILES, behaviour_profiles, rules_of
from shardspec.spec.rules import Rules

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
TP_SIZES = (2, 3)
CASES_PER_TP = 3
# Larger generated batches cost seconds each in Triton's interpreter and tell the rules apart no better.
MAX_REQUESTS = 16
# How long loading the sharder (an import of vLLM, or the file) may take in a child process before it is
# loaded here: a file that blocks at import is then a one-line error, not a run that hangs with no output.
LOAD_LIMIT_S = 120.0


class BehaviourInputError(Exception):
    """Bad input (no such file, vLLM not installed): the one-line message is printed and the exit code is 2."""


@dataclass
class Subject:
    label: str
    impl: str  # --impl of the suite
    folder: pathlib.Path  # the adapter's folder, put on PYTHONPATH
    env: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def environment(self):
        """The adapter importable, here and in the rank processes this one starts (the fork launcher's ranks
        import it from this process's path), and the file named; put back as it was afterwards."""
        saved_env, saved_path = dict(os.environ), list(sys.path)
        os.environ.update(self.env)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.folder), os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, str(self.folder))
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            sys.path[:] = saved_path

    def batch_shard(self):
        """The module of vLLM's sharder, loaded in this process, for its API (once a child process loaded it
        within :data:`LOAD_LIMIT_S`)."""
        self._loads_in_time()
        try:
            if "shardspec_vllm" in self.impl:
                import shardspec_vllm  # the adapter, importable only within self.environment()

                return shardspec_vllm.batch_shard
            import shardspec_upstream  # the adapter, importable only within self.environment()

            return shardspec_upstream.load_upstream(self.env["SHARDSPEC_UPSTREAM_FILE"])
        except Exception as exc:  # an import of vLLM or a load of the file: its first line
            raise BehaviourInputError(f"{self.label}: cannot be loaded: {type(exc).__name__}: {exc}") from None

    def _loads_in_time(self) -> None:
        if "shardspec_vllm" in self.impl:
            load = "import shardspec_vllm"
        else:
            path = self.env["SHARDSPEC_UPSTREAM_FILE"]
            load = f"import shardspec_upstream; shardspec_upstream.load_upstream({path!r})"
        child = subprocess.Popen(
            [sys.executable, "-c", load],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # what the load starts ends with it
        )
        try:
            child.wait(timeout=LOAD_LIMIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise BehaviourInputError(
                f"{self.label}: loading it did not finish within {LOAD_LIMIT_S:g}s (does it block at import?)"
            ) from None
        # Loaded, or failed: the load here says how (its error's first line).


def subject_of(arg: str) -> Subject:
    if arg == "installed":
        if importlib.util.find_spec("vllm") is None:
            raise BehaviourInputError("installed: no vllm package is installed (importlib finds none)")
        return Subject("the installed vllm package", "shardspec_vllm:make_sharder", _adapter("vllm"))
    path = pathlib.Path(arg)
    if not path.is_file() or path.suffix != ".py":
        raise BehaviourInputError(f"{arg}: no such file (--behaviour runs installed or a batch_shard.py)")
    env = {"SHARDSPEC_UPSTREAM_FILE": str(path.resolve())}
    return Subject(str(path), "shardspec_upstream:make_sharder", _adapter("upstream_vllm"), env)


def _adapter(name: str) -> pathlib.Path:
    folder = EXAMPLES / name
    if not folder.is_dir():
        raise BehaviourInputError(f"{folder}: no such adapter (--behaviour runs from a checkout of shardspec)")
    return folder


# ------------------------------------------------------------------ the cases


def _plain(case: Case) -> Case | None:
    """``case`` with every input in its plain form (contiguous, the default dtypes, no edits or extension
    fields), or None for a case that must be rejected or whose ranks' outputs leave logprobs out: what every
    release handles, so that what fails is a rule, not one of its known defects."""
    case = replace(case, layouts={}, edits=[], extensions={}, batch_dtypes={})
    outputs = case.local_outputs
    local_logprobs = outputs == "toy" or all(o.logprob_token_ids is not None for o in outputs.values())
    small = 0 < len(case.slots) <= MAX_REQUESTS
    return case if case.expect_error is None and small and local_logprobs else None


def drift_cases(profiles: list[Rules], tp_sizes=TP_SIZES, per_tp: int = CASES_PER_TP) -> list[Case]:
    """``per_tp`` plain generated cases per group size and an empty batch, under each of ``profiles``."""
    # hypothesis (the test extra) draws the generated cases: the drift check and --help need none
    from shardspec.conformance.cases.strategies import generate_cases

    cases = []
    for rules in profiles:
        profile = rules.profile
        for tp in tp_sizes:
            plain = [p for p in map(_plain, generate_cases(tp, per_tp * 2, 0, rules, fill_gaps=False)) if p]
            cases += [replace(c, case_id=f"{profile}-{c.case_id}") for c in plain[:per_tp]]
        empty = Case(f"{profile}-empty-tp2", 2, slots=[], num_logits_per_req=[], rules=rules, logprobs_dims=None)
        # Every request's slot and batch position name different owners: the owner rules are told apart.
        crossed = Case(f"{profile}-crossed-tp2", 2, slots=[1, 0, 3, 2], num_logits_per_req=[1, 2, 1, 1], rules=rules)
        cases += [empty, crossed]
    return cases


# ------------------------------------------------------------------ the run


class ProbingJudge(Judge):
    """The suite's judge, keeping what rank 0's shard step returned for each case (the plan is replicated)."""

    def __init__(self, expect, device, seen):
        super().__init__(expect, device)
        self.seen = seen

    def at(self, device):  # the harness moves the judge to the ranks' device: the plans go on being kept
        return self if device == self.device else ProbingJudge(self.expect, device, self.seen)

    def transcripts(self, case, label, transcripts, ended=None, culprit=None):
        shard = getattr(getattr(transcripts.get(0), "outputs", None), "shard", None)
        if shard is not None:
            self.seen[case.case_id] = {
                "metadata": shard.metadata,
                "local_idx_dtype": shard.local_batch.idx_mapping.dtype,
                "batch_idx_dtype": self.inputs(case).batch.idx_mapping.dtype,
            }
        return super().transcripts(case, label, transcripts, ended, culprit)


def _probing_judge():
    """A :class:`ProbingJudge` of the suite's expectations, and what it keeps."""
    base = suite_judge()
    judge = ProbingJudge(base.expect, base.device, {})
    return judge, judge.seen


def run_cases(subject: Subject, cases: list[Case]) -> tuple[list, dict[str, dict]]:
    """Every case run by ``subject`` one process per rank: the suite's results, and rank 0's plan per case."""
    judge, seen = _probing_judge()
    results, servers = [], {}
    with tempfile.TemporaryDirectory(prefix="shardspec-drift-") as run_dir:
        options = LaunchOptions(pathlib.Path(run_dir), case_timeout_s=60, pg_timeout_s=30, max_crashes=0)
        try:
            for tp in sorted({c.tp_size for c in cases}):
                jobs = [Job(ImplChoice(subject.impl), c) for c in cases if c.tp_size == tp]
                options = replace(options, run_dir=pathlib.Path(run_dir) / f"tp{tp}")
                results += run_jobs_multiprocess(jobs, tp, options, judge, log=lambda line: None, servers=servers)
        finally:
            for server in servers.values():
                server.close()
    return results, seen


# ------------------------------------------------------------------ the check


@dataclass
class Run:
    """What the sharder did: the cases, the suite's results, rank 0's plan per case, the module it ran."""

    label: str
    cases: list[Case]
    results: list
    seen: dict[str, dict]
    batch_shard: object
    seconds: float


def run(arg: str, profiles: list[Rules]) -> Run:
    """``arg``'s sharder run on :func:`drift_cases` under ``profiles``; BehaviourInputError for bad input."""
    subject = subject_of(arg)
    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        subject.env["TRITON_INTERPRET"] = "1"  # the kernels run in Triton's interpreter on the CPU
    with subject.environment():
        batch_shard = subject.batch_shard()
        started = time.monotonic()
        cases = drift_cases(profiles)
        results, seen = run_cases(subject, cases)
    return Run(subject.label, cases, results, seen, batch_shard, round(time.monotonic() - started, 1))


def visible_profiles(hidden: tuple[str, ...] = ()) -> list[Rules]:
    """The rules of the bundled profiles that set a rule of the sharder's behaviour, but those ``hidden``
    (--hide-profile: names, resolved here once)."""
    unknown = [p for p in hidden if p not in PROFILES]
    if unknown:
        raise BehaviourInputError(f"--hide-profile {unknown[0]}: no such bundled profile ({', '.join(PROFILES)})")
    profiles = [rules_of(p) for p in behaviour_profiles() if p not in hidden]
    if not profiles:
        raise BehaviourInputError("--hide-profile hides every bundled profile: nothing to run the cases under")
    return profiles


def check(arg: str, touched: set[tuple[str, str]], hidden: tuple[str, ...] = ()) -> dict:
    """``arg`` (``installed`` or a batch_shard.py) run under every bundled profile but ``hidden``, judged."""
    profiles = visible_profiles(hidden)
    return report(run(arg, profiles), profiles, touched)
