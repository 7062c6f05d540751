"""One table of options (conformance/run/options.py): the command line, the pytest plugin, the variables read
and the guide's list are all made from it, and a run resolves its options and loads its named cases once."""

import collections
import pathlib
import re
import subprocess
import sys

import pytest
from harness_cases import small_cases, write_cases

from shardspec.conformance.cli import build_parser, main
from shardspec.conformance.plugin import pytest_addoption
from shardspec.conformance.run import resolve as resolving
from shardspec.conformance.run.options import OPTIONS, markdown_table
from shardspec.conformance.run.resolve import resolve
from shardspec.conformance.usage import UsageError

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "validate-your-implementation.md"

# A value each variable refuses: a variable added to the table needs one here.
PROFILE_FILE = pathlib.Path(__file__).parent / "data" / "profiles" / "position-owner.yaml"
BAD_VALUES = {
    "SHARDSPEC_IMPL": ",",
    "SHARDSPEC_IMPL_ODD": "a/b",
    "SHARDSPEC_QUICK": "maybe",
    "SHARDSPEC_ROBUSTNESS": "maybe",
    "SHARDSPEC_TP": "0",
    "SHARDSPEC_PROFILE": "vllm-9",
    "SHARDSPEC_PROFILE_FILE": "/no/such/profile.yaml",
    "SHARDSPEC_MAX_EXAMPLES": "many",
    "SHARDSPEC_MIXED_MAX_EXAMPLES": "-1",
    "SHARDSPEC_SEED": "x",
    "SHARDSPEC_XFAILS": "/no/such/xfails.txt",
    "SHARDSPEC_TIMEOUT": "nan",
    "SHARDSPEC_LAUNCHER": "slurm",
    "SHARDSPEC_SIZE_TIER": "huge",
    "SHARDSPEC_MAX_CRASHES": "-1",
    "SHARDSPEC_TP_GROUPS": "0",
}


def _sample(entry, tmp_path) -> list[str]:
    """A valid command-line spelling of ``entry``."""
    if entry.kind == "switch":
        return [entry.flag]
    if entry.choices:
        return [entry.flag, entry.choices[0]]
    values = {"impl": "reference", "impl_odd": "production", "tp": "2", "profile": "vllm-seed"}
    values["xfails_file"] = str(tmp_path / "x.txt")
    values["profile_file"] = str(PROFILE_FILE)
    return [entry.flag, values.get(entry.name, "7")]


def test_every_name_flag_and_variable_is_declared_once():
    for key in ("name", "flag", "plugin_flag", "plugin_dest"):
        values = [getattr(entry, key) for entry in OPTIONS]
        assert len(values) == len(set(values)), key
    variables = [entry.env for entry in OPTIONS if entry.env]
    assert len(variables) == len(set(variables))
    assert all(entry.kind in ("value", "switch", "repeat") for entry in OPTIONS)


def test_the_command_line_flags_are_the_table(tmp_path):
    parser = build_parser()
    assert vars(parser.parse_args([])) == {entry.name: None for entry in OPTIONS}  # nothing defaulted there
    usage = parser.format_usage()
    assert set(re.findall(r"\[(--?[a-z][a-z-]*)", usage)) == {"-h"} | {e.short or e.flag for e in OPTIONS}
    assert set(re.findall(r"--[a-z][a-z-]*", parser.format_help())) >= {e.flag for e in OPTIONS}
    for entry in OPTIONS:
        args = vars(parser.parse_args(_sample(entry, tmp_path)))
        assert args[entry.name] is not None and all(v is None for k, v in args.items() if k != entry.name)
        if entry.env:
            assert f"[env {entry.env}]" in entry.full_help


def test_the_plugin_options_are_the_table():
    declared = []

    class Group:
        def addoption(self, *flags, **kwargs):
            declared.append((flags, kwargs["dest"], kwargs["help"]))

    class Parser:
        def getgroup(self, name, description=""):
            return Group()

    pytest_addoption(Parser())
    assert declared == [((e.plugin_flag,), e.plugin_dest, e.full_help.replace("%", "%%")) for e in OPTIONS]


def test_pytest_help_lists_the_plugin_options_of_the_table(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:xdist", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(re.findall(r"--shardspec-[a-z-]*[a-z]", proc.stdout)) == {e.plugin_flag for e in OPTIONS}


def test_every_variable_of_the_table_is_read_and_checked():
    assert set(BAD_VALUES) == {entry.env for entry in OPTIONS if entry.env}
    for name, value in BAD_VALUES.items():
        with pytest.raises(UsageError, match=re.escape(f"${name}: ")):
            resolve({}, {name: value})


class _Recording(dict):
    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_the_variables_read_are_the_tables_and_only_where_no_option_is_given(tmp_path):
    (tmp_path / "x.txt").write_text("INV-OWNER\n")
    environ = _Recording()
    resolve({}, environ)
    assert environ.read == {entry.env for entry in OPTIONS if entry.env}
    given = {entry.name: _sample(entry, tmp_path)[1:] or [True] for entry in OPTIONS if entry.env}
    environ = _Recording(BAD_VALUES)
    values = resolve({name: value[0] for name, value in given.items()}, environ)
    assert environ.read == set()
    assert values["tp"] == [2] and values["impl"] == ["reference/production"] and values["profile"] == "vllm-seed"


def test_an_empty_variable_counts_as_unset():
    assert resolve({}, {entry.env: "" for entry in OPTIONS if entry.env}) == resolve({}, {})


def test_the_guide_lists_the_table():
    text = GUIDE.read_text()
    block = re.search(r"<!-- options: .*?-->\n(.*?)<!-- end options -->", text, re.S)
    assert block, "the guide has no generated options list"
    assert block.group(1).strip() == markdown_table(), "regenerate it: python -m shardspec.conformance.run.options"


def test_defaults_come_from_the_table():
    values = resolve({}, {})
    assert values["tp"] == [1, 2, 3, 4, 8] and values["max_examples"] == 25 and values["timeout"] == 60.0
    assert values["pg_timeout"] == 60.0 and values["impl"] == ["reference"] and values["launcher"] == "auto"
    quick = resolve({}, {"SHARDSPEC_QUICK": "1", "SHARDSPEC_TIMEOUT": "5"})
    assert quick["tp"] == [2, 4] and quick["max_examples"] == 10 and quick["pg_timeout"] == 5.0
    assert quick["mixed_max_examples"] == 10  # never more than --max-examples
    mixed = resolve({"impl": "reference,production/reference", "impl_odd": "production"}, {})
    assert mixed["impl"] == ["reference/production", "production/reference"]
    assert resolve({"in_process_group": "torch-threads"}, {})["in_process"] is True


def test_cuda_in_process_without_a_gpu_is_a_usage_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available")
    assert main(["--in-process-device", "cuda", "--fixtures-only"]) == 2
    assert "--in-process-device cuda: no CUDA device is available" in capsys.readouterr().err


def test_a_plugin_option_after_double_dash_is_refused(capsys):
    assert main(["--", "--shardspec-tp", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "-- --shardspec-tp: give it before -- as --tp" in err and len(err.splitlines()) == 1, err


def _counting(monkeypatch):
    from shardspec.conformance.run import collect, session

    counts = collections.Counter()

    def counted(module, name, key):
        original = getattr(module, name)

        def call(*args, **kwargs):
            counts[key] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    counted(resolving, "resolve", "resolve")
    counted(resolving, "collect_cases", "collect_cases")
    counted(session, "collect_cases", "collect_cases")
    counted(collect, "load_case_file", "load_case_file")
    return counts


def test_a_command_line_run_resolves_once_and_loads_its_named_cases_once(tmp_path, monkeypatch):
    files = write_cases(small_cases(2)[:1], tmp_path)
    counts = _counting(monkeypatch)
    monkeypatch.chdir(tmp_path)  # pytest's cache goes there
    assert main(["--in-process", "--run-dir", str(tmp_path / "run"), "--case-file", files[0]]) == 0
    assert counts == {"resolve": 1, "collect_cases": 1, "load_case_file": 1}


def test_a_plugin_run_resolves_once_and_loads_its_named_cases_once(tmp_path, monkeypatch):
    from shardspec.conformance.cli import pytest_command

    files = write_cases(small_cases(2)[:1], tmp_path)
    counts = _counting(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the suite's plugin alone, as the command line runs it
    args = ["--shardspec-in-process", "--shardspec-run-dir", str(tmp_path / "run"), "--shardspec-case-file", files[0]]
    assert pytest.main(pytest_command(args)) == 0
    assert counts == {"resolve": 1, "collect_cases": 1, "load_case_file": 1}
