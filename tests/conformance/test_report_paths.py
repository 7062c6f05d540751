"""``--json`` and ``--run-dir`` write only regular files and folders the suite creates, or reports of its own.

Before, ``--json PATH`` replaced whatever PATH was by a rename: a symbolic link (``/dev/stdout``), a device
node (``/dev/full`` became a regular file), a FIFO, any file of the system (CI runs as root); and
``--run-dir /proc/x`` ended with exit 2 and no message.
"""

import json
import os
import pathlib
import shutil

import pytest

from shardspec.conformance.cli import main

DATA = pathlib.Path(__file__).resolve().parent / "data"
RUN = ["--in-process", "--case", "tp2-decode"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_symbolic_link_is_refused_and_left_as_it_is(tmp_path, capsys):
    target = tmp_path / "target.txt"
    target.write_text("not ours\n")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    assert main([*RUN, "--json", str(link)]) == 2
    err = _one_line(capsys)
    assert f"--json: {link} is a symbolic link" in err, err
    assert link.is_symlink() and target.read_text() == "not ours\n"


def test_a_link_to_a_device_is_refused(tmp_path, capsys):
    link = tmp_path / "stdout.json"
    link.symlink_to("/dev/stdout")
    assert main([*RUN, "--json", str(link)]) == 2
    assert "is a symbolic link" in _one_line(capsys)
    assert link.is_symlink()


def test_a_fifo_is_refused(tmp_path, capsys):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    assert main([*RUN, "--json", str(fifo)]) == 2
    assert f"--json: {fifo} is a FIFO, not a regular file" in _one_line(capsys)
    assert fifo.is_fifo()


def test_a_device_is_refused_before_anything_runs(capsys):
    # Refused by the check of the option: nothing is written to, or in place of, the device.
    assert main([*RUN, "--json", "/dev/full"]) == 2
    assert "--json: /dev/full is a character device, not a regular file" in _one_line(capsys)
    assert pathlib.Path("/dev/full").is_char_device()


def test_an_existing_file_that_is_not_a_report_is_refused(tmp_path, capsys):
    other = tmp_path / "passwd"
    other.write_text("root:x:0:0:root:/root:/bin/bash\n")
    assert main([*RUN, "--json", str(other)]) == 2
    err = _one_line(capsys)
    assert f"--json: {other} exists and is not a report of this suite" in err, err
    assert other.read_text().startswith("root:x:0:0")


def test_an_earlier_report_is_replaced(tmp_path, capsys):
    report = tmp_path / "r.json"
    assert main([*RUN, "--json", str(report)]) == 0
    first = json.loads(report.read_text())
    assert first["report"] == "shardspec.conformance"
    assert main([*RUN, "--json", str(report)]) == 0
    assert json.loads(report.read_text())["report"] == "shardspec.conformance"
    assert not [p for p in tmp_path.iterdir() if p.name != "r.json"], list(tmp_path.iterdir())


def test_a_report_of_an_older_version_is_replaced(tmp_path):
    report = tmp_path / "r.json"
    shutil.copy(DATA / "run-v1.json", report)
    assert main([*RUN, "--json", str(report)]) == 0
    assert json.loads(report.read_text())["report"] == "shardspec.conformance"


def test_a_path_that_became_a_link_during_the_run_is_not_followed(tmp_path):
    from shardspec.conformance.output_paths import ReportPathError, write_report

    target = tmp_path / "target.txt"
    target.write_text("not ours\n")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    with pytest.raises(ReportPathError, match="is a symbolic link"):
        write_report(link, "{}")
    assert link.is_symlink() and target.read_text() == "not ours\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "target.txt"]


@pytest.mark.parametrize(
    "path, why",
    [
        ("/proc/shardspec-x", "cannot create the folder"),
        ("/dev/null", "is a character device, not a folder"),
    ],
)
def test_a_run_dir_that_cannot_be_made_is_named(path, why, capsys):
    assert main([*RUN, "--run-dir", path]) == 2
    err = _one_line(capsys)
    assert f"--run-dir: {path} " in err and why in err, err


def test_a_run_dir_that_is_a_link_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    assert main([*RUN, "--run-dir", str(tmp_path / "link")]) == 2
    assert "is a symbolic link" in _one_line(capsys)


def test_a_new_run_dir_is_made_and_kept(tmp_path, capsys):
    run_dir = tmp_path / "a" / "b"
    assert main([*RUN, "--run-dir", str(run_dir)]) == 0
    assert run_dir.is_dir()


def test_a_run_dir_in_use_by_another_run_is_refused(tmp_path, capsys):
    """Two runs started together with one new --run-dir read each other's rank records; now the first
    to claim the folder owns it (its lock file, made new and locked) and the other is refused in one line."""
    import subprocess
    import sys

    run_dir = tmp_path / "shared"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from shardspec.conformance.output_paths import check_run_dir; "
            "check_run_dir(sys.argv[1]); print('claimed', flush=True); sys.stdin.read()",
            str(run_dir),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "claimed\n"
        assert main([*RUN, "--run-dir", str(run_dir)]) == 2
        err = _one_line(capsys)
        assert f"--run-dir: {run_dir} is in use by another run" in err, err
    finally:
        holder.communicate("", timeout=60)
    # The claim ends with its run; the folder it leaves is an earlier run's, never reused.
    assert main([*RUN, "--run-dir", str(run_dir)]) == 2
    assert "is not an empty folder" in _one_line(capsys)


def test_a_run_dir_is_claimed_once_even_by_runs_that_start_together(tmp_path):
    from shardspec.conformance.output_paths import ReportPathError, check_run_dir, release_run_dir

    run_dir = tmp_path / "new"
    assert check_run_dir(run_dir) == run_dir
    with pytest.raises(ReportPathError, match="is in use by another run"):
        check_run_dir(run_dir)
    release_run_dir(run_dir)
    with pytest.raises(ReportPathError, match="is not an empty folder"):
        check_run_dir(run_dir)


def test_a_usage_error_gives_the_run_dir_back(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main([*RUN, "--run-dir", str(run_dir), "--tp-groups", "2"]) == 2  # not with --in-process
    assert "--tp-groups" in _one_line(capsys)
    assert main([*RUN, "--run-dir", str(run_dir)]) == 0  # the corrected command takes the folder


def test_pytests_junit_report_path_obeys_the_rules_of_json(tmp_path, capsys):
    """--junitxml through -- (and in $PYTEST_ADDOPTS): before, a link's target was overwritten."""
    target = tmp_path / "target.txt"
    target.write_text("not ours\n")
    link = tmp_path / "j.xml"
    link.symlink_to(target)
    for extra in ([f"--junitxml={link}"], ["--junit-xml", str(link)]):
        assert main([*RUN, "--", *extra]) == 2
        assert f"-- {extra[0].split('=')[0]}: {link} is a symbolic link" in _one_line(capsys)
    other = tmp_path / "notes.txt"
    other.write_text("mine\n")
    assert main([*RUN, "--", f"--junitxml={other}"]) == 2
    assert f"{other} exists and is not a JUnit XML report" in _one_line(capsys)
    assert link.is_symlink() and target.read_text() == "not ours\n" and other.read_text() == "mine\n"
    junit = tmp_path / "earlier.xml"
    junit.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites></testsuites>')
    assert main([*RUN, "--", f"--junitxml={junit}"]) == 0
    assert "tp2-decode" in junit.read_text() or "shardspec" in junit.read_text()


def test_a_fifo_as_pytests_junit_report_is_refused_not_waited_on(tmp_path):
    import subprocess
    import sys

    fifo = tmp_path / "j.xml"
    os.mkfifo(fifo)
    command = [sys.executable, "-m", "shardspec.conformance", *RUN, "--", f"--junitxml={fifo}"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)  # before: it hung after the run
    assert proc.returncode == 2 and f"{fifo} is a FIFO, not a regular file" in proc.stderr, proc.stderr
