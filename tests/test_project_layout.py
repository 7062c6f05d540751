"""The repository layout keeps its promises: packaging and layering."""

import ast
import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _packages_on_disk():
    """Every folder with an __init__.py below a mapped folder, as a dotted name."""
    found = set()
    for name, folder in _pyproject()["tool"]["setuptools"]["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(base).parts)))
    return found


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    missing = _packages_on_disk() - listed
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_listed_packages_exist():
    missing = set(_pyproject()["tool"]["setuptools"]["packages"]) - _packages_on_disk()
    assert not missing, f"listed in pyproject.toml but no folder with __init__.py: {sorted(missing)}"


def _imported_modules(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def _forbidden_imports(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in (ROOT / folder).rglob("*.py")
        for module in _imported_modules(path)
        if module.startswith(forbidden)
    ]


def test_impl_imports_neither_reference_nor_conformance():
    offenders = _forbidden_imports("impl", ("shardspec.reference", "shardspec.conformance"))
    assert not offenders, offenders


def test_reference_does_not_import_conformance_or_impl():
    offenders = _forbidden_imports("reference", ("shardspec.conformance", "shardspec.impl"))
    assert not offenders, offenders


def test_the_package_version_is_the_distributions():
    import shardspec

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert shardspec.__version__ == project["version"]


def test_the_judge_imports_only_the_record_the_spec_and_the_reference():
    """What a rank hands the judge crosses as conformance/record.py's data; the judge never reaches into how
    ranks run (the harness) or into the runner that wires the two."""
    allowed = ("shardspec.conformance.judge", "shardspec.conformance.record", "shardspec.spec", "shardspec.reference")
    offenders = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in (ROOT / "conformance" / "judge").rglob("*.py")
        for module in _imported_modules(path)
        if module.startswith("shardspec") and not module.startswith(allowed)
    ]
    assert not offenders, offenders


def test_the_harness_never_imports_the_judge():
    """Groups receive the judge as an object (Group.run(jobs, tp, judge, on_result)): how ranks run stays apart
    from what is checked."""
    offenders = _forbidden_imports("conformance/harness", ("shardspec.conformance.judge",))
    assert not offenders, offenders


def test_fixtures_and_cases_never_import_the_harness():
    """The goldens run the reference through the engine's step, and cases are generation and bounds: neither
    reaches into how the suite runs ranks."""
    offenders = _forbidden_imports("fixtures", ("shardspec.conformance",))
    offenders += _forbidden_imports("conformance/cases", ("shardspec.conformance.harness",))
    assert not offenders, offenders


def test_cases_never_import_the_command_line():
    """Cases are generation and bounds; a case named on the command line is checked against usage.py's
    bounds and error, so that the options table, the command line and the plugin sit above the cases."""
    offenders = _forbidden_imports(
        "conformance/cases",
        ("shardspec.conformance.run", "shardspec.conformance.cli", "shardspec.conformance.plugin"),
    )
    assert not offenders, offenders


def test_usage_is_a_leaf():
    """usage.py holds what the options and the cases both need; importing anything of shardspec there would
    bring back the arrow it exists to remove."""
    offenders = [
        module for module in _imported_modules(ROOT / "conformance" / "usage.py") if module.startswith("shardspec")
    ]
    assert not offenders, offenders
