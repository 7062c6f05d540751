"""Load and cross-check the specification documents of ``spec/``.

``load_spec()`` reads ``index.yaml`` and the documents it lists, validates each
against ``schema.json`` and checks the references between them
(:mod:`shardspec.spec.cross_references`). Any
problem raises a single :class:`SpecFileError` naming the file, the place in it
(``invariants[3].level`` or ``line 4, column 7``) and the field at fault.

``load_yaml_document(path, schema)`` is the same reading and validation for any
YAML file, so other packages (fixtures) report errors the same way.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Hashable
from importlib import resources
from pathlib import Path
from typing import Any, Union

import jsonschema
import yaml

from shardspec.spec.cross_references import check_references
from shardspec.spec.documents import (  # noqa: F401  (re-exported)
    Clarification,
    DataModel,
    Document,
    FieldSpec,
    Invariant,
    LocalView,
    OnViolation,
    Precondition,
    Profile,
    Spec,
    Symbol,
    TypeSpec,
    holds_for,
    requires_of,
)
from shardspec.spec.errors import SpecFileError
from shardspec.spec.profiles import is_profile
from shardspec.spec.selection import (  # noqa: F401  (UnknownProfileError and select_profile re-exported)
    UnknownProfileError,
    _check_profile_names,
    select_profile,
    spec_profiles,
    with_profile_names,
)

DOCUMENT_NAMES = ("overview", "data_model", "preconditions", "invariants", "clarifications")
_SCHEMA_FILE = "schema.json"
_MAX_MESSAGE = 200

PathLike = Union[str, Path, "resources.abc.Traversable"]


# ------------------------------------------------------------ YAML + schema


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """A safe loader that refuses duplicate mapping keys (PyYAML keeps the last). libyaml's parser where PyYAML
    has it: the pure-Python one took 8 of the 9 s a one-case command-line run spent reading the spec."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    keys = [loader.construct_object(key_node, deep=deep) for key_node, _ in node.value]
    for position, key in enumerate(keys):
        if isinstance(key, Hashable) and key in keys[:position]:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"duplicate key {key!r}", node.value[position][0].start_mark
            )
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_document(path: PathLike, schema: dict) -> Any:
    """Parse the YAML file at ``path`` and validate it against the JSON Schema ``schema``.

    Raises :class:`SpecFileError` (never a yaml or jsonschema exception).
    """
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8") if hasattr(path, "read_text") else Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecFileError(name, "file", f"cannot be read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        raise SpecFileError(name, _mark_place(exc), _yaml_problem(exc)) from None
    except yaml.YAMLError as exc:
        raise SpecFileError(name, "file", f"is not valid YAML: {exc}") from None
    validate_document(data, schema, name)
    return data


def _mark_place(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "file"


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    parts = [p for p in (exc.context, exc.problem) if p]
    return "invalid YAML: " + "; ".join(parts)


def validate_document(data: Any, schema: dict, name: str) -> None:
    """Raise SpecFileError for the most relevant schema violation of ``data``, if any."""
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is None:
        return
    place, message = _describe_schema_error(error)
    raise SpecFileError(name, place, message)


def _describe_schema_error(error: jsonschema.ValidationError) -> tuple[str, str]:
    place = format_place(error.absolute_path)
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = next(p for p in error.validator_value if p not in instance)
        return _join(place, missing), f"field '{missing}' is required but missing"
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = error.schema.get("properties", {})
        extra = next(k for k in instance if k not in allowed)
        return _join(place, str(extra)), f"field '{extra}' is not allowed here (allowed: {', '.join(allowed)})"
    # The innermost named key: for "invariants[0].fields[1]" that is "fields".
    field_name = next((str(p) for p in reversed(error.absolute_path) if isinstance(p, str)), "document")
    message = error.message
    if error.validator == "pattern" and "description" in error.schema:
        message = f"{error.instance!r} is not {error.schema['description']}"
    message = message if len(message) <= _MAX_MESSAGE else message[:_MAX_MESSAGE] + "..."
    return place, f"field '{field_name}': {message}"


def format_place(path) -> str:
    """``['invariants', 3, 'level']`` -> ``invariants[3].level``; empty -> ``top level``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "top level"


def _join(place: str, name: str) -> str:
    return name if place == "top level" else f"{place}.{name}"


# ------------------------------------------------------------------ loading


def _package_root():
    return resources.files("shardspec.spec")


def spec_schema() -> dict:
    """The JSON Schema of all documents (``$defs`` has one entry per document)."""
    return json.loads(_package_root().joinpath(_SCHEMA_FILE).read_text(encoding="utf-8"))


def document_schema(document: str) -> dict:
    """A schema that validates one document (``index`` or one of DOCUMENT_NAMES)."""
    root = spec_schema()
    if document not in root["$defs"]:
        raise KeyError(f"schema.json defines no document {document!r}")
    return {**root, "$ref": f"#/$defs/{document}"}


def load_spec(root: PathLike | None = None, profile: str | None = None) -> Spec:
    """Load the specification from ``root`` (default: the installed package's spec/).

    ``profile``: keep only the entries and fields that hold for that profile (spec/profiles/ holds
    them); None keeps every entry of every profile. Raises :class:`UnknownProfileError` for a name
    the spec does not define.
    """
    base = _package_root() if root is None else Path(root)
    index_path = base.joinpath("index.yaml")
    index = load_yaml_document(index_path, document_schema("index"))
    files = _document_files(index, str(index_path))
    raw = {name: load_yaml_document(base.joinpath(file), document_schema(name)) for name, file in files.items()}
    paths = {name: str(base.joinpath(file)) for name, file in files.items()}
    spec = with_profile_names(_build_spec(index, raw, None if root is None else base))
    _check_profile_names(spec, {**paths, "index": str(index_path)})
    for name in profile_names(spec):
        check_references(select_profile(spec, name), paths)
    if profile is None:
        return spec
    check_profile(profile, spec)
    selected = select_profile(spec, profile)
    if profile not in profile_names(spec):
        check_references(selected, paths)  # a profile of the user's: no ID may have two entries that hold
    return selected


def profile_names(spec: Spec | None = None) -> tuple[str, ...]:
    """The profiles the specification defines, the default first."""
    spec = load_spec() if spec is None else spec
    return tuple(p.name for p in sorted(spec.profiles, key=lambda p: not p.default))


def default_profile(spec: Spec | None = None) -> str:
    return profile_names(spec)[0]


def check_profile(name: str, spec: Spec | None = None) -> str:
    """``name`` if the spec defines it; else :class:`UnknownProfileError` with a one-line message."""
    known = profile_names(spec)
    if name not in known and not is_profile(name):
        raise UnknownProfileError(
            f"unknown profile {name!r}: this spec ({spec_version()}) defines {', '.join(known)} (default {known[0]})"
        )
    return name


def spec_version(root: PathLike | None = None) -> str:
    """The version of the specification in ``root`` (default: the installed one), e.g. ``"0.4.0"``.

    Reads only index.yaml, so a report header can name the version without loading every document.
    """
    base = _package_root() if root is None else Path(root)
    return load_yaml_document(base.joinpath("index.yaml"), document_schema("index"))["version"]


def target_version_warning(factory: Any, checked: str | None = None) -> str | None:
    """A warning when ``factory`` declares (``SPEC_VERSION``) a spec version whose MAJOR.MINOR differs
    from the one checked (default: this spec's); None when it declares none or they agree."""
    declared = getattr(factory, "SPEC_VERSION", None)
    checked = spec_version() if checked is None else checked
    if declared is None or str(declared).split(".")[:2] == checked.split(".")[:2]:
        return None
    name = getattr(factory, "__qualname__", type(factory).__name__)
    return (
        f"{name} targets spec {declared}, the suite checks spec {checked}: see spec/CHANGELOG.md and "
        "docs/validate-your-implementation.md (section 6)"
    )


def must_reject_ids(spec: Spec | None = None) -> tuple[str, ...]:
    """IDs of the preconditions whose violation MUST be rejected (``on_violation.outcome: reject``);
    without ``spec``, the installed package's, read once per process (a rank asks for every case)."""
    if spec is None:
        return _package_must_reject_ids()
    return tuple(p.id for p in spec.preconditions if p.must_reject and not p.retired)


@functools.cache
def _package_must_reject_ids() -> tuple[str, ...]:
    return must_reject_ids(load_spec())


def _document_files(index: dict, index_name: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for position, doc in enumerate(index["documents"]):
        if doc["name"] in files:
            raise SpecFileError(index_name, f"documents[{position}].name", f"document '{doc['name']}' is listed twice")
        files[doc["name"]] = doc["file"]
    missing = [name for name in DOCUMENT_NAMES if name not in files]
    if missing:
        raise SpecFileError(index_name, "documents", f"field 'documents' lacks {', '.join(missing)}")
    return files


def _build_spec(index: dict, raw: dict[str, Any], base=None) -> Spec:
    model = raw["data_model"]
    data_model = DataModel(
        symbols=tuple(Symbol(**s) for s in model["symbols"]),
        types=tuple(TypeSpec(t["name"], t["meaning"], _fields(t["fields"]), t.get("python")) for t in model["types"]),
        arguments=_fields(model["arguments"]),
        outputs=_fields(model["outputs"]),
    )
    overview = raw["overview"]
    return Spec(
        name=index["name"],
        title=index["title"],
        version=index["version"],
        documents=tuple(Document(**d) for d in index["documents"]),
        sections=tuple((s["title"], s["body"]) for s in overview["sections"]),
        example=overview["example"],
        data_model=data_model,
        invariants=tuple(Invariant(**_tupled(e)) for e in raw["invariants"]["invariants"]),
        preconditions=tuple(_precondition(e) for e in raw["preconditions"]["preconditions"]),
        clarifications=tuple(Clarification(**_tupled(e)) for e in raw["clarifications"]["clarifications"]),
        profiles=spec_profiles(base),
    )


# Keys of the input space (conformance/cases/input_space.py reads them from the raw documents): not
# part of the loaded entries.
INPUT_SPACE_FIELD_KEYS = ("values", "dtypes", "engine_dtype", "variants")
INPUT_SPACE_PRECONDITION_KEYS = ("boundaries",)


def _precondition(entry: dict) -> Precondition:
    kept = {k: v for k, v in entry.items() if k not in INPUT_SPACE_PRECONDITION_KEYS}
    return Precondition(**{**_tupled(kept), "on_violation": OnViolation(**entry["on_violation"])})


def _tupled(entry: dict) -> dict:
    return {k: requires_of(v) if k == "requires" else tuple(v) if isinstance(v, list) else v for k, v in entry.items()}


def _fields(entries: list[dict]) -> tuple[FieldSpec, ...]:
    built = []
    for entry in entries:
        values = _tupled({k: v for k, v in entry.items() if k not in ("local", "fields", *INPUT_SPACE_FIELD_KEYS)})
        local = entry.get("local")
        built.append(
            FieldSpec(
                **values,
                local=None if local is None else LocalView(**_tupled(local)),
                fields=_fields(entry.get("fields", [])),
            )
        )
    return tuple(built)
