"""The input space of one step, as data: every variation each input field can take, derived from the spec.

The spec's data model (spec/data_model.yaml) says, per input field, its type, dtype, shape, placement
and whether it is optional, and in structured keys its value range (``values: {min, max, limits}``)
and every dtype the spec allows (``dtypes``). From that alone :func:`input_space` derives the
variations of each field, along six axes:

* ``value``: both ends of its range (``min``, ``max``) and, with ``limits``, the dtype's limits
  (``+inf``, ``-inf``, ``nan``, ``largest``, ``lowest``, ``subnormal`` for floats; ``dtype-min``,
  ``dtype-max`` for integers); ``true`` and ``false`` for a bool; each of its named ``variants``
  (the owner table's: cases/owner_tables.py);
* ``dtype``: every dtype the spec allows that the profile's callers send (its ``dtypes`` rule: for a batch
  field, the engine's own or every accepted one), where that is more than one;
* ``layout``: every view engines produce: ``contiguous``, ``strided`` (``t[::2]``), ``offset`` (past
  its storage's first element) and, for a two-dimensional tensor, ``row-padded`` (rows further apart
  than their width: the leading columns of a wider buffer) and ``column-slice`` (columns from the
  middle of a wider buffer);
* ``presence``: ``present`` and ``absent`` for an optional field;
* ``dims``: ``empty`` for a field whose leading size may be 0 (no requests, a rank that owns none);
  ``large`` for an optional collection of per-request or per-row entries (the extension fields):
  present in a batch of at least :data:`LARGE_BATCH` requests, where a gather that is right only for
  small batches (an unrolled path, one block) shows;
* ``pair``: two variations of one field drawn together on purpose (one case draws both): each of its
  dtypes with each of its non-contiguous layouts and with each limit of its values; a defect in the
  strided int32 path, or in float16's infinities, needs both. Left out: float32's largest, lowest and
  smallest subnormal in float16 and bfloat16 logits, which round to infinities and 0 there
  (:data:`PAIRS_LEFT_OUT`). Across fields: each field a profile adds (admitted draft counts, the bound
  present and absent, adaptive verification, each batch dtype other than the default) with each optional
  output (logprobs, grammar, extension fields, NaN counts), :func:`profile_output_pairs`;
* ``size``: ``empty`` and ``largest`` of every size of the data model (its symbols: N, L, n, L_local,
  G, k, t, w, c, E, and the batch's draft count and the extension fields' count), the largest being what
  the construction arguments or the vocabulary allow, or where nothing bounds a size, one past what a
  fixed buffer would hold (cases/sizes.py, which says why the other symbols have none);
* ``step``: ``changed`` for each argument an engine may change between consecutive steps of one
  sharder (the sharder's construction parameters are fixed for its lifetime); ``changed`` for each
  field of :data:`LOOP_FIELDS` as well, where the step has the same requests as the one before and that
  field moved (a decode loop), and ``repeated`` for the batch, where nothing but the logits moved; for state
  the engine carries (:data:`CARRIED_FIELDS`), each form in which it may hold it across a step.

A field added to the YAML gets its variations here without new code. What a case exercises is
measured by :func:`exercised` from the case itself; :func:`coverage` sets that against the space,
so a variation the model allows but no case drew is listed as not covered. How to make a case draw
a variation on purpose is cases/realizers.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from shardspec.conformance.cases.owner_tables import CARRIED
from shardspec.conformance.cases.sizes import SIZE, size_variations
from shardspec.spec.guarantees import sends_layout
from shardspec.spec.loader import _package_root, document_schema, load_yaml_document
from shardspec.spec.rules import Rules

VALUE, DTYPE, LAYOUT, PRESENCE, DIMS, STEP = "value", "dtype", "layout", "presence", "dims", "step"
PAIR = "pair"
AXES = (VALUE, DTYPE, LAYOUT, PRESENCE, DIMS, STEP, PAIR, SIZE)
LAYOUTS_1D = ("contiguous", "strided", "offset")
LAYOUTS_2D = LAYOUTS_1D + ("row-padded", "column-slice")
FLOAT_LIMITS = ("+inf", "-inf", "nan", "largest", "lowest", "subnormal")
INT_LIMITS = ("dtype-min", "dtype-max")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "logits")
# The dtype limits the space names (float32's for the logits, whatever their dtype).
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_SUBNORMAL = 1.401298464324817e-45
# Sizes that may be 0: an empty batch, a rank that owns no request.
ZERO_SIZES = ("N", "L", "n", "L_local")
# What an engine changes between two steps of the same requests: seq_lens (one token longer each step) and
# their bound, the rows per request (drafts), the drafts admitted (a budget that binds otherwise), the batch
# order, the requests the grammar lists. A field a profile lacks has no variation under it.
LOOP_FIELDS = (
    "batch.seq_lens",
    "batch.seq_lens_cpu_upper_bound",
    "batch.cu_num_logits",
    "batch.num_admitted_draft_tokens",
    "batch.idx_mapping",
    "grammar.structured_output_request_ids",
)
# State the engine carries from step to step, and each form in which it may hold it across a step (the owner
# table's, cases/owner_tables.py).
CARRIED_FIELDS = {"owner_table": CARRIED}
# A large batch: more requests than any small one draws and more than a 64-entry block.
LARGE_BATCH = 65
# The inputs that exist only where the profile's callers may declare extension fields (extension_fields rule).
EXTENSION_PATHS = ("extension_fields", "local_output.extensions")
EXTENSION_SIZES = ("extension_fields", "E")  # their count and an entry's trailing shape (cases/sizes.py)


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
    variants: tuple[str, ...] = ()
    top_level: bool = False
    fixed: bool = False  # constant for a sharder's lifetime (its construction parameters)
    # The layouts the profile's callers pass it in (its rank decides which of them a field can take).
    layouts: tuple[str, ...] = LAYOUTS_2D


# -------------------------------------------------------------------- the model


def holds(entry: dict, rules: Rules | None) -> bool:
    """Whether a raw entry holds under ``rules``: every rule value its ``requires`` names is theirs."""
    requires = entry.get("requires")
    if rules is None or not requires:
        return True
    return all(getattr(rules, rule) in (v if isinstance(v, list) else [v]) for rule, v in requires.items())


def input_fields(data_model: dict, rules: Rules | None) -> list[InputField]:
    """The input fields of the raw data model (the ``arguments`` section, records expanded by their
    type), under ``rules``. An argument that hands back what an earlier step returned, or the same
    record as an earlier argument, is not an input of its own."""
    types = {}
    for entry in data_model["types"]:
        types.setdefault(entry["name"], []).append(entry)
    returned = {o.get("ref") for o in data_model["outputs"] if o.get("ref")}
    seen_refs: set[str] = set()
    fields: list[InputField] = []

    def add(entry: dict, path: str, top: bool, fixed: bool) -> None:
        if rules is not None and not rules.has_extension_fields and path in EXTENSION_PATHS:
            return  # an input the profile's callers never pass
        fields.append(
            InputField(
                path=path,
                type=entry["type"],
                placement=entry["placement"],
                dtype=entry.get("dtype"),
                dtypes=_sent_dtypes(entry, path, rules),
                shape=None if entry.get("shape") is None else tuple(str(s) for s in entry["shape"]),
                optional=bool(entry.get("optional", False)),
                values=tuple(sorted((entry.get("values") or {}).items())),
                variants=tuple(entry.get("variants") or ()),
                top_level=top,
                fixed=fixed,
                layouts=tuple(layout for layout in LAYOUTS_2D if rules is None or sends_layout(rules, layout)),
            )
        )
        ref = entry.get("ref")
        if ref:
            for record in types.get(ref, []):
                for sub in record["fields"]:
                    if holds(sub, rules):
                        add(sub, f"{path}.{sub['name']}", False, fixed)
        for sub in entry.get("fields", []):
            if holds(sub, rules):
                add(sub, f"{path}.{sub['name']}", False, fixed)

    for argument in data_model["arguments"]:
        if not holds(argument, rules) or argument.get("view") == "local":
            continue
        ref = argument.get("ref")
        if ref and (ref in seen_refs or (ref in returned and argument["step"] != "shard")):
            continue
        if ref:
            seen_refs.add(ref)
        # The sharder's construction parameters: an object argument with fields of its own.
        add(argument, argument["name"], True, argument["type"] == "object")
    return fields


def _sent_dtypes(entry: dict, path: str, rules: Rules | None) -> tuple[str, ...]:
    """The dtypes of ``entry`` that the callers of ``rules`` send (the dtypes rule, spec/guarantees.py): every one the
    data model lists, or for a batch field under dtypes: engine, the engine's own (its dtype and engine_dtype)."""
    listed = tuple(entry.get("dtypes", ()))
    if rules is None or not path.startswith("batch.") or not rules.engine_dtypes_only:
        return listed
    return tuple(d for d in listed if d in (entry.get("dtype"), entry.get("engine_dtype")))


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
    out += [(VALUE, variant) for variant in field.variants]
    if len(field.dtypes) > 1:
        out += [(DTYPE, d) for d in field.dtypes]
    if field.type in ("tensor", "ndarray"):
        two_d = field.type == "tensor" and field.shape is not None and len(field.shape) == 2
        out += [(LAYOUT, layout) for layout in (LAYOUTS_2D if two_d else LAYOUTS_1D) if layout in field.layouts]
        if field.shape and field.shape[0] in ZERO_SIZES:
            out.append((DIMS, "empty"))
    if field.optional:
        out += [(PRESENCE, "present"), (PRESENCE, "absent")]
    if field.optional and field.type.startswith("dict["):
        out.append((DIMS, "large"))
    if (field.top_level and not field.fixed) or field.path in LOOP_FIELDS:
        out.append((STEP, "changed"))
    if field.path == "batch":
        out.append((STEP, "repeated"))
    out += [(STEP, form) for form in CARRIED_FIELDS.get(field.path, ())]
    return [Variation(field.path, axis, value) for axis, value in out]


# Pairs no input can draw, and why (the input space leaves them out).
PAIRS_LEFT_OUT = {
    (dtype, limit): f"float32's {limit} value rounds to an infinity or 0 in {dtype}"
    for dtype in ("float16", "bfloat16")
    for limit in ("largest", "lowest", "subnormal")
}


def pair(field: str, first: tuple[str, str], second: tuple[str, str]) -> Variation:
    """The pair variation of ``field`` drawing (axis, value) ``first`` and ``second`` together."""
    return Variation(field, PAIR, f"{first[0]}={first[1]},{second[0]}={second[1]}")


def pair_parts(variation: Variation) -> tuple[Variation, Variation]:
    """The two variations a pair variation draws together (of one field, or of the two ``a+b`` names)."""
    fields = variation.field.split("+") if "+" in variation.field else [variation.field] * 2
    parts = variation.value.split(",")
    return tuple(Variation(field, *part.split("=", 1)) for field, part in zip(fields, parts, strict=True))


# What a profile adds to the inputs, and the optional outputs a gather may be asked for: each of the first
# is drawn with each of the second on purpose (the batch's dtypes: each one other than a field's default).
# A profile's field met an optional output only by chance before.
PROFILE_PARTS = (
    ("batch.num_admitted_draft_tokens", PRESENCE, "present"),
    ("batch.seq_lens_cpu_upper_bound", PRESENCE, "present"),
    ("batch.seq_lens_cpu_upper_bound", PRESENCE, "absent"),
    ("sharder.adaptive_verification_enabled", VALUE, "true"),
)
OPTIONAL_OUTPUTS = (
    ("logprobs_dims", PRESENCE, "present"),
    ("grammar", PRESENCE, "present"),
    ("extension_fields", PRESENCE, "present"),
    ("gather_num_nans", VALUE, "true"),
)
# Pairs of a profile's field and an optional output that no input can draw, and why (none so far).
CROSS_PAIRS_LEFT_OUT: dict[tuple[str, str], str] = {}


def cross_pair(first: Variation, second: Variation) -> Variation:
    """The pair variation drawing ``first`` and ``second``, of two fields, together."""
    return Variation(f"{first.field}+{second.field}", PAIR, f"{first.axis}={first.value},{second.axis}={second.value}")


def profile_output_pairs(variations: list[Variation]) -> list[Variation]:
    """Each profile part of ``variations`` (one profile's space) with each optional output it has."""
    have = set(variations)
    defaults: dict[str, str] = {}
    for v in variations:
        if v.axis == DTYPE and v.field.startswith("batch."):
            defaults.setdefault(v.field, v.value)  # the data model lists a field's default dtype first
    parts = [Variation(*p) for p in PROFILE_PARTS if Variation(*p) in have]
    parts += [v for v in variations if v.axis == DTYPE and v.field in defaults and v.value != defaults[v.field]]
    outputs = [Variation(*o) for o in OPTIONAL_OUTPUTS if Variation(*o) in have]
    return [
        cross_pair(part, output)
        for part in parts
        for output in outputs
        if (part.key, output.key) not in CROSS_PAIRS_LEFT_OUT
    ]


def pairs_of(variations: list[Variation]) -> list[Variation]:
    """Each dtype of one field's variations with each of its non-contiguous layouts and value limits."""
    dtypes = [v.value for v in variations if v.axis == DTYPE]
    others = [(v.axis, v.value) for v in variations if (v.axis == LAYOUT and v.value != "contiguous")]
    others += [(VALUE, v.value) for v in variations if v.axis == VALUE and v.value in FLOAT_LIMITS + INT_LIMITS]
    return [
        pair(variations[0].field, (DTYPE, dtype), other)
        for dtype in dtypes
        for other in others
        if (dtype, other[1]) not in PAIRS_LEFT_OUT
    ]


def left_out(data_model: dict, rules: Rules | None) -> dict[str, str]:
    """The pairs the space leaves out under ``rules``, each with why (what the reports list beside it)."""
    out = {}
    for field in input_fields(data_model, rules):
        single = variations_of(field)
        dtypes = [v.value for v in single if v.axis == DTYPE]
        for v in single:
            for dtype in dtypes:
                if (dtype, v.value) in PAIRS_LEFT_OUT and v.axis == VALUE:
                    out[pair(field.path, (DTYPE, dtype), (VALUE, v.value)).key] = PAIRS_LEFT_OUT[(dtype, v.value)]
    for (first, second), why in CROSS_PAIRS_LEFT_OUT.items():
        parts = [Variation(key.split(":")[0], *key.split(":", 1)[1].split("=", 1)) for key in (first, second)]
        out[cross_pair(*parts).key] = why
    return out


@cache
def pairs_left_out(rules: Rules) -> dict[str, str]:
    """:func:`left_out` of the spec's data model."""
    return left_out(raw_data_model(), rules)


def derive(data_model: dict, rules: Rules | None) -> tuple[Variation, ...]:
    """The input space of a raw data model (pure: no files read)."""
    out = []
    for field in input_fields(data_model, rules):
        single = variations_of(field)
        out += single + (pairs_of(single) if single else [])
    sizes = [Variation(*v) for v in size_variations()]
    if rules is not None and not rules.has_extension_fields:
        sizes = [v for v in sizes if v.field not in EXTENSION_SIZES]
    return tuple(out + profile_output_pairs(out)) + tuple(sizes)


def raw_data_model() -> dict:
    """spec/data_model.yaml as the loader reads and validates it, structured keys included."""
    return load_yaml_document(_package_root().joinpath("data_model.yaml"), document_schema("data_model"))


@cache
def input_space(rules: Rules) -> tuple[Variation, ...]:
    """Every variation of every input field of the spec under ``rules``."""
    return derive(raw_data_model(), rules)
