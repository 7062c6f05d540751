"""The repository layout keeps its promises: every package folder is packaged (the layering: test_import_graph.py)."""

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


def test_the_package_version_is_the_distributions():
    import shardspec

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert shardspec.__version__ == project["version"]
