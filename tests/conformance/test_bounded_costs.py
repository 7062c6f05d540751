"""What careless input costs is bounded: a constructor that always fails, a huge xfails file, and ``upstream``
pointed at a FIFO or a wheel with a huge member.

Before, a constructor that always raised cost a relaunch and a traceback per case (45 s and 2,000 lines at
one tp: the crash breaker counted only deaths and hangs); a 6.7 MB xfails file turned a one-case run into
160 s and 87k warning lines; ``upstream`` hung on a FIFO and read a wheel member of any size into memory.
"""

import contextlib
import json
import os
import subprocess
import sys
import threading
import zipfile
from dataclasses import replace

import pytest
from harness_cases import small_cases, write_cases

from shardspec.conformance.cli import main
from shardspec.conformance.harness.crashes import CrashBudget, crash_of
from shardspec.conformance.record import ERROR, CaseResult
from shardspec.spec.case import Case

RAISING = "faulty_sharders:RaisingConstructor"


def _raised(case_id: str, message: str, step: str = "construct") -> CaseResult:
    case = Case(case_id, 2, slots=[0], num_logits_per_req=[1])
    error = {"rank": 0, "kind": "raised", "step": step, "message": f"RuntimeError in step {step}: {message}"}
    return CaseResult(case, "x", ERROR, errors=[error])


def test_a_constructor_that_fails_alike_spends_the_budget():
    budget = CrashBudget(max_crashes=2)
    budget.note(_raised("a", "no GPU"))
    budget.note(_raised("b", "out of memory"))  # another way to fail
    budget.note(_raised("c", "no GPU", step="gather"))  # not the constructor
    assert budget.spent("x", 2) is None
    budget.note(_raised("d", "no GPU"))
    reason = budget.spent("x", 2)
    assert reason is not None, budget.seen
    assert "2 cases of x at tp 2 ended alike (its constructor raised RuntimeError" in reason, reason
    assert "no GPU" in reason and "a, d" in reason, reason
    assert crash_of(_raised("e", "x", step="shard")) is None


def _cases(count: int) -> list[Case]:
    base = small_cases(2)[0]
    return [replace(base, case_id=f"ctor-{n}") for n in range(count)]


@pytest.mark.parametrize("mode", [[], ["--in-process"]], ids=["processes", "in-process"])
def test_a_constructor_that_always_raises_ends_its_entry_after_max_crashes(tmp_path, mode, plugins_on_path, capsys):
    files = write_cases(_cases(6), tmp_path)
    report = tmp_path / "r.json"
    args = ["--impl", f"{RAISING},reference", "--max-crashes", "2", "--no-shrink", "--json", str(report), *mode]
    args += [arg for path in files for arg in ("--case-file", path)]
    assert main(args) == 1
    out = capsys.readouterr().out
    sections = {s["implementation"]: s["cases"] for s in json.loads(report.read_text())["sections"]}
    statuses = [c["status"] for c in sections[RAISING]]
    assert statuses == ["error", "error"] + ["not-run"] * 4, statuses
    reason = sections[RAISING][2]["reason"]
    assert "ended alike (its constructor raised RuntimeError" in reason and "deliberate failure" in reason, reason
    assert {c["status"] for c in sections["reference"]} == {"pass"}
    assert out.count("  launch ") <= 4, out  # two for the failing entry at the most, one for the reference
    assert out.count("Traceback") <= 4, out.count("Traceback")  # two cases, two ranks each


def test_an_xfails_file_too_large_is_refused(tmp_path, capsys):
    from shardspec.conformance.report.xfails import MAX_XFAILS_BYTES

    path = tmp_path / "xfails.txt"
    path.write_text("INV-OWNER\n" * (MAX_XFAILS_BYTES // 10 + 1))
    assert main(["--xfails-file", str(path), "--in-process", "--case", "tp1-decode"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--xfails-file: {path}: " in err and f"more than an xfails file may have ({MAX_XFAILS_BYTES})" in err, err


def test_an_xfails_file_with_too_many_entries_is_refused(tmp_path, capsys):
    from shardspec.conformance.report.xfails import MAX_XFAILS_ENTRIES

    path = tmp_path / "xfails.txt"
    path.write_text("".join(f"case-{n}\n" for n in range(MAX_XFAILS_ENTRIES + 1)))
    assert main(["--xfails-file", str(path), "--in-process", "--case", "tp1-decode"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{MAX_XFAILS_ENTRIES + 1} entries, more than {MAX_XFAILS_ENTRIES}" in err, err


def test_an_xfails_file_that_is_a_fifo_is_refused(tmp_path, capsys):
    path = tmp_path / "xfails.txt"
    os.mkfifo(path)
    with _unblocked(path):
        assert main(["--xfails-file", str(path), "--in-process", "--case", "tp1-decode"]) == 2
    assert "is a FIFO, not a regular file" in capsys.readouterr().err


@contextlib.contextmanager
def _unblocked(fifo, after_s: float = 10.0):
    """Opens ``fifo`` for writing, again and again after a while, so that a reader blocked on it (the code
    before the change) sees its end instead of waiting for ever."""
    done = threading.Event()

    def write_ends():
        while not done.wait(after_s):
            open(fifo, "w").close()  # returns once a reader opened it

    writer = threading.Thread(target=write_ends, daemon=True)
    writer.start()
    try:
        yield
    finally:
        done.set()
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # a writer waiting in open returns
        writer.join(timeout=5)


def _upstream(*args, timeout=60):
    command = [sys.executable, "-m", "shardspec.conformance", "upstream", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_upstream_refuses_a_fifo_instead_of_waiting_on_it(tmp_path):
    fifo = tmp_path / "batch_shard.py"
    os.mkfifo(fifo)
    with _unblocked(fifo):
        proc = _upstream(fifo, timeout=40)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{fifo}: is a FIFO, not a regular file" in proc.stderr, proc.stderr


def test_upstream_refuses_a_wheel_member_above_its_cap(tmp_path):
    from shardspec.conformance.upstream.source import MAX_MEMBER_BYTES, SHARD_FILE

    wheel = tmp_path / "vllm-0.33.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("vllm-0.33.0.dist-info/METADATA", "Name: vllm\nVersion: 0.33.0\n")
        archive.writestr(SHARD_FILE, "#" * (MAX_MEMBER_BYTES + 1))
    proc = _upstream(wheel)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{SHARD_FILE} is {MAX_MEMBER_BYTES + 1} bytes unpacked, more than {MAX_MEMBER_BYTES}" in proc.stderr, (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_upstream_refuses_a_file_above_its_cap(tmp_path):
    from shardspec.conformance.upstream.source import MAX_MEMBER_BYTES

    path = tmp_path / "batch_shard.py"
    path.write_text("#" * (MAX_MEMBER_BYTES + 1))
    proc = _upstream(path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{MAX_MEMBER_BYTES + 1} bytes, more than {MAX_MEMBER_BYTES}" in proc.stderr, proc.stderr
