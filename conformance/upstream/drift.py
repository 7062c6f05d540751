"""The drift check: which fields vLLM's batch_shard.py touches, read by AST, that no profile of the spec covers,
and which spec fields it no longer touches (the rules of reading: command.py's doc)."""

from __future__ import annotations

import ast
import re

from shardspec.conformance.upstream.source import Source, UpstreamInputError, read_source
from shardspec.spec.documents import holds_for
from shardspec.spec.loader import check_profile, load_spec, profile_names
from shardspec.spec.profiles import rules_of
from shardspec.spec.rules import Rules

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


def spec_fields(spec, rules: Rules | None) -> dict[tuple[str, str], dict]:
    """(class, field) -> the spec types and profiles that name it, for the types whose ``python`` is in CLASSES
    (where they hold under ``rules``; None: under any profile)."""
    found: dict[tuple[str, str], dict] = {}
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
    covered, every = spec_fields(spec, None if profile is None else rules_of(profile)), spec_fields(spec, None)
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


def touched_fields(source: Source, spec=None) -> set[tuple[str, str]]:
    """The (class, field) pairs the code of ``source`` touches."""
    spec = load_spec() if spec is None else spec
    return set(_Visitor(spec_refs(spec), parse(source)).touches)
