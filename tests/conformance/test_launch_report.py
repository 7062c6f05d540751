"""What the report says of a launch that did not run: the first error of its log, in the terminal and the JSON."""

from shardspec.conformance.harness.launch import first_error
from shardspec.conformance.report.model import parse_report
from shardspec.conformance.report.summary import describe_launch_failures

LOG = """W1206 torch warning before the ranks start
Traceback (most recent call last):
  File "worker.py", line 1, in main
    expectations = load_expectations(path)
  File "expectations.py", line 2, in load_expectations
    raise DecodeError(why)
shardspec.DecodeError: expected[0].wire[0].send: AttributeError: 'torch.device' object has no attribute 'startswith'
Traceback (most recent call last):
  File "worker.py", line 1, in main
rank 1's own copy of the same error
"""


def test_the_first_error_is_the_first_traceback_to_its_exception():
    error = first_error(LOG)
    assert error.splitlines()[0] == "Traceback (most recent call last):"
    assert error.splitlines()[-1].startswith("shardspec.DecodeError: expected[0].wire[0].send")
    assert "rank 1's own copy" not in error and "torch warning" not in error


def test_a_long_traceback_keeps_its_first_frames_and_its_exception():
    frames = [f'  File "f{i}.py", line {i}, in f{i}' for i in range(40)]
    error = first_error("\n".join(["Traceback (most recent call last):", *frames, "ValueError: at last"]), lines=10)
    rows = error.splitlines()
    assert (
        len(rows) == 10 and rows[0].startswith("Traceback") and rows[3] == "  ..." and rows[-1] == "ValueError: at last"
    )


def test_a_log_without_a_traceback_gives_its_last_lines():
    assert first_error("\n".join(f"line {i}" for i in range(40)), lines=3) == "line 37\nline 38\nline 39"


def test_the_terminal_lists_each_launch_with_its_error_and_log():
    failure = {"tp": 2, "launch": 1, "reason": "the group did not start (exit 1)", "log": "/r/tp2/launch0.log"}
    lines = "\n".join(describe_launch_failures([{**failure, "error": first_error(LOG)}]))
    assert "  tp 2, launch 1: the group did not start (exit 1)" in lines
    assert "      shardspec.DecodeError: expected[0].wire[0].send" in lines
    assert "    full log: /r/tp2/launch0.log" in lines
    assert describe_launch_failures([]) == []


def test_the_json_model_reads_them_and_older_reports_have_none():
    failure = {"tp": 2, "launch": 1, "reason": "r", "log": "l", "error": "e"}
    report = parse_report({"sections": [], "launch_failures": [failure]}, "r.json", "r")
    assert report.launch_failures == [{**failure, "tp": "2", "launch": "1"}]
    assert parse_report({"sections": []}, "r.json", "r").launch_failures == []


TORCHRUN_LOG = """E1206 06:04:20 torch/distributed/elastic/multiprocessing/api.py failed (exitcode: -11) local_rank: 1
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 10164)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-06_06:04:20
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 10165)
  error_file: <N/A>
"""


def test_torchrun_names_the_rank_that_failed_first_and_how():
    from shardspec.conformance.harness.launch import torchrun_culprit

    assert torchrun_culprit(TORCHRUN_LOG) == {"rank": 1, "how": "was killed by SIGSEGV"}
    assert torchrun_culprit(TORCHRUN_LOG.replace("-11 (pid", "3 (pid")) == {"rank": 1, "how": "exited with status 3"}
    assert torchrun_culprit("no root cause printed") is None
