"""A case: one sampling step described by a few numbers, and its inputs.

Fixtures (YAML), hypothesis-generated batches and benchmarks all describe a
step as a :class:`Case`; :func:`build_case_inputs` turns it into tensors. The
local sampler outputs are either the deterministic toy sampler run on each
rank's own full-vocab logits (``local_outputs = "toy"``) or given explicitly
per rank, which lets a case make ranks disagree on widths or omit logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from shardspec.spec.builders import build_grammar_output, build_input_batch, build_token_logits, sampled_token_ranges
from shardspec.spec.case_edits import (
    check_edit_names,
    edit_inputs,
    edit_logits_shard,
    edit_owner_table,
    edit_token_logits,
)
from shardspec.spec.documents import Requires
from shardspec.spec.layouts import (
    check_case_layout,
    lay_out_array,
    lay_out_batch,
    lay_out_grammar,
    lay_out_tensor,
    logits_dtype_of,
)
from shardspec.spec.model import (
    GrammarOutput,
    InputBatch,
    LogprobsTensors,
    SamplerOutput,
)
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules


@dataclass
class ExplicitLocalOutput:
    """One rank's local sampler output, written out (lists of Python numbers)."""

    sampled_token_ids: list[list[int]]  # [n_local][width]
    num_sampled: list[int]
    num_rejected: list[int]
    num_nans: list[int] | None = None  # per local logits row
    # None: this rank's sampler returned no logprobs.
    logprob_token_ids: list[list[int]] | None = None  # [L_local][cols]
    logprobs: list[list[float]] | None = None
    selected_token_ranks: list[int] | None = None
    # The sampler's own generated-token prefix sums, beside its logprobs (the gather does not read them).
    cu_num_generated_tokens: list[int] | None = None
    cu_num_generated_tokens_tensor: list[int] | None = None  # int32 on the device; profile vllm-0.33

    def to_sampler_output(self, device) -> SamplerOutput:
        # Rows and columns named (not -1): a width of 0 leaves no element to infer the rows from.
        width = max((len(row) for row in self.sampled_token_ids), default=1)
        rows = len(self.sampled_token_ids)
        ids = torch.tensor(self.sampled_token_ids, dtype=torch.int64, device=device).reshape(rows, width)
        logprobs = None
        if self.logprob_token_ids is not None:
            cols = max((len(row) for row in self.logprob_token_ids), default=1)
            shape = (len(self.logprob_token_ids), cols)
            logprobs = LogprobsTensors(
                torch.tensor(self.logprob_token_ids, dtype=torch.int64, device=device).reshape(shape),
                torch.tensor(self.logprobs, dtype=torch.float32, device=device).reshape(shape),
                torch.tensor(self.selected_token_ranks, dtype=torch.int64, device=device),
                None if self.cu_num_generated_tokens is None else list(self.cu_num_generated_tokens),
                None
                if self.cu_num_generated_tokens_tensor is None
                else torch.tensor(self.cu_num_generated_tokens_tensor, dtype=torch.int32, device=device),
            )
        return SamplerOutput(
            sampled_token_ids=ids,
            logprobs_tensors=logprobs,
            num_nans=None if self.num_nans is None else torch.tensor(self.num_nans, dtype=torch.int32, device=device),
            num_sampled=torch.tensor(self.num_sampled, dtype=torch.int32, device=device),
            num_rejected=torch.tensor(self.num_rejected, dtype=torch.int32, device=device),
        )


@dataclass
class Case:
    case_id: str
    tp_size: int
    slots: list[int]
    num_logits_per_req: list[int]
    description: str = ""
    # Spec IDs (INV-*, PRE-*, CL-*) this case exercises.
    spec_refs: list[str] = field(default_factory=list)
    max_num_reqs: int = 64
    max_num_logits_per_req: int = 4
    # None: speculative decoding iff some request has more than one row.
    spec_decode: bool | None = None
    # Batch positions listed by the grammar output, in its order; None: no grammar; []: one listing none.
    grammar_positions: list[int] | None = None
    vocab_size: int = 100
    seed: int = 0
    # Token indices whose logits hold NaNs.
    nan_tokens: list[int] = field(default_factory=list)
    gather_num_nans: bool = True
    logprobs_dims: tuple[int, int] | None = (2, 0)
    local_outputs: str | dict[int, ExplicitLocalOutput] = "toy"
    # A precondition ID the inputs violate on purpose; the step must raise.
    expect_error: str | None = None
    # Input field -> "strided" | "offset" | "row-padded" | "column-slice" (the last two for two-dimensional
    # tensors; spec/layouts.py); fields not named are contiguous.
    layouts: dict[str, str] = field(default_factory=dict)
    # dtype of the logits (the logits shard handed to all_to_all_logits): float32, bfloat16, float16.
    logits_dtype: str = "float32"
    # Extension fields the sampler returns and the gather is asked for: name -> {per, dtype, shape}
    # (spec/case_edits.py, CL-EXTENSION-FIELDS).
    extensions: dict[str, dict] = field(default_factory=dict)
    # Named edits of the built inputs (spec/case_edits.py): violations on purpose, or valid variants.
    edits: list[str] = field(default_factory=list)
    # A multi-step case: the steps after this one, called on the same sharder instance, as an engine
    # calls it every step (same tp_size and capacity; their own batches).
    then: list[Case] = field(default_factory=list)
    # On a step of an expanded multi-step case (see expand_steps): the id of the step before it,
    # whose sharder this step uses.
    continues: str | None = None
    # The rules of the profile the step is judged under (spec/profiles), resolved from its name where the
    # case is made (a case file under a profile, the command line); the fields below are vllm-0.33's.
    rules: Rules = field(default_factory=default_rules)
    # The rule values the case holds for (a fixture file's `requires`, matched as a spec entry's); empty:
    # every profile whose rules allow the fields it sets (fixtures.catalogue.case_rules).
    requires: Requires = ()
    # The sharder's adaptive_verification_enabled (CL-ADMITTED-DRAFTS).
    adaptive_verification: bool = False
    # Draft tokens admitted per request (at most n_i - 1 scheduled ones): the budget binds. None: no
    # admitted counts (num_admitted_draft_tokens None).
    admitted_drafts: list[int] | None = None
    # Rows S of each listed request's grammar block (CL-GRAMMAR-BLOCKS); None: max_num_logits_per_req.
    grammar_block_rows: int | None = None
    # Per grammar position, num_acceptable_drafts; None: the grammar output has none.
    num_acceptable_drafts: list[int] | None = None
    # Device fields of the batch in another integer dtype than the default, e.g. {"idx_mapping": "int32"}
    # (the local batch follows them in vllm-0.33, CL-LOCAL-DTYPES).
    batch_dtypes: dict[str, str] = field(default_factory=dict)
    # Tokens every request decoded since the batch's first step: each seq_len (and its bound) that much
    # longer, as an engine's next step of the same requests has them.
    seq_lens_growth: int = 0
    # Scheduled tokens of each request (q_i >= n_i: its logits rows are its last n_i tokens); None: the
    # builder's short default, n_i + slot % 3. A long prefill is a large q_i with n_i = 1.
    query_lens: list[int] | None = None
    # Owner rule owner_table: the entries of the step's owner table (slot -> owner) that differ from the
    # engine's initial table, slot mod tp (CL-OWNER-TABLE); None: the initial table. Entries of slots
    # past the capacity are left out of the table. An entry of a slot outside the batch is not read and
    # may hold anything (a stale owner, even one outside [0, tp)).
    owner_table: dict[int, int] | None = None

    @property
    def profile(self) -> str:
        """The name of the profile the step is judged under."""
        return self.rules.profile

    @property
    def padded_vocab_size(self) -> int:
        """Vocab padded to a multiple of 64 * tp_size, so shards have equal width."""
        unit = 64 * self.tp_size
        return -(-self.vocab_size // unit) * unit

    @property
    def shard_width(self) -> int:
        return self.padded_vocab_size // self.tp_size

    def sampled_tokens(self) -> list[range]:
        """Per request, the tokens whose logits rows are sampled: its device rows (1 + admitted drafts
        under CL-ADMITTED-DRAFTS, else its logits rows), laid out as build_case_inputs does."""
        rows = self.num_logits_per_req if self.admitted_drafts is None else [1 + a for a in self.admitted_drafts]
        return sampled_token_ranges(self.slots, rows)


def expand_steps(case: Case) -> list[Case]:
    """The steps of ``case`` as cases of their own, ``<id>.step<k>``, each continuing the one before;
    a single-step case is returned as it is."""
    if not case.then:
        return [case]
    steps = [replace(case, then=[])] + list(case.then)
    expanded = []
    for k, step in enumerate(steps):
        for name in ("tp_size", "max_num_reqs", "max_num_logits_per_req", "adaptive_verification"):
            if getattr(step, name) != getattr(case, name):
                raise ValueError(
                    f"case {case.case_id}: step {k} has {name} {getattr(step, name)}, the first "
                    f"step {getattr(case, name)}: the steps of a case share one sharder"
                )
        if step.then:
            raise ValueError(f"case {case.case_id}: step {k} has steps of its own")
        expanded.append(
            replace(step, case_id=f"{case.case_id}.step{k}", continues=expanded[-1].case_id if expanded else None)
        )
    return expanded


@dataclass
class CaseInputs:
    batch: InputBatch
    grammar: GrammarOutput | None
    # [num_tokens, padded_vocab] logits of every token, replicated; rank r's
    # vocab shard is columns [r * shard_width, (r + 1) * shard_width).
    token_logits: torch.Tensor
    # The keyword arguments of shard_sampler_inputs besides the batch and the grammar output: the owner
    # table under owner rule owner_table ({"owner_table": [max_num_reqs] int32 array}), else none.
    shard_kwargs: dict = field(default_factory=dict)


def owner_table_of(case: Case) -> list[int] | None:
    """The step's owner table under owner rule owner_table (None under the other rules): the engine's
    initial table, slot mod tp, with the case's entries over it (CL-OWNER-TABLE)."""
    if not case.rules.owner_by_table:
        return None
    entries = case.owner_table or {}
    return [int(entries.get(slot, slot % case.tp_size)) for slot in range(case.max_num_reqs)]


class _CaseTable(dict):
    """A case's owner-table entries, with slot mod tp for every slot they leave out (any slot: a case that
    violates PRE-SLOT-RANGE on purpose has owners too)."""

    def __init__(self, entries: dict | None, tp: int):
        super().__init__(entries or {})
        self.tp = tp

    def __missing__(self, slot: int) -> int:
        return slot % self.tp


def case_owners(case: Case) -> list[int]:
    """The owner of every batch position of ``case`` under its profile's owner rule (INV-OWNER)."""
    rules = case.rules
    table = _CaseTable(case.owner_table, case.tp_size) if rules.owner_by_table else None
    return rules.owners(case.slots, case.tp_size, table)


def build_case_inputs(case: Case, device: torch.device | str = "cpu") -> CaseInputs:
    check_case_layout(case.layouts, case.logits_dtype)
    check_case_profile(case)
    rules = case.rules
    batch = build_input_batch(
        case.slots,
        case.num_logits_per_req,
        spec_decode=case.spec_decode,
        device=device,
        admitted_drafts=case.admitted_drafts,
        seq_lens_upper_bound=rules.has_upper_bound,
        dtypes=case.batch_dtypes,
        seq_lens_growth=case.seq_lens_growth,
        query_lens=case.query_lens,
    )
    grammar = None
    if case.grammar_positions is not None:
        grammar = build_grammar_output(
            batch,
            case.grammar_positions,
            case.vocab_size,
            seed=case.seed + 1,
            block_rows=(case.grammar_block_rows or case.max_num_logits_per_req) if rules.grammar_blocks else None,
            num_acceptable_drafts=case.num_acceptable_drafts,
        )
    num_tokens = int(batch.query_start_loc[-1]) if batch.num_reqs else 0
    logits = build_token_logits(
        max(num_tokens, 1),
        case.padded_vocab_size,
        seed=case.seed,
        nan_rows=[t for t in case.nan_tokens if t < num_tokens],
    )
    check_edit_names(case.edits)
    logits = edit_token_logits(logits, batch.logits_indices.cpu(), case.edits)
    batch, grammar = edit_inputs(batch, grammar, case.edits)
    shard_kwargs = {}
    table = owner_table_of(case)
    if table is not None:
        edited = edit_owner_table(np.asarray(table, dtype=np.int32), batch, case.tp_size, case.edits)
        shard_kwargs["owner_table"] = lay_out_array(edited, case.layouts.get("owner_table", "contiguous"))
    return CaseInputs(
        batch=lay_out_batch(batch, case.layouts),
        grammar=lay_out_grammar(grammar, case.layouts),
        token_logits=logits.to(device, logits_dtype_of(case.logits_dtype)),
        shard_kwargs=shard_kwargs,
    )


# The case fields a profile's rules must allow: field -> (rule, the values that allow it).
PROFILE_FIELDS = {
    "adaptive_verification": ("adaptive_verification", ("present",)),
    "admitted_drafts": ("admitted_drafts", ("admitted",)),
    "grammar_block_rows": ("grammar_slicing", ("blocks",)),
    "num_acceptable_drafts": ("acceptable_drafts", ("sliced",)),
    "owner_table": ("owner", ("owner_table",)),
}
# An explicit local output's field, and the rule that allows it.
_TENSOR_RULE = ("adaptive_verification", ("present",))


def fields_outside(case: Case, rules: Rules) -> list[tuple[str, str, tuple[str, ...]]]:
    """(field, rule, the values that allow it) for each field ``case`` sets that ``rules`` do not allow."""
    found = []
    for name, (rule, allowed) in PROFILE_FIELDS.items():
        if getattr(case, name) not in (None, False) and getattr(rules, rule) not in allowed:
            found.append((name, rule, allowed))
    if getattr(rules, _TENSOR_RULE[0]) not in _TENSOR_RULE[1]:
        explicit = {} if case.local_outputs == "toy" else case.local_outputs
        for rank, out in sorted(explicit.items()):
            if out.cu_num_generated_tokens_tensor is not None:
                found.append((f"local_outputs.{rank}.cu_num_generated_tokens_tensor", *_TENSOR_RULE))
    return found


def construction_refusal(case: Case) -> str | None:
    """The precondition the case's sharder breaks when it is built (PRE-TP-SIZE, PRE-CAPACITY-TP: the
    profile's ``construction`` rule), or None. A case breaks one only on purpose, as its expect_error."""
    rules = case.rules
    if not rules.sharded_groups_only:
        return None
    if case.tp_size < rules.min_tp:
        return "PRE-TP-SIZE"
    if case.max_num_reqs < rules.min_capacity(case.tp_size):
        return "PRE-CAPACITY-TP"
    return None


def least_capacity(case: Case) -> int:
    """The smallest max_num_reqs the case's profile builds a sharder of its group with (PRE-CAPACITY-TP)."""
    return case.rules.min_capacity(case.tp_size)


def check_case_profile(case: Case) -> None:
    """Raise ValueError naming a field the case's profile's rules do not allow."""
    rules = case.rules
    outside = fields_outside(case, rules)
    if outside:
        name, rule, allowed = outside[0]
        raise ValueError(
            f"{name}: a field of profile rule {rule}: {' or '.join(allowed)}, not of {case.profile} "
            f"({rule}: {getattr(rules, rule)})"
        )


def local_logits_shard(inputs: CaseInputs, sorted_logits_indices: torch.Tensor, case: Case, rank: int) -> torch.Tensor:
    """What compute_logits_local yields on ``rank``: its vocab shard of the owner-sorted rows."""
    width = case.shard_width
    rows = inputs.token_logits[sorted_logits_indices.to(inputs.token_logits.device)]
    shard = rows[:, rank * width : (rank + 1) * width].contiguous()
    return lay_out_tensor(edit_logits_shard(shard, case.edits), case.layouts.get("logits_shard", "contiguous"))
