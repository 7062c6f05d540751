"""``python -m shardspec.conformance upstream PATH``: does vLLM's batch_shard.py still match the spec?

PATH: a vLLM source tree, a vLLM wheel (read from the zip), one batch_shard.py, or ``installed`` (found
with importlib.util.find_spec). The file is read by AST, never imported. Types come from the code:
annotations (``input_batch: InputBatch``, ``local_output: SamplerOutput | None``), constructors,
``replace(x, ...)``, and fields whose spec entry is a record (``lp = local_output.logprobs_tensors``).
A field is touched when read (``x.f``, ``getattr(x, "f")``; ``x.f(...)`` is a method), given by keyword
to a constructor or to ``replace``/``_replace``, or declared in a class body (BatchShardMetadata).
Findings: touched fields in no profile of the spec, and spec fields the code no longer touches.
Exit 0 clean, 1 findings, 2 bad input (one line on stderr). With --behaviour the code is run instead of
read: which bundled profile's rules it follows, rule by rule (upstream_run.py, upstream_verdicts.py)."""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import stat
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from shardspec.spec.documents import holds_for
from shardspec.spec.errors import SpecFileError
from shardspec.spec.loader import UnknownProfileError, check_profile, load_spec, profile_names
from shardspec.spec.profiles import rules_of

PROG = "python -m shardspec.conformance upstream"
SHARD_FILE = "vllm/v1/worker/gpu/sample/batch_shard.py"
# The upstream classes the sharder passes around; spec types name them in `python:`.
CLASSES = ("InputBatch", "GrammarOutput", "SamplerOutput", "LogprobsTensors", "BatchShardMetadata")
# Spec fields that are not upstream's sharder contract, so never reported as "no longer touched".
SHARDSPEC_ONLY = {
    ("SamplerOutput", "extensions"): "shardspec's own extension fields (CL-EXTENSION-FIELDS); upstream's "
    "SamplerOutput has no such field",
    ("SamplerOutput", "sampling_mask_tensors"): "upstream's SamplerOutput has it (vLLM 0.33), but the sharder "
    "neither reads nor gathers it; the spec carries such masks as extension fields (ExtensionSpec)",
}
TITLES = {"not_in_spec": "touched by the code, not in the spec", "not_touched": "in the spec, not touched by the code"}
_NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}


class UpstreamInputError(Exception):
    """Bad input: the one-line message is printed and the exit code is 2."""


@dataclass
class Source:
    label: str  # how the report names the file
    text: str
    version: str | None = None  # vLLM's version, where the tree or wheel states it


# ------------------------------------------------------------------ reading the source


def read_source(arg: str) -> Source:
    if arg == "installed":
        return _installed()
    path = Path(arg)
    if not path.exists():
        raise UpstreamInputError(f"{arg}: no such file or directory")
    if path.is_dir():
        return _tree(path)
    if path.suffix in (".whl", ".py"):
        return _wheel(path) if path.suffix == ".whl" else Source(str(path), _read_text(path))
    raise UpstreamInputError(f"{arg}: not a vLLM source tree, a vLLM wheel (.whl) or a batch_shard.py")


# The most bytes a file of the check is read to (vLLM 0.33's batch_shard.py has about 40 KB, a wheel's METADATA
# a few KB): a larger one is refused, never read into memory.
MAX_MEMBER_BYTES = 4 << 20


def _regular(path: Path) -> os.stat_result:
    """``path``'s status if it is a regular file (a link to one is followed), else an UpstreamInputError: a
    FIFO or a device would be waited on, or read for ever."""
    try:
        found = path.stat()
    except OSError as exc:
        raise UpstreamInputError(f"{path}: cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(found.st_mode):
        kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
        kind = next((name for test, name in kinds if test(found.st_mode)), "not a regular file")
        raise UpstreamInputError(f"{path}: is {kind}, not a regular file")
    return found


def _read_text(path: Path) -> str:
    size = _regular(path).st_size
    if size > MAX_MEMBER_BYTES:
        raise UpstreamInputError(f"{path}: {size} bytes, more than {MAX_MEMBER_BYTES} (not a source file of vLLM)")
    try:
        with open(path, "rb") as stream:
            return stream.read(MAX_MEMBER_BYTES + 1)[:MAX_MEMBER_BYTES].decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UpstreamInputError(f"{path}: cannot be read: {exc}") from None


def _member(wheel: zipfile.ZipFile, name: str, path: Path) -> str:
    """A member of a wheel, its declared size bounded before a byte is unpacked (zipfile stops there)."""
    size = wheel.getinfo(name).file_size
    if size > MAX_MEMBER_BYTES:
        raise UpstreamInputError(f"{path}: {name} is {size} bytes unpacked, more than {MAX_MEMBER_BYTES}")
    with wheel.open(name) as stream:
        return stream.read(MAX_MEMBER_BYTES + 1)[:MAX_MEMBER_BYTES].decode("utf-8")


def _installed() -> Source:
    found = importlib.util.find_spec("vllm")  # a top-level name: located, not imported
    if found is None or not found.submodule_search_locations:
        raise UpstreamInputError("installed: no vllm package is installed (importlib finds none)")
    package = Path(list(found.submodule_search_locations)[0])
    try:
        return _tree(package.parent, importlib.metadata.version("vllm"))
    except importlib.metadata.PackageNotFoundError:
        return _tree(package.parent)


def _tree(root: Path, version: str | None = None) -> Source:
    root = root.parent if root.name == "vllm" and not (root / "vllm").is_dir() else root
    if not (root / "vllm").is_dir():
        raise UpstreamInputError(f"{root}: not a vLLM source tree (no vllm/ folder in it)")
    if not (root / SHARD_FILE).is_file():
        raise UpstreamInputError(f"{root}: no {SHARD_FILE} in it")
    version_file = root / "vllm" / "_version.py"  # setuptools-scm writes it, in a checkout and an install
    text = _read_text(version_file) if version_file.is_file() else ""
    stated = re.search(r"^__version__ *=[^'\"\n]*['\"]([^'\"]+)", text, re.M)  # __version__ = version = '0.33.0'
    return Source(str(root / SHARD_FILE), _read_text(root / SHARD_FILE), version or (stated and stated[1]))


def _wheel(path: Path) -> Source:
    _regular(path)
    try:
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            metadata = [_member(wheel, n, path) for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            stated = dict(re.findall(r"^(Name|Version): *(\S+)", metadata[0] if metadata else "", re.M))
            if not any(n.startswith("vllm/") for n in names) or stated.get("Name", "vllm").lower() != "vllm":
                raise UpstreamInputError(f"{path}: not a vLLM wheel (no vllm package in it)")
            if SHARD_FILE not in names:
                raise UpstreamInputError(f"{path}: no {SHARD_FILE} in this wheel")
            return Source(f"{path}!{SHARD_FILE}", _member(wheel, SHARD_FILE, path), stated.get("Version"))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, UnicodeDecodeError, NotImplementedError) as exc:
        raise UpstreamInputError(f"{path}: not a readable wheel: {exc}") from None


def parse(source: Source) -> ast.Module:
    try:
        module = ast.parse(source.text, filename=source.label)
    except SyntaxError as exc:
        raise UpstreamInputError(f"{source.label}: cannot be parsed: {exc.msg} (line {exc.lineno})") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting deeper than the parser goes
        raise UpstreamInputError(f"{source.label}: cannot be parsed: {type(exc).__name__}: {exc}") from None
    defined = {n.name for n in ast.walk(module) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    if not defined & {"BatchShardMetadata", "shard_sampler_inputs", "gather_sampler_output"}:
        raise UpstreamInputError(f"{source.label}: not vLLM's batch_shard.py (no BatchShardMetadata, no sharder)")
    return module


# ------------------------------------------------------------------ what the code touches


def annotation_class(node: ast.expr | None) -> str | None:
    """The one class of CLASSES an annotation names (``X | None``, ``Optional[X]``, ``"X"``), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        node = ast.parse(node.value, mode="eval").body
    names = {_name(n) for n in ast.walk(node)} & set(CLASSES) if node is not None else set()
    return names.pop() if len(names) == 1 else None


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


class _Visitor(ast.NodeVisitor):
    """Types the names of each scope, then records every touch: (class, field) -> [(line, how)]."""

    def __init__(self, refs: dict[tuple[str, str], str], module: ast.Module):
        self.refs, self.touches, self.env, self._methods = refs, {}, {}, set()
        functions = [n for n in ast.walk(module) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.returns = {f.name: annotation_class(f.returns) for f in functions}
        self.fields = {c.name: _class_fields(c) for c in ast.walk(module) if isinstance(c, ast.ClassDef)}
        self._scope(module)
        self.visit(module)  # self.touches: (class, field) -> [(line, how)]

    def add(self, cls: str | None, name: str, line: int, how: str) -> None:
        if cls and name not in _NAMEDTUPLE_API:
            self.touches.setdefault((cls, name), []).append((line, how))

    def type_of(self, node: ast.expr | None) -> str | None:
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Attribute):  # a field whose spec entry is a record (ref)
            return self.refs.get((self.type_of(node.value), node.attr))
        if isinstance(node, ast.IfExp):
            return self.type_of(node.body) or self.type_of(node.orelse)
        if not isinstance(node, ast.Call):
            return None
        name = _name(node.func)
        if name == "replace" and node.args:  # dataclasses.replace(x, ...) is an x
            return self.type_of(node.args[0])
        if name == "_replace" and isinstance(node.func, ast.Attribute):
            return self.type_of(node.func.value)
        return name if name in CLASSES else self.returns.get(name)

    def _scope(self, node: ast.AST) -> None:
        """Type the names of one function (or the module): annotated parameters, then its assignments."""
        args = getattr(node, "args", None)
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs] if isinstance(args, ast.arguments) else []:
            self.env[arg.arg] = annotation_class(arg.annotation)  # a parameter shadows an outer name
        for _ in range(3):  # a name typed from one that is assigned further down
            for child in _own_nodes(node):
                targets = getattr(child, "targets", [getattr(child, "target", None)])
                for target in targets if isinstance(child, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) else ():
                    cls = annotation_class(getattr(child, "annotation", None)) or self.type_of(child.value)
                    if isinstance(target, ast.Name) and cls:
                        self.env[target.id] = cls

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.env = self.env, dict(self.env)
        self._scope(node)
        self.generic_visit(node)
        self.env = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for name, line in self.fields[node.name] if node.name in CLASSES else ():
            self.add(node.name, name, line, "class body")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if id(node) not in self._methods:  # x.f(...) calls a method
            self.add(self.type_of(node.value), node.attr, node.lineno, "read")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self._methods.add(id(node.func))
        name, cls, how = _name(node.func), None, "constructor"
        if name in CLASSES:
            cls = name
            for (field_name, _), _arg in zip(self.fields.get(name, ()), node.args, strict=False):
                self.add(cls, field_name, node.lineno, how)
        elif name == "replace" and node.args or name == "_replace" and isinstance(node.func, ast.Attribute):
            cls, how = self.type_of(node.args[0] if name == "replace" else node.func.value), name
        elif name == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            self.add(self.type_of(node.args[0]), str(node.args[1].value), node.lineno, "read")
        for keyword in node.keywords if cls else ():
            if keyword.arg is not None:
                self.add(cls, keyword.arg, keyword.lineno, how)
        self.generic_visit(node)


def _own_nodes(node: ast.AST):
    """The nodes of a scope, not those of the functions and classes nested in it."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield child
            yield from _own_nodes(child)


def _class_fields(node: ast.ClassDef) -> list[tuple[str, int]]:
    body = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    return [(s.target.id, s.lineno) for s in body]


# ------------------------------------------------------------------ against the spec


def spec_fields(spec, profile: str | None) -> dict[tuple[str, str], dict]:
    """(class, field) -> the spec types and profiles that name it, for the types whose ``python`` is in CLASSES."""
    found: dict[tuple[str, str], dict] = {}
    rules = None if profile is None else rules_of(profile)
    for spec_type in (t for t in spec.data_model.types if t.python in CLASSES):
        for entry in (f for f in spec_type.fields if holds_for(f, rules)):
            item = found.setdefault((spec_type.python, entry.name), {"spec_types": [], "profiles": []})
            item["spec_types"] += [spec_type.name] if spec_type.name not in item["spec_types"] else []
            # No profiles: every one where the entry requires nothing, none of the bundled ones where it does.
            named = entry.profiles or ([] if entry.requires else ["all"])
            item["profiles"] = sorted({*item["profiles"], *named})
    return found


def spec_refs(spec) -> dict[tuple[str, str], str]:
    """(class, field) -> the class of the record the field holds (SamplerOutput.logprobs_tensors: LogprobsTensors)."""
    python = {t.name: t.python for t in spec.data_model.types}
    fields = [(t.python, f) for t in spec.data_model.types for f in t.fields]
    return {(cls, f.name): python[f.ref] for cls, f in fields if f.ref and python.get(f.ref) in CLASSES}


def check(arg: str, profile: str | None = None, spec=None) -> dict:
    """The drift report of ``arg`` (see the module's doc); raises UpstreamInputError for bad input."""
    spec = load_spec() if spec is None else spec
    source = read_source(arg)
    match = re.match(r"(\d+)\.(\d+)", source.version or "")  # vLLM X.Y.Z has the profile vllm-X.Y
    if profile is not None:
        check_profile(profile, spec)
    elif match and f"vllm-{match[1]}.{match[2]}" not in profile_names(spec):
        names = ", ".join(profile_names(spec))
        raise UpstreamInputError(
            f"vLLM {source.version} has no profile in spec {spec.version} ({names}); use --profile"
        )
    touches = _Visitor(spec_refs(spec), parse(source)).touches
    covered, every = spec_fields(spec, profile), spec_fields(spec, None)
    findings = [
        {"kind": "not_in_spec", "type": cls, "field": name, "where": sorted(set(where))}
        for (cls, name), where in sorted(touches.items())
        if (cls, name) not in covered
    ] + [
        {"kind": "not_touched", "type": cls, "field": name, **covered[cls, name]}
        for cls, name in sorted(covered)
        if (cls, name) not in touches and (cls, name) not in SHARDSPEC_ONLY
    ]
    skipped = [
        {"type": c, "field": n, "reason": SHARDSPEC_ONLY[c, n]} for c, n in sorted(SHARDSPEC_ONLY) if (c, n) in every
    ]
    return {
        "source": source.label,
        "vllm_version": source.version,
        "spec_version": spec.version,
        "profile": profile,  # None: the union of every profile's fields
        "profiles": [profile] if profile else list(profile_names(spec)),
        "touched": len(touches),
        "findings": findings,
        "shardspec_only": skipped,
        "exit_code": 1 if findings else 0,
    }


def render(report: dict) -> str:
    """The report as a short list: one line per finding (field, type, where)."""
    head = f"{report['source']} (vLLM {report['vllm_version'] or 'version unknown'})"
    lines = [f"{head} against spec {report['spec_version']}, profiles {' + '.join(report['profiles'])}"]
    for kind, title in TITLES.items():
        found = [f for f in report["findings"] if f["kind"] == kind]
        lines += [f"{title} ({len(found)}):"] if found else []
        lines += [f"  {f['field']}  {f['type']}  {_where(f)}" for f in found]
    skipped = ", ".join(f"{s['type']}.{s['field']}" for s in report["shardspec_only"])
    count = f"{len(report['findings'])} finding(s), {report['touched']} fields touched"
    lines.append(f"{count}; not checked (shardspec's own): {skipped or '-'}")
    return "\n".join(lines)


def _where(finding: dict) -> str:
    if finding["kind"] == "not_in_spec":
        return "line " + ", ".join(f"{line} ({how})" for line, how in finding["where"])
    return f"data_model.yaml {', '.join(finding['spec_types'])} (profiles: {', '.join(finding['profiles'])})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[1])
    parser.add_argument("path", metavar="PATH", help="a vLLM source tree, a vLLM wheel, a batch_shard.py, or installed")
    parser.add_argument("--profile", help="compare against this profile's fields (default: every profile's)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--behaviour",
        action="store_true",
        help="run the sharder (installed, or a tree's or one batch_shard.py through the stand-ins) on a few "
        "generated cases under each bundled profile and say which profile's rules it follows "
        "(conformance/upstream_run.py, upstream_verdicts.py)",
    )
    parser.add_argument(
        "--hide-profile",
        action="append",
        default=[],
        metavar="NAME",
        help="with --behaviour: leave this bundled profile out, as if it did not exist (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.hide_profile and not args.behaviour:
        parser.error("--hide-profile needs --behaviour")
    try:
        if args.behaviour:
            return _behaviour(args)
        report = check(args.path, args.profile)
    except (UpstreamInputError, UnknownProfileError, SpecFileError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render(report))
    return report["exit_code"]


def touched_fields(source: Source, spec=None) -> set[tuple[str, str]]:
    """The (class, field) pairs the code of ``source`` touches."""
    spec = load_spec() if spec is None else spec
    return set(_Visitor(spec_refs(spec), parse(source)).touches)


def _behaviour(args) -> int:
    from shardspec.conformance import upstream_run, upstream_verdicts

    if args.profile:
        raise UpstreamInputError("--behaviour runs every bundled profile; leave some out with --hide-profile")
    if args.path.endswith(".whl"):
        raise UpstreamInputError(
            f"{args.path}: --behaviour runs installed, a source tree or a batch_shard.py, not a wheel"
        )
    try:
        upstream_run.visible_profiles(tuple(args.hide_profile))  # a bad name before anything is read
        source = read_source(args.path)
        target = "installed" if args.path == "installed" else source.label  # the batch_shard.py of a tree
        report = upstream_run.check(target, touched_fields(source), tuple(args.hide_profile))
    except upstream_run.BehaviourInputError as exc:
        raise UpstreamInputError(str(exc)) from None
    print(json.dumps(report, indent=2, default=str) if args.json else upstream_verdicts.render(report))
    return report["exit_code"]
