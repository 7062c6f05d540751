"""The pages of the HTML reports (html.py's site, releases.py's page): their templates, and how a page is
written."""

from __future__ import annotations

import os
import pathlib
import stat
import tempfile

from shardspec.conformance.report.model import ReportError

TEMPLATES = pathlib.Path(__file__).parent / "templates"


def environment(**options):
    """The templates' jinja2 environment (escaping on, an undefined name an error); ``options``: jinja2's."""
    import jinja2  # the report extra (shardspec[report]): a run of the suite needs none

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined, **options
    )


def write_page(path: pathlib.Path, html: str) -> None:
    """A page of the site: a new file, or the regular file an earlier run wrote, never through a link."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    if found is not None and stat.S_ISLNK(found.st_mode):
        raise ReportError(f"{path} is a symbolic link; the pages are written only as regular files")
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise ReportError(f"{path} exists and is not a regular file")
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(html)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        pathlib.Path(partial).unlink(missing_ok=True)
        raise
