"""The input space of one step, as data: every variation each input field can take, derived from the spec.

The spec's data model (spec/data_model.yaml) says, per input field, its type, dtype, shape, placement
and whether it is optional, and in structured keys its value range (``values: {min, max, limits}``)
and every dtype the spec allows (``dtypes``). From that alone :func:`input_space` derives the
variations of each field, along six axes:

* ``value``: both ends of its range (``min``, ``max``) and, with ``limits``, the dtype's limits
  (``+inf``, ``-inf``, ``nan``, ``largest``, ``lowest``, ``subnormal`` for floats; ``dtype-min``,
  ``dtype-max`` for integers); ``true`` and ``false`` for a bool;
* ``dtype``: every dtype the spec allows, where it allows more than one;
* ``layout``: every view engines produce: ``contiguous``, ``strided`` (``t[::2]``), ``offset`` (past
  its storage's first element) and, for a two-dimensional tensor, ``row-padded`` (rows further apart
  than their width) and ``column-slice`` (the leading columns of a wider buffer);
* ``presence``: ``present`` and ``absent`` for an optional field;
* ``dims``: ``empty`` for a field whose leading size may be 0 (no requests, a rank that owns none);
* ``step``: ``changed`` for each argument an engine may change between consecutive steps of one
  sharder (the sharder's construction parameters are fixed for its lifetime).

A field added to the YAML gets its variations here without new code. What a case exercises is
measured by :func:`exercised` from the case itself; :func:`coverage` sets that against the space,
so a variation the model allows but no case drew is listed as not covered. How to make a case draw
a variation on purpose is :data:`REALIZERS` (a variation without one can only be drawn by chance or
not at all, and stays listed as not covered).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import cache

from shardspec.spec.model import DEFAULT_PROFILE, VLLM_033

VALUE, DTYPE, LAYOUT, PRESENCE, DIMS, STEP = "value", "dtype", "layout", "presence", "dims", "step"
AXES = (VALUE, DTYPE, LAYOUT, PRESENCE, DIMS, STEP)
LAYOUTS_1D = ("contiguous", "strided", "offset")
LAYOUTS_2D = LAYOUTS_1D + ("row-padded", "column-slice")
FLOAT_LIMITS = ("+inf", "-inf", "nan", "largest", "lowest", "subnormal")
INT_LIMITS = ("dtype-min", "dtype-max")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "logits")
# Sizes that may be 0: an empty batch, a rank that owns no request.
ZERO_SIZES = ("N", "L", "n", "L_local")


@dataclass(frozen=True, order=True)
class Variation:
    field: str  # argument path: batch.idx_mapping, local_output.logprobs_tensors.logprobs, logits_shard
    axis: str
    value: str

    @property
    def key(self) -> str:
        return f"{self.field}:{self.axis}={self.value}"


@dataclass(frozen=True)
class InputField:
    path: str
    type: str
    placement: str
    dtype: str | None = None
    dtypes: tuple[str, ...] = ()
    shape: tuple[str, ...] | None = None
    optional: bool = False
    values: tuple[tuple[str, object], ...] = ()
    top_level: bool = False
    fixed: bool = False  # constant for a sharder's lifetime (its construction parameters)


# -------------------------------------------------------------------- the model


def _holds(entry: dict, profile: str | None) -> bool:
    return profile is None or not entry.get("profiles") or profile in entry["profiles"]


def input_fields(data_model: dict, profile: str | None = DEFAULT_PROFILE) -> list[InputField]:
    """The input fields of the raw data model (the ``arguments`` section, records expanded by their
    type), under ``profile``. An argument that hands back what an earlier step returned, or the same
    record as an earlier argument, is not an input of its own."""
    types = {}
    for entry in data_model["types"]:
        types.setdefault(entry["name"], []).append(entry)
    returned = {o.get("ref") for o in data_model["outputs"] if o.get("ref")}
    seen_refs: set[str] = set()
    fields: list[InputField] = []

    def add(entry: dict, path: str, top: bool, fixed: bool) -> None:
        fields.append(
            InputField(
                path=path,
                type=entry["type"],
                placement=entry["placement"],
                dtype=entry.get("dtype"),
                dtypes=tuple(entry.get("dtypes", ())),
                shape=None if entry.get("shape") is None else tuple(str(s) for s in entry["shape"]),
                optional=bool(entry.get("optional", False)),
                values=tuple(sorted((entry.get("values") or {}).items())),
                top_level=top,
                fixed=fixed,
            )
        )
        ref = entry.get("ref")
        if ref:
            for record in types.get(ref, []):
                for sub in record["fields"]:
                    if _holds(sub, profile):
                        add(sub, f"{path}.{sub['name']}", False, fixed)
        for sub in entry.get("fields", []):
            if _holds(sub, profile):
                add(sub, f"{path}.{sub['name']}", False, fixed)

    for argument in data_model["arguments"]:
        if not _holds(argument, profile) or argument.get("view") == "local":
            continue
        ref = argument.get("ref")
        if ref and (ref in seen_refs or (ref in returned and argument["step"] != "shard")):
            continue
        if ref:
            seen_refs.add(ref)
        # The sharder's construction parameters: an object argument with fields of its own.
        add(argument, argument["name"], True, argument["type"] == "object")
    return fields


def variations_of(field: InputField) -> list[Variation]:
    """Every variation the spec's data allows for ``field``."""
    out: list[tuple[str, str]] = []
    values = dict(field.values)
    if "min" in values:
        out.append((VALUE, "min"))
    if "max" in values:
        out.append((VALUE, "max"))
    if values.get("limits"):
        # An integer field with a min of its own is bounded below by it, not by its dtype.
        limits = FLOAT_LIMITS if field.dtype in FLOAT_DTYPES else INT_LIMITS[1:] if "min" in values else INT_LIMITS
        out += [(VALUE, v) for v in limits]
    if field.type == "bool":
        out += [(VALUE, "true"), (VALUE, "false")]
    if len(field.dtypes) > 1:
        out += [(DTYPE, d) for d in field.dtypes]
    if field.type in ("tensor", "ndarray"):
        two_d = field.type == "tensor" and field.shape is not None and len(field.shape) == 2
        out += [(LAYOUT, layout) for layout in (LAYOUTS_2D if two_d else LAYOUTS_1D)]
        if field.shape and field.shape[0] in ZERO_SIZES:
            out.append((DIMS, "empty"))
    if field.optional:
        out += [(PRESENCE, "present"), (PRESENCE, "absent")]
    if field.top_level and not field.fixed:
        out.append((STEP, "changed"))
    return [Variation(field.path, axis, value) for axis, value in out]


def derive(data_model: dict, profile: str | None = DEFAULT_PROFILE) -> tuple[Variation, ...]:
    """The input space of a raw data model (pure: no files read)."""
    return tuple(v for field in input_fields(data_model, profile) for v in variations_of(field))


def raw_data_model() -> dict:
    """spec/data_model.yaml as the loader reads and validates it, structured keys included."""
    from shardspec.spec.loader import _package_root, document_schema, load_yaml_document

    return load_yaml_document(_package_root().joinpath("data_model.yaml"), document_schema("data_model"))


@cache
def input_space(profile: str = DEFAULT_PROFILE) -> tuple[Variation, ...]:
    """Every variation of every input field of the spec under ``profile``."""
    return derive(raw_data_model(), profile)


# ------------------------------------------------------------- what a case draws

# Case.layouts names -> argument paths (local_output: every tensor of the local sampler output).
_LAYOUT_PATHS = {"grammar_bitmask": "grammar.grammar_bitmask", "logits_shard": "logits_shard"}
_LOCAL_TENSORS = (
    "local_output.sampled_token_ids",
    "local_output.num_nans",
    "local_output.num_sampled",
    "local_output.num_rejected",
    "local_output.logprobs_tensors.logprob_token_ids",
    "local_output.logprobs_tensors.logprobs",
    "local_output.logprobs_tensors.selected_token_ranks",
)
_EXPLICIT = {
    "sampled_token_ids": "local_output.sampled_token_ids",
    "num_sampled": "local_output.num_sampled",
    "num_rejected": "local_output.num_rejected",
    "num_nans": "local_output.num_nans",
    "logprob_token_ids": "local_output.logprobs_tensors.logprob_token_ids",
    "logprobs": "local_output.logprobs_tensors.logprobs",
    "selected_token_ranks": "local_output.logprobs_tensors.selected_token_ranks",
}
_DTYPE_EDITS = {
    "idx-mapping-np-int32": ("batch.idx_mapping_np", "int32"),
    "draft-counts-int64": (
        "batch.num_draft_tokens_per_req",
        "int64",
    ),
}
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_SUBNORMAL = 1.401298464324817e-45


def _path_of_layout_name(name: str) -> list[str]:
    if name == "local_output":
        return list(_LOCAL_TENSORS)
    return [_LAYOUT_PATHS.get(name, f"batch.{name}")]


def _float_limit(value: float) -> str | None:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    if abs(value) >= FLOAT32_MAX:
        return "largest" if value > 0 else "lowest"
    if value != 0 and abs(value) <= FLOAT32_SUBNORMAL * 1.5:
        return "subnormal"
    return None


def _int_limit(value: int, bounds: tuple[int, int]) -> str | None:
    return "dtype-min" if value <= bounds[0] else "dtype-max" if value >= bounds[1] else None


def _spec_decode(case) -> bool:
    return case.spec_decode is True or (case.spec_decode is None and any(n > 1 for n in case.num_logits_per_req))


def _owners(case) -> set[int]:
    return {s % case.tp_size for s in case.slots}


@cache
def _declared_dtypes(profile: str) -> dict[str, tuple[str, ...]]:
    return {f.path: f.dtypes for f in input_fields(raw_data_model(), profile)}


@cache
def _declared_values(profile: str) -> dict[str, dict]:
    return {f.path: dict(f.values) for f in input_fields(raw_data_model(), profile)}


def exercised(case, previous=None) -> set[Variation]:
    """The variations one step of ``case`` draws, read from the case (``previous``: the step before it
    on the same sharder, for the ``step`` axis). Only variations of the spec's input space count."""
    got: set[tuple[str, str, str]] = set()

    def add(path: str, axis: str, value: str) -> None:
        got.add((path, axis, value))

    slots, counts, cap, cap_logits = case.slots, case.num_logits_per_req, case.max_num_reqs, case.max_num_logits_per_req
    n_reqs = len(slots)
    idle = len(_owners(case)) < case.tp_size  # a rank owns nothing (at tp 1: an empty batch)
    spec_decode = _spec_decode(case)
    # value: ranges
    if n_reqs == 0:
        add("batch.num_reqs", VALUE, "min")
        for name in (
            "req_ids",
            "idx_mapping",
            "idx_mapping_np",
            "expanded_idx_mapping",
            "expanded_local_pos",
            "seq_lens",
            "logits_indices",
            "seq_lens_cpu_upper_bound",
            "num_draft_tokens_per_req",
            "num_admitted_draft_tokens",
        ):
            add(f"batch.{name}", DIMS, "empty")
        add("logits_shard", DIMS, "empty")
    if n_reqs == cap:
        add("batch.num_reqs", VALUE, "max")
    for name in ("idx_mapping", "idx_mapping_np", "expanded_idx_mapping"):
        if 0 in slots:
            add(f"batch.{name}", VALUE, "min")
        if cap - 1 in slots:
            add(f"batch.{name}", VALUE, "max")
    if counts:
        add("batch.expanded_local_pos", VALUE, "min")
        add("batch.cu_num_logits_np", VALUE, "min")
        if cap_logits in counts:
            add("batch.expanded_local_pos", VALUE, "max")
        if sum(counts) == cap * cap_logits:
            add("batch.cu_num_logits_np", VALUE, "max")
        if spec_decode:
            if 1 in counts:
                add("batch.num_draft_tokens_per_req", VALUE, "min")
            if cap_logits in counts:
                add("batch.num_draft_tokens_per_req", VALUE, "max")
    if case.admitted_drafts is not None and counts:
        if 0 in case.admitted_drafts:
            add("batch.num_admitted_draft_tokens", VALUE, "min")
        if any(a == c - 1 for a, c in zip(case.admitted_drafts, counts, strict=False)):
            add("batch.num_admitted_draft_tokens", VALUE, "max")
    if case.num_acceptable_drafts is not None and case.grammar_positions:
        acceptable = list(zip(case.num_acceptable_drafts, case.grammar_positions, strict=False))
        if any(a == 0 for a, _ in acceptable):
            add("grammar.num_acceptable_drafts", VALUE, "min")
        if any(p < len(counts) and a == counts[p] for a, p in acceptable):
            add("grammar.num_acceptable_drafts", VALUE, "max")
    if cap == 1:
        add("sharder.max_num_reqs", VALUE, "min")
    if cap_logits == 1:
        add("sharder.max_num_logits_per_req", VALUE, "min")
    add("sharder.adaptive_verification_enabled", VALUE, "true" if case.adaptive_verification else "false")
    add("gather_num_nans", VALUE, "true" if case.gather_num_nans else "false")
    if case.logprobs_dims is not None and 0 in case.logprobs_dims:
        add("logprobs_dims", VALUE, "min")
    # value: limits of the explicit outputs' values
    if isinstance(case.local_outputs, dict):
        declared = _declared_values(case.profile)
        for out in case.local_outputs.values():
            for name, path in _EXPLICIT.items():
                values = getattr(out, name)
                flat = [v for row in values for v in row] if values and isinstance(values[0], list) else values or []
                low = declared.get(path, {}).get("min")
                for v in flat:
                    if isinstance(low, int) and v == low:
                        add(path, VALUE, "min")
                    if name == "logprobs":
                        limit = _float_limit(float(v))
                    else:
                        limit = _int_limit(
                            int(v),
                            INT64
                            if name in ("sampled_token_ids", "logprob_token_ids", "selected_token_ranks")
                            else INT32,
                        )
                    if limit:
                        add(path, VALUE, limit)
    # dtype
    dtypes = {
        "batch.idx_mapping": "int64",
        "batch.idx_mapping_np": "intp",
        "batch.expanded_idx_mapping": "int32",
        "batch.expanded_local_pos": "int32",
        "batch.seq_lens": "int32",
        "batch.cu_num_logits": "int32",
        "batch.num_draft_tokens_per_req": "int32",
    }
    dtypes.update({f"batch.{name}": dtype for name, dtype in case.batch_dtypes.items()})
    for edit in case.edits:
        if edit in _DTYPE_EDITS:
            path, dtype = _DTYPE_EDITS[edit]
            dtypes[path] = dtype
    if not spec_decode:
        dtypes.pop("batch.num_draft_tokens_per_req")
    for path, dtype in dtypes.items():
        add(path, DTYPE, dtype)
    add("logits_shard", DTYPE, case.logits_dtype)
    # layout
    tensors = [
        "logits_shard",
        *(
            f"batch.{n}"
            for n in (
                "idx_mapping",
                "idx_mapping_np",
                "expanded_idx_mapping",
                "expanded_local_pos",
                "query_start_loc",
                "seq_lens",
                "logits_indices",
                "cu_num_logits",
                "cu_num_logits_np",
            )
        ),
    ]
    if spec_decode:
        tensors.append("batch.num_draft_tokens_per_req")
    if case.grammar_positions:
        tensors.append("grammar.grammar_bitmask")
    tensors += list(_LOCAL_TENSORS)
    if case.profile == VLLM_033:
        tensors.append("batch.seq_lens_cpu_upper_bound")  # a CPU tensor the case format lays out contiguously
    if case.admitted_drafts is not None:
        tensors.append("batch.num_admitted_draft_tokens")
    viewed = {path: layout for name, layout in case.layouts.items() for path in _path_of_layout_name(name)}
    for path in tensors:
        add(path, LAYOUT, viewed.get(path, "contiguous"))
    # presence
    add("batch.num_draft_tokens_per_req", PRESENCE, "present" if spec_decode else "absent")
    if case.profile == VLLM_033:
        add("batch.seq_lens_cpu_upper_bound", PRESENCE, "present")
    add("batch.num_admitted_draft_tokens", PRESENCE, "absent" if case.admitted_drafts is None else "present")
    add("grammar", PRESENCE, "present" if case.grammar_positions else "absent")
    if case.grammar_positions:
        add("grammar.num_acceptable_drafts", PRESENCE, "absent" if case.num_acceptable_drafts is None else "present")
    add("logprobs_dims", PRESENCE, "absent" if case.logprobs_dims is None else "present")
    add("extension_fields", PRESENCE, "present" if case.extensions else "absent")
    add("local_output.extensions", PRESENCE, "present" if case.extensions else "absent")
    if case.local_outputs == "toy":
        if idle:
            for path in _LOCAL_TENSORS:
                add(path, DIMS, "empty")
        add("local_output", PRESENCE, "present")
        add("local_output.logprobs_tensors", PRESENCE, "absent" if case.logprobs_dims is None else "present")
        add("local_output.num_nans", PRESENCE, "present")
    else:
        outputs = case.local_outputs
        add("local_output", PRESENCE, "present")
        if any(rank not in outputs for rank in range(case.tp_size)):
            add("local_output", PRESENCE, "absent")
        for out in outputs.values():
            add("local_output.logprobs_tensors", PRESENCE, "absent" if out.logprob_token_ids is None else "present")
            if out.logprob_token_ids is not None:  # explicit logprobs carry neither (ExplicitLocalOutput)
                add("local_output.logprobs_tensors.cu_num_generated_tokens", PRESENCE, "absent")
                add("local_output.logprobs_tensors.cu_num_generated_tokens_tensor", PRESENCE, "absent")
            add("local_output.num_nans", PRESENCE, "absent" if out.num_nans is None else "present")
    # step: what changed since the step before, on the same sharder
    if previous is not None:
        changed = {
            "batch": (previous.slots, previous.num_logits_per_req) != (slots, counts),
            "grammar": previous.grammar_positions != case.grammar_positions,
            "logits_shard": (previous.logits_dtype, previous.layouts.get("logits_shard"), previous.slots)
            != (case.logits_dtype, case.layouts.get("logits_shard"), slots),
            "local_output": previous.local_outputs != case.local_outputs or previous.slots != slots,
            "gather_num_nans": previous.gather_num_nans != case.gather_num_nans,
            "logprobs_dims": previous.logprobs_dims != case.logprobs_dims,
            "extension_fields": previous.extensions != case.extensions,
        }
        for path, differs in changed.items():
            if differs:
                add(path, STEP, "changed")
    space = set(input_space(case.profile))
    return {Variation(*v) for v in got} & space


def steps_of(cases: Iterable) -> list[tuple[object, object | None]]:
    """(step, the step before it on its sharder or None) for every step of ``cases``: multi-step cases
    are unrolled, and expanded steps (``continues``) are paired with the step they continue."""
    by_id, pairs = {}, []
    for case in cases:
        steps = [case, *case.then] if case.then else [case]
        for k, step in enumerate(steps):
            previous = steps[k - 1] if k else by_id.get(getattr(step, "continues", None))
            pairs.append((step, previous))
            by_id[step.case_id] = step
    return pairs


@dataclass
class Coverage:
    profile: str
    space: tuple[Variation, ...]
    counts: dict[Variation, int]

    @property
    def covered(self) -> list[Variation]:
        return [v for v in self.space if self.counts.get(v)]

    @property
    def not_covered(self) -> list[Variation]:
        return [v for v in self.space if not self.counts.get(v)]

    def as_dict(self) -> dict:
        return {
            "profile": self.profile,
            "variations": len(self.space),
            "covered": len(self.covered),
            "not_covered": [v.key for v in self.not_covered],
            "counts": {v.key: self.counts.get(v, 0) for v in self.space},
        }


def coverage(cases: Iterable, profile: str = DEFAULT_PROFILE) -> Coverage:
    """How often the valid steps of ``cases`` drew each variation of the input space (cases that
    violate a precondition on purpose do not count: they draw outside it)."""
    counts: dict[Variation, int] = {}
    for step, previous in steps_of(cases):
        if step.expect_error is not None:
            continue
        for variation in exercised(replace(step, profile=profile), previous):
            counts[variation] = counts.get(variation, 0) + 1
    return Coverage(profile, input_space(profile), counts)


# ------------------------------------------------------- drawing a variation on purpose


def _with_layout(layout: str, names: list[str]) -> Callable:
    def realize(case, rng):
        from shardspec.spec.layouts import LAYOUTS

        if layout not in LAYOUTS:
            return None  # a view the case format cannot make yet (spec/layouts.py)
        return replace(case, layouts={**case.layouts, **{name: layout for name in names}})

    return realize


def _batch_dtype(name: str, dtype: str) -> Callable:
    def realize(case, rng):
        if dtype not in _declared_dtypes(case.profile).get(f"batch.{name}", ()):
            return None
        return replace(case, batch_dtypes={**case.batch_dtypes, name: dtype})

    return realize


def _slot(value: str) -> Callable:
    def realize(case, rng):
        if not case.slots:
            return None
        target = 0 if value == "min" else case.max_num_reqs - 1
        if target in case.slots:
            return case
        slots = list(case.slots)
        slots[int(rng.integers(len(slots)))] = target
        return replace(case, slots=slots)

    return realize


_LOGPROB_NAMES = ("logprob_token_ids", "logprobs", "selected_token_ranks")


def _with_logprobs(case, rank: int, out):
    """``out`` with logprobs of the agreed width for its rows where it has none."""
    if out.logprob_token_ids is not None:
        return out
    owned = [i for i, s in enumerate(case.slots) if s % case.tp_size == rank]
    rows = sum(case.num_logits_per_req[i] for i in owned)
    cols = 1 + max(case.logprobs_dims)
    return replace(
        out,
        logprob_token_ids=[[0] * cols for _ in range(rows)],
        logprobs=[[-1.0] * cols for _ in range(rows)],
        selected_token_ranks=[0] * rows,
    )


def _explicit_value(name: str, value) -> Callable:
    def realize(case, rng):
        if not isinstance(case.local_outputs, dict) or not case.local_outputs:
            return None
        if name in _LOGPROB_NAMES and case.logprobs_dims is None:
            case = replace(case, logprobs_dims=(1, 0))
        outputs = {}
        for rank, out in case.local_outputs.items():
            if name in _LOGPROB_NAMES:
                out = _with_logprobs(case, rank, out)
            values = getattr(out, name)
            if values is None or not values:
                outputs[rank] = out
                continue
            copied = [list(row) for row in values] if isinstance(values[0], list) else list(values)
            if isinstance(copied[0], list):
                copied[int(rng.integers(len(copied)))][0] = value
            else:
                copied[int(rng.integers(len(copied)))] = value
            outputs[rank] = replace(out, **{name: copied})
        return replace(case, local_outputs=outputs)

    return realize


# One extension field of each kind (CL-EXTENSION-FIELDS), as the sampling-mask example declares them.
EXTENSION = {"num_kept": {"per": "logits_row", "dtype": "int32", "shape": []}}


def _with_extension(case, rng):
    return replace(case, extensions={**case.extensions, **EXTENSION})


def _capacity_one(case, rng):
    """A sharder of capacity 1: the batch is slot 0 or empty."""
    slots = [0] if case.slots else []
    return replace(
        case,
        max_num_reqs=1,
        slots=slots,
        num_logits_per_req=case.num_logits_per_req[:1],
        grammar_positions=[0] if case.grammar_positions and slots else None,
        num_acceptable_drafts=None,
        admitted_drafts=None if case.admitted_drafts is None else case.admitted_drafts[:1],
        nan_tokens=[],
        local_outputs="toy",
    )


def _without_nan_counts(case, rng):
    if not isinstance(case.local_outputs, dict) or not case.local_outputs:
        return None
    outputs = {rank: replace(out, num_nans=None) for rank, out in case.local_outputs.items()}
    return replace(case, gather_num_nans=False, local_outputs=outputs)


def _realizers() -> dict[str, Callable]:
    from shardspec.spec.layouts import BATCH_ARRAYS, BATCH_TENSORS, LAYOUTS

    out: dict[str, Callable] = {}
    for layout in (layout for layout in LAYOUTS_2D if layout in LAYOUTS):  # the views the case format makes
        for name in BATCH_TENSORS + BATCH_ARRAYS + ("grammar_bitmask", "logits_shard"):
            for path in _path_of_layout_name(name):
                out[f"{path}:{LAYOUT}={layout}"] = _with_layout(layout, [name])
        for path in _LOCAL_TENSORS:
            out[f"{path}:{LAYOUT}={layout}"] = _with_layout(layout, ["local_output"])
    for name, dtypes in (
        ("idx_mapping", ("int32", "int64")),
        ("expanded_idx_mapping", ("int32", "int64")),
        ("expanded_local_pos", ("int32", "int64")),
        ("seq_lens", ("int32", "int64")),
        ("cu_num_logits", ("int32", "int64")),
    ):
        for dtype in dtypes:
            out[f"batch.{name}:{DTYPE}={dtype}"] = _batch_dtype(name, dtype)
    out["batch.idx_mapping_np:dtype=int32"] = lambda c, r: replace(c, edits=[*c.edits, "idx-mapping-np-int32"])
    out["batch.num_draft_tokens_per_req:dtype=int64"] = lambda c, r: (
        replace(c, spec_decode=True, edits=[*c.edits, "draft-counts-int64"]) if c.slots else None
    )
    for dtype in ("float32", "bfloat16", "float16"):
        out[f"logits_shard:{DTYPE}={dtype}"] = lambda c, r, d=dtype: replace(c, logits_dtype=d)
    for name in ("idx_mapping", "idx_mapping_np", "expanded_idx_mapping"):
        for value in ("min", "max"):
            out[f"batch.{name}:{VALUE}={value}"] = _slot(value)
    out["batch.num_draft_tokens_per_req:presence=present"] = lambda c, r: (
        replace(c, spec_decode=True) if c.slots else None
    )
    out["logprobs_dims:value=min"] = lambda c, r: replace(c, logprobs_dims=(0, int(r.integers(0, 4))))
    out["gather_num_nans:value=true"] = lambda c, r: replace(c, gather_num_nans=True)
    out["gather_num_nans:value=false"] = lambda c, r: replace(c, gather_num_nans=False)
    out["extension_fields:presence=present"] = _with_extension
    out["local_output.extensions:presence=present"] = _with_extension
    out["sharder.max_num_reqs:value=min"] = _capacity_one
    out["local_output.num_nans:presence=absent"] = _without_nan_counts
    limits = {
        "+inf": float("inf"),
        "-inf": float("-inf"),
        "nan": float("nan"),
        "largest": FLOAT32_MAX,
        "lowest": -FLOAT32_MAX,
        "subnormal": FLOAT32_SUBNORMAL,
    }
    for limit, value in limits.items():
        out[f"local_output.logprobs_tensors.logprobs:{VALUE}={limit}"] = _explicit_value("logprobs", value)
    for name, path in _EXPLICIT.items():
        if name == "logprobs":
            continue
        bounds = INT64 if name in ("sampled_token_ids", "logprob_token_ids", "selected_token_ranks") else INT32
        out[f"{path}:{VALUE}=dtype-max"] = _explicit_value(name, bounds[1])
        if name in ("sampled_token_ids", "logprob_token_ids"):
            out[f"{path}:{VALUE}=dtype-min"] = _explicit_value(name, bounds[0])
        if name in ("num_sampled", "num_rejected", "selected_token_ranks"):
            out[f"{path}:{VALUE}=min"] = _explicit_value(name, 0)
    return out


REALIZERS: dict[str, Callable] = _realizers()


def realizable(profile: str = DEFAULT_PROFILE) -> list[Variation]:
    """The variations of the space that a case can be made to draw on purpose."""
    return [v for v in input_space(profile) if v.key in REALIZERS]


def fill_gaps(cases: list, profile: str, rng) -> list:
    """``cases`` with every realizable variation that none of them draws made to appear in one of
    them: a covering selection on top of the random draw. Each change is kept only where the changed
    case then draws the variation and those made to appear in it before (measured, not assumed); a
    case may take several."""
    cases = list(cases)
    if not cases:
        return cases
    drawn = set().union(*(exercised(c) for c in cases))
    forced: dict[int, set[Variation]] = {}
    for variation in realizable(profile):
        if variation in drawn:
            continue
        for index in (int(i) for i in rng.permutation(len(cases))):
            changed = realize(cases[index], variation, rng)
            # Kept only if the case then draws it, and still draws what was made to appear in it before.
            if changed is not None and exercised(changed) >= forced.get(index, set()) | {variation}:
                cases[index] = changed
                forced.setdefault(index, set()).add(variation)
                drawn |= exercised(changed)
                break
    return cases


def realize(case, variation: Variation, rng):
    """``case`` changed so that it draws ``variation``, or None where this case cannot (no requests,
    no explicit outputs, a view the case format cannot make)."""
    realizer = REALIZERS.get(variation.key)
    return None if realizer is None else realizer(case, rng)
