"""The guide's commands, as written: those marked runnable are run, and every line that installs shardspec
keeps the user's torch.

A block of docs/validate-your-implementation.md preceded by ``<!-- guide-test: run -->`` is run from the
repository root, each command as the guide prints it; the run is kept small by the suite's own variables
(``SHARDSPEC_TP``, ``SHARDSPEC_MAX_EXAMPLES``), which a command's options would override. A block preceded by
``<!-- guide-test: install -->`` holds install lines, checked as text (nothing is installed).

Before, the guide's own example failed INV-REJECT-INVALID at tp 1, and its ``pip install -e ".[test]"``
pulled the newest CUDA torch (2.14.1, 5.5 GB) that nothing was tested with.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "validate-your-implementation.md"
# Every file that tells a user how to install shardspec.
INSTALL_DOCS = [GUIDE, ROOT / "README.md", ROOT / "noxfile.py"]
MARKED = re.compile(r"<!-- guide-test: (run|install) -->\n```(?:bash|sh)\n(.*?)```", re.S)
# How the guide keeps the torch a user has: pinned to the installed version, read from torch itself.
KEEP_TORCH = "\"torch==$(python -c 'import torch; print(torch.__version__)')\""
# The suite's variables that keep a run of a guide command small: one group size, one generated case. Size 2:
# the default profile (vllm-0.34) builds no sharder of one rank, so a tp 1 run would judge that refusal alone.
SMALL = {"SHARDSPEC_TP": "2", "SHARDSPEC_MAX_EXAMPLES": "1"}


def blocks(kind: str) -> list[str]:
    return [text for marked, text in MARKED.findall(GUIDE.read_text()) if marked == kind]


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


ENGINE_PROFILE = ROOT / "examples" / "engine_profile" / "engine.yaml"


def test_the_guides_profile_file_is_the_one_its_command_runs():
    """The engine profile the guide prints is the file of examples/ that its marked command passes with
    --profile-file, and that file loads: it extends a bundled profile and changes two rules."""
    from shardspec.spec.profiles import load_profile_file, rules_of

    shown = re.search(r"```yaml\n(# examples/engine_profile/engine.yaml\n.*?)```", GUIDE.read_text(), re.S)
    assert shown and shown.group(1) == ENGINE_PROFILE.read_text()
    assert any(f"--profile-file {ENGINE_PROFILE.relative_to(ROOT)}" in c for b in blocks("run") for c in commands(b))
    name = load_profile_file(ENGINE_PROFILE).name
    mine, parent = rules_of(name).as_dict(), rules_of("vllm-0.34").as_dict()
    assert {k: v for k, v in mine.items() if parent[k] != v} == {
        "seq_lens_upper_bound": "optional",
        "construction": "any_group",
    }


def test_the_guide_marks_commands_to_run_and_to_install():
    assert blocks("run") and blocks("install"), "the markers of the guide's commands are gone"


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for block in blocks("run") for c in commands(block)])
def test_a_runnable_command_of_the_guide_passes_as_written(command):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SHARDSPEC_")}
    environ.update(SMALL)
    environ["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), environ.get("PATH", "")])
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command}\n{output[-4000:]}"
    assert "PASSED" in output, output[-2000:]


def _installs_shardspec(line: str) -> bool:
    return bool(re.search(r"pip install\b.*-e\s+[\"']?\.(\[|[\"'\s]|$)", line))


def test_the_guides_install_lines_install_what_its_commands_run():
    """The guide runs production (Triton): each of its lines that installs shardspec installs the impl extra.
    Before, it installed ".[test]" alone."""
    runs_production = any(re.search(r"--impl \S*production", c) for b in blocks("run") for c in commands(b))
    installs = [line for line in GUIDE.read_text().splitlines() if _installs_shardspec(line)]
    assert runs_production and installs
    for line in installs:
        extras = re.search(r"-e\s+[\"']?\.\[([^\]]*)\]", line)
        assert extras and "impl" in extras.group(1).split(","), line


def test_every_install_line_keeps_the_users_torch():
    found = []
    for path in INSTALL_DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _installs_shardspec(line):
                found.append((path.name, number, line))
                # the installed version, a version of its own, or a constraints file (-c) that pins one
                pinned = KEEP_TORCH in line or re.search(r"\btorch==\d+\.\d+\.\d+|\s-c\s", line)
                assert pinned, f"{path.name}:{number}: installs shardspec without pinning torch: {line.strip()}"
    assert any(name == GUIDE.name for name, _, _ in found), found
    assert any(KEEP_TORCH in line for block in blocks("install") for line in commands(block)), blocks("install")


def test_the_pin_reads_the_installed_torch():
    """What the install line's $(...) prints is the version of the torch this environment has."""
    inner = re.search(r"\$\((.*)\)", KEEP_TORCH).group(1)
    printed = subprocess.run(
        ["bash", "-c", inner.replace("python ", shlex.quote(sys.executable) + " ", 1)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    assert printed == torch.__version__
