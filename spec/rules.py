"""The rules a profile sets: each one named, with the values it may take and what each value means.

A profile (``spec/profiles/<name>.yaml``) is a value for every rule here, inherited from the profile
it ``extends`` where it does not set one. Spec entries say which rule values they hold for
(``requires: {local_dtypes: batch}``); the reference, production, the suite and the goldens read a
profile's :class:`Rules`, never its name. Adding a release is a profile file; adding a rule is an
entry here, a field of :class:`Rules`, and the code that follows it.

No torch here: the command line reads profiles before a run starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardspec.spec import rule_meanings


@dataclass(frozen=True)
class Rule:
    """One rule: its name, what it decides, and each value it may take with what that value means.
    ``unsupported`` values are declared (a profile file may name them) but not implemented yet: a
    profile that selects one is refused when it is loaded."""

    name: str
    doc: str
    values: Mapping[str, str]
    unsupported: tuple[str, ...] = ()
    # A guarantee of the caller (what the profile's engine sends), not a behaviour of the sharder: a case that
    # breaks one is outside the contract (spec/guarantees.py), and no run of a sharder can tell its value.
    guarantee: bool = False


RULES: tuple[Rule, ...] = (
    Rule(
        "owner",
        "Which rank owns the request at batch position i (INV-OWNER).",
        {
            "slot_mod_tp": "idx_mapping[i] mod tp: the request's slot decides.",
            "position_mod_tp": "i mod tp: the request's batch position decides.",
            "owner_table": "owner_table[idx_mapping[i]]: an entry of the per-slot owner table passed with the step, "
            "which the engine carries across steps (CL-OWNER-TABLE).",
            "contiguous_ranges": "rank r owns the r-th of tp balanced contiguous ranges of batch positions "
            "(vllm-ascend's RFC #9269; CL-OWNER-CONTIGUOUS-RANGES).",
        },
    ),
    Rule(
        "empty_batch_padding",
        "How many requests per rank (M) the plan pads an empty batch to (CL-EMPTY-BATCH).",
        {
            "one": "M = 1: every collective stays non-empty.",
            "zero_or_one": "M = 0 or M = 1, the same on every rank of one implementation.",
        },
    ),
    Rule(
        "grammar_slicing",
        "How the grammar bitmask is laid out and sliced for the owners (PRE-GRAMMAR-BITMASK, INV-LOCAL-GRAMMAR).",
        {
            "rows": "one bitmask row per logits row of the listed requests (CL-GRAMMAR-BITMASK-ROWS).",
            "blocks": "a fixed-width block of S rows per listed request, sliced whole (CL-GRAMMAR-BLOCKS).",
        },
    ),
    Rule(
        "acceptable_drafts",
        "Whether GrammarOutput carries num_acceptable_drafts, sliced with the owners' blocks.",
        {
            "none": "GrammarOutput has two fields: request ids and the bitmask.",
            "sliced": "num_acceptable_drafts ([G] or None) is a third field, sliced with the blocks (needs blocks).",
        },
    ),
    Rule(
        "logprob_width",
        "How the engine chooses logprobs_dims = (k, t), which fixes the gathered width C = 1 + max(k, t).",
        {
            "as_passed": "C follows the dims the engine passes; it may leave the token ids out (t = 0).",
            "max_k_t": "the engine always passes both: C = 1 + max(num_logprobs, max_token_ids).",
        },
    ),
    Rule(
        "local_dtypes",
        "The dtypes of the local batch's device tensors (CL-LOCAL-DTYPES).",
        {
            "fixed": "int32 local tensors, whatever the batch's dtypes.",
            "batch": "each local tensor in the dtype of the batch field it is cut from.",
        },
    ),
    Rule(
        "admitted_drafts",
        "Whether admitted draft counts replace the scheduled ones (CL-ADMITTED-DRAFTS).",
        {
            "none": "num_admitted_draft_tokens is not the spec's: every scheduled row is a logits row.",
            "admitted": "num_admitted_draft_tokens, when given, sets the rows the device fields lay out.",
        },
    ),
    Rule(
        "seq_lens_upper_bound",
        "Whether seq_lens_cpu_upper_bound is the spec's, localized like seq_lens (CL-SEQ-LENS-UPPER-BOUND).",
        {
            "none": "not the spec's: the local batch keeps the batch's value (INV-LOCAL-UNLISTED-FIELDS).",
            "optional": "localized; the engine may pass None.",
            "always": "localized; the engine always passes it, and a batch without it is refused "
            "(PRE-SEQ-LENS-UPPER-BOUND).",
        },
    ),
    Rule(
        "adaptive_verification",
        "Whether the sharder takes adaptive_verification_enabled (INV-META-SCALARS, INV-CU-NUM-GENERATED).",
        {
            "absent": "no such argument; cu_num_generated_tokens_tensor is not an output.",
            "present": "a construction argument, reported in the metadata; it gathers cu_num_generated_tokens_tensor.",
        },
    ),
    Rule(
        "exchange",
        "The upstream call that exchanges the vocab shards; the spec's API is all_to_all_logits(shard, metadata).",
        {
            "all_to_all_logits": "all_to_all_logits(logits_shard, metadata), as the spec's API.",
            "all_to_all_vocab_shards": "all_to_all_vocab_shards(logits_shard, send_splits, num_local_rows); "
            "an adapter maps the spec's call to it.",
        },
    ),
    Rule(
        "communicator",
        "Which communicator issues the exchange; either way it is one collective on the TP group (INV-WIRE-SEQUENCE).",
        {
            "torch_distributed": "torch.distributed on the TP group's process group.",
            "engine": "the engine's own communicator of the TP group where enabled (e.g. PyNccl), "
            "torch.distributed otherwise.",
        },
    ),
    Rule(
        "construction",
        "Which groups and capacities a sharder may be constructed for (PRE-TP-SIZE, PRE-CAPACITY-TP). The "
        "engine settings a sharder never sees (a vocab-wide max_logprobs, sampling masks) are not the spec's.",
        {
            "any_group": "any tp >= 1 and max_num_reqs >= 1: a group of one runs the step unsharded.",
            "sharded_groups": "tp >= 2 and max_num_reqs >= tp, else the constructor raises: the engine turns "
            "batch-sharded sampling on only where every rank can own a request (vLLM's config, 0.33.0 and 0.34.0).",
        },
    ),
    # The caller's guarantees: what the profile's engine sends. A case that breaks one is outside the contract
    # (spec/guarantees.py): not a verdict on an implementation, run only by the robustness run.
    Rule(
        "layouts",
        "Which memory layouts the caller builds its input tensors and arrays in (spec/layouts.py).",
        {
            "contiguous": "contiguous only: a storage offset (a prefix of a persistent buffer) is still contiguous; "
            "strided, row-padded and column-slice views are outside the contract.",
            "views": "any view: strided, offset, row-padded, column-slice; the sharder reads every input by its "
            "strides.",
        },
        guarantee=True,
    ),
    Rule(
        "dtypes",
        "Which dtypes the caller passes for the host and device fields that allow several (the data model's dtypes).",
        {
            "engine": "the engine's own dtype per field: the data model's dtype, or its engine_dtype where the "
            "engine builds another; any other dtype is outside the contract.",
            "accepted": "every dtype the data model and PRE-DTYPES accept for the field.",
        },
        guarantee=True,
    ),
    Rule(
        "preconditions",
        "Who is responsible for the step's preconditions (shard and gather; construction refusals are the "
        "construction rule's).",
        {
            "trusted": "the caller: it never breaks one (vLLM's scheduler guarantees them), so a case that breaks one, "
            "MUST-reject or undefined, is outside the contract.",
            "enforced": "the sharder: it rejects every MUST-reject violation (INV-REJECT-INVALID) and may raise on an "
            "undefined one.",
        },
        guarantee=True,
    ),
    Rule(
        "extension_fields",
        "Whether the optional extension fields exist (CL-EXTENSION-FIELDS): gather_sampler_output's extension_fields.",
        {
            "none": "the caller never declares extension fields, even none at all: a case that does is outside the "
            "contract.",
            "declared": "the caller may declare extension fields, and the gather carries them.",
        },
        guarantee=True,
    ),
)

RULES_BY_NAME: dict[str, Rule] = {rule.name: rule for rule in RULES}
GUARANTEE_RULES: tuple[str, ...] = tuple(rule.name for rule in RULES if rule.guarantee)


@dataclass(frozen=True)
class Rules:
    """A profile's value of every rule (:data:`RULES`, in that order), and the profile's name."""

    profile: str
    owner: str
    empty_batch_padding: str
    grammar_slicing: str
    acceptable_drafts: str
    logprob_width: str
    local_dtypes: str
    admitted_drafts: str
    seq_lens_upper_bound: str
    adaptive_verification: str
    exchange: str
    communicator: str
    construction: str
    layouts: str
    dtypes: str
    preconditions: str
    extension_fields: str

    @classmethod
    def of(cls, profile: str, values: Mapping[str, str]) -> Rules:
        return cls(profile=profile, **{rule.name: values[rule.name] for rule in RULES})

    def as_dict(self) -> dict[str, str]:
        return {rule.name: getattr(self, rule.name) for rule in RULES}

    def holds(self, requires: tuple[tuple[str, tuple[str, ...]], ...]) -> bool:
        """Whether an entry that ``requires`` these rule values (rule, allowed values) holds here."""
        return all(getattr(self, rule) in allowed for rule, allowed in requires)

    # The questions the code asks most, each about one rule.
    @property
    def grammar_blocks(self) -> bool:
        return self.grammar_slicing == "blocks"

    @property
    def batch_dtypes(self) -> bool:
        return self.local_dtypes == "batch"

    @property
    def admits_drafts(self) -> bool:
        return self.admitted_drafts == "admitted"

    @property
    def has_upper_bound(self) -> bool:
        return self.seq_lens_upper_bound != "none"

    @property
    def upper_bound_required(self) -> bool:
        """seq_lens_cpu_upper_bound is never None (seq_lens_upper_bound: always)."""
        return self.seq_lens_upper_bound == "always"

    @property
    def adaptive(self) -> bool:
        return self.adaptive_verification == "present"

    @property
    def sharded_groups_only(self) -> bool:
        """Whether the constructor refuses small groups and capacities (PRE-TP-SIZE, PRE-CAPACITY-TP)."""
        return self.construction == "sharded_groups"

    @property
    def min_tp(self) -> int:
        """The smallest group a sharder may be constructed for (PRE-TP-SIZE)."""
        return 2 if self.construction == "sharded_groups" else 1

    def min_capacity(self, tp: int) -> int:
        """The smallest max_num_reqs a sharder of a group of ``tp`` may be constructed with (PRE-CAPACITY-TP)."""
        return tp if self.construction == "sharded_groups" else 1

    @property
    def contiguous_only(self) -> bool:
        """The caller builds every input contiguous (layouts: contiguous)."""
        return self.layouts == "contiguous"

    @property
    def engine_dtypes_only(self) -> bool:
        """The caller passes each field in the engine's own dtype (dtypes: engine)."""
        return self.dtypes == "engine"

    @property
    def trusts_caller(self) -> bool:
        """The caller guarantees the step's preconditions (preconditions: trusted)."""
        return self.preconditions == "trusted"

    @property
    def has_extension_fields(self) -> bool:
        """The caller may declare extension fields (extension_fields: declared)."""
        return self.extension_fields == "declared"

    @property
    def owner_by_table(self) -> bool:
        """Whether the step takes an owner table (owner rule owner_table, PRE-OWNER-TABLE)."""
        return self.owner == "owner_table"

    def owners(self, slots, tp: int, table=None) -> list[int]:
        """The owner of every batch position, for the batch's slots (INV-OWNER) and, under owner rule
        owner_table, the step's owner table (:func:`shardspec.spec.rule_meanings.owners`)."""
        return rule_meanings.owners(self.owner, slots, tp, table)


def rule_problem(name: str, value: object) -> str | None:
    """What is wrong with setting rule ``name`` to ``value``, in one line; None when nothing is."""
    rule = RULES_BY_NAME.get(name)
    if rule is None:
        return f"unknown rule {name!r} (rules: {', '.join(RULES_BY_NAME)})"
    if not isinstance(value, str) or value not in rule.values:
        return f"rule {name}: unknown value {value!r} (values: {', '.join(rule.values)})"
    if value in rule.unsupported:
        return f"rule {name}: value {value} is declared but not supported yet"
    return None


@dataclass(frozen=True)
class Needs:
    """A rule value that holds only with one of some values of another rule: a profile that sets it
    without them contradicts itself (the reference cannot follow both), and is refused when loaded."""

    rule: str
    value: str
    other: str
    allowed: tuple[str, ...]
    why: str


NEEDS: tuple[Needs, ...] = (
    Needs("acceptable_drafts", "sliced", "grammar_slicing", ("blocks",), "the counts are sliced with the blocks"),
    Needs(
        "admitted_drafts",
        "admitted",
        "grammar_slicing",
        ("blocks",),
        "rows a budget did not admit keep their place only in fixed-width blocks, CL-GRAMMAR-BLOCKS",
    ),
    Needs(
        "adaptive_verification",
        "present",
        "admitted_drafts",
        ("admitted",),
        "adaptive verification is what admits drafts: its batches may carry admitted counts",
    ),
)


def contradiction(values: Mapping[str, str]) -> str | None:
    """The first pair of rule values in ``values`` that :data:`NEEDS` says cannot hold together, in one
    line naming both rules; None when there is none."""
    for need in NEEDS:
        if values.get(need.rule) == need.value and values.get(need.other) not in need.allowed:
            return (
                f"rule {need.rule}: {need.value} needs {need.other}: {' or '.join(need.allowed)}, not "
                f"{values.get(need.other)} ({need.why})"
            )
    return None
