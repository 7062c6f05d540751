"""One violating input per precondition: rejected with exactly that ID.

Each violation starts from a valid batch (spec.builders) and breaks one
thing. The error must carry the precondition ID, the field, and the batch
position of the request at fault where there is one.
"""

import pathlib
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_033, VLLM_034_SHARDED_CACHE, VLLM_SEED

import shardspec.reference.preconditions as preconditions_module
from shardspec.comm import LoopbackComm
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_grammar_output, build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import ExtensionSpec, LogprobsTensors, SamplerOutput
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of

TP = 2
SLOTS = [4, 1, 6, 3, 0]
COUNTS = [1, 3, 2, 1, 2]


def _batch(**overrides):
    return replace(build_input_batch(SLOTS, COUNTS), **overrides)


def _sharder(rank=0, max_num_reqs=8, max_num_logits_per_req=4, profile=DEFAULT_PROFILE):
    return ReferenceSharder(max_num_reqs, max_num_logits_per_req, comm=LoopbackComm(rank, TP), rules=rules_of(profile))


def _shard(batch, grammar=None, **capacity):
    return _sharder(**capacity).shard_sampler_inputs(batch, grammar)


def _grammar_blocks(edit, block_rows=4):
    """The test batch and a vllm-0.33 grammar output for requests 2 and 0 (blocks of 4 rows), edited."""
    batch = build_input_batch(SLOTS, COUNTS)
    grammar = build_grammar_output(batch, [2, 0], 100, block_rows=block_rows, num_acceptable_drafts=[1, 0])
    return batch, edit(grammar)


def _with_tensor(name, edit):
    batch = build_input_batch(SLOTS, COUNTS)
    value = getattr(batch, name).clone()
    edit(value)
    return replace(batch, **{name: value})


def _gather(make_output, logprobs_dims=None, gather_num_nans=True, rank=0):
    """Shard on ``rank``, then gather the output ``make_output(local_batch)`` builds."""
    batch = build_input_batch(SLOTS, COUNTS)
    sharder = _sharder(rank)
    shard = sharder.shard_sampler_inputs(batch, None)
    sharder.gather_sampler_output(
        make_output(shard.local_batch),
        shard.metadata,
        batch,
        shard.local_batch,
        gather_num_nans=gather_num_nans,
        logprobs_dims=logprobs_dims,
    )


def _output(local_batch, num_rows=None, logprob_cols=3):
    n, rows = local_batch.num_reqs, local_batch.num_logits
    n = n if num_rows is None else num_rows
    return SamplerOutput(
        sampled_token_ids=torch.zeros(n, 2, dtype=torch.int64),
        logprobs_tensors=LogprobsTensors(
            torch.zeros(rows, logprob_cols, dtype=torch.int64),
            torch.zeros(rows, logprob_cols),
            torch.zeros(rows, dtype=torch.int64),
        ),
        num_nans=torch.zeros(rows, dtype=torch.int32),
        num_sampled=torch.ones(n, dtype=torch.int32),
        num_rejected=torch.zeros(n, dtype=torch.int32),
    )


def _grammar_with_rows(delta):
    batch = build_input_batch(SLOTS, COUNTS)
    grammar = build_grammar_output(batch, [2, 0], 100)
    bitmask = grammar.grammar_bitmask
    bitmask = bitmask[:-1] if delta < 0 else torch.cat([bitmask, bitmask[:1]])
    return batch, replace(grammar, grammar_bitmask=bitmask)


def _drafts_off_by_one():
    batch = build_input_batch(SLOTS, COUNTS)
    drafts = batch.num_draft_tokens_per_req.copy()
    drafts[3] += 1
    return replace(batch, num_draft_tokens_per_req=drafts, num_draft_tokens=int(drafts.sum()))


def _all_to_all_rows(extra: int):
    batch = build_input_batch(SLOTS, COUNTS)
    sharder = _sharder()
    shard = sharder.shard_sampler_inputs(batch, None)
    sharder.all_to_all_logits(torch.zeros(batch.num_logits + extra, 64), shard.metadata)


def _gather_extensions(declared, carried):
    """Gather with ``declared`` extension fields; the local output carries ``carried(local_batch)``."""
    batch = build_input_batch(SLOTS, COUNTS)
    sharder = _sharder()
    shard = sharder.shard_sampler_inputs(batch, None)
    output = replace(_output(shard.local_batch), extensions=carried(shard.local_batch))
    sharder.gather_sampler_output(output, shard.metadata, batch, shard.local_batch, extension_fields=declared)


MASK = ExtensionSpec(per="logits_row", dtype=torch.int32, shape=(4,))


# precondition ID -> (call that violates it, field named, batch position named or None)
def _shard_with_table(table):
    """The test batch on a sharder of 8 slots whose owners come from ``table`` (owner rule owner_table)."""
    sharder = _sharder(profile=VLLM_034_SHARDED_CACHE)
    return sharder.shard_sampler_inputs(build_input_batch(SLOTS, COUNTS), None, owner_table=table)


def _table_with(slot, owner):
    table = np.arange(8) % TP
    table[slot] = owner
    return table


VIOLATIONS = {
    # vllm-0.34 builds no sharder for one rank, or for fewer request slots than ranks (construction rule).
    "PRE-TP-SIZE": (
        lambda: ReferenceSharder(64, 4, comm=LoopbackComm(0, 1), rules=rules_of("vllm-0.34")),
        "tp_size",
        None,
    ),
    "PRE-CAPACITY-TP": (
        lambda: ReferenceSharder(1, 4, comm=LoopbackComm(0, 2), rules=rules_of("vllm-0.34")),
        "max_num_reqs",
        None,
    ),
    "PRE-OWNER-TABLE": (lambda: _shard_with_table(np.zeros(4, dtype=np.int64)), "owner_table", None),
    # slot 6, request 2, owned by a rank the group does not have
    "PRE-OWNER-TABLE-RANGE": (lambda: _shard_with_table(_table_with(6, TP)), "owner_table", 2),
    "PRE-BATCH-SIZE": (lambda: _shard(_batch(num_reqs=4)), "num_reqs", None),
    "PRE-CAPACITY-REQS": (lambda: _shard(build_input_batch(SLOTS, COUNTS), max_num_reqs=4), "num_reqs", None),
    "PRE-REQ-IDS-UNIQUE": (lambda: _shard(_batch(req_ids=["a", "b", "c", "b", "e"])), "req_ids", 3),
    "PRE-DTYPES": (lambda: _shard(_batch(idx_mapping=torch.tensor(SLOTS, dtype=torch.float32))), "idx_mapping", None),
    "PRE-SLOT-RANGE": (lambda: _shard(build_input_batch([4, 1, 8], [1, 1, 1])), "idx_mapping", 2),
    "PRE-SLOT-UNIQUE": (
        lambda: _shard(build_input_batch([4, 1, 4], [1, 1, 1], req_ids=["a", "b", "c"])),
        "idx_mapping",
        2,
    ),
    "PRE-HOST-DEVICE-MATCH": (
        lambda: _shard(_with_tensor("idx_mapping", lambda t: t.__setitem__(1, 7))),
        "idx_mapping",
        1,
    ),
    "PRE-CU-LOGITS": (
        lambda: _shard(_batch(cu_num_logits_np=np.array([1, 1, 4, 6, 7, 9], np.int32))),
        "cu_num_logits_np",
        None,
    ),
    "PRE-LOGITS-PER-REQ": (lambda: _shard(build_input_batch([4, 1, 6], [2, 0, 1])), "cu_num_logits", 1),
    "PRE-CAPACITY-LOGITS": (
        lambda: _shard(build_input_batch(SLOTS, COUNTS), max_num_logits_per_req=2),
        "cu_num_logits",
        1,
    ),
    "PRE-QUERY-START-LOC": (
        lambda: _shard(_with_tensor("query_start_loc", lambda t: t.__setitem__(3, t[2]))),
        "query_start_loc",
        2,
    ),
    "PRE-FIELD-SHAPES": (lambda: _shard(_batch(seq_lens=torch.ones(4, dtype=torch.int32))), "seq_lens", None),
    "PRE-LOGITS-TAIL": (
        lambda: _shard(_with_tensor("logits_indices", lambda t: t.__setitem__(4, t[4] - 1))),
        "logits_indices",
        2,
    ),
    "PRE-EXPANDED": (
        lambda: _shard(_with_tensor("expanded_local_pos", lambda t: t.__setitem__(2, 0))),
        "expanded_local_pos",
        1,
    ),
    "PRE-DRAFTS": (lambda: _shard(_drafts_off_by_one()), "num_draft_tokens_per_req", 3),
    "PRE-GRAMMAR-IDS": (
        lambda: _shard(
            build_input_batch(SLOTS, COUNTS),
            replace(
                build_grammar_output(build_input_batch(SLOTS, COUNTS), [1], 100),
                structured_output_request_ids=["req-99"],
            ),
        ),
        "structured_output_request_ids",
        None,
    ),
    # vllm-0.33: blocks of 4 rows for two requests, one row short (vllm-seed's row count: GRAMMAR_SEED below).
    "PRE-GRAMMAR-BITMASK": (
        lambda: _shard(*_grammar_blocks(lambda g: replace(g, grammar_bitmask=g.grammar_bitmask[:-1]))),
        "grammar_bitmask",
        None,
    ),
    "PRE-SEQ-LENS-UPPER-BOUND": (
        lambda: _shard(_batch(seq_lens_cpu_upper_bound=torch.ones(4, dtype=torch.int32))),
        "seq_lens_cpu_upper_bound",
        None,
    ),
    "PRE-LOCAL-OUTPUT": (
        lambda: _gather(lambda local: _output(local, num_rows=local.num_reqs + 1)),
        "sampled_token_ids",
        None,
    ),
    "PRE-LOGPROBS-DIMS": (lambda: _gather(_output, logprobs_dims=(2, -1)), "logprobs_dims", None),
    "PRE-LOGITS-SHARD": (lambda: _all_to_all_rows(1), "logits_shard", None),
    "PRE-EXTENSION-FIELDS": (
        lambda: _gather_extensions(None, lambda local: {"mask": torch.zeros(local.num_logits, 4, dtype=torch.int32)}),
        "extensions.mask",
        None,
    ),
    "PRE-EXTENSION-SUPPORTED": (
        lambda: _gather_extensions({"counts": ExtensionSpec(per="request", dtype=torch.int16)}, lambda local: None),
        "extension_fields",
        None,
    ),
}


@pytest.mark.parametrize(
    "carried",
    [
        pytest.param(lambda local: {}, id="declared-but-missing"),
        pytest.param(lambda local: {"mask": torch.zeros(local.num_logits, 4, dtype=torch.int64)}, id="wrong-dtype"),
        pytest.param(lambda local: {"mask": torch.zeros(local.num_reqs, 4, dtype=torch.int32)}, id="per-request-rows"),
    ],
)
def test_extension_field_variants_are_rejected(carried):
    with pytest.raises(PreconditionError) as caught:
        _gather_extensions({"mask": MASK}, carried)
    assert caught.value.precondition_id == "PRE-EXTENSION-FIELDS"


def test_declared_extension_field_with_matching_tensor_is_accepted():
    _gather_extensions({"mask": MASK}, lambda local: {"mask": torch.zeros(local.num_logits, 4, dtype=torch.int32)})


def _precondition_ids_in_reference() -> set[str]:
    folder = pathlib.Path(preconditions_module.__file__).parent
    source = "".join(
        (folder / name).read_text() for name in ("preconditions.py", "output_preconditions.py", "profile_rules.py")
    )
    return set(re.findall(r'"(PRE-[A-Z0-9-]+)"', source))


def test_every_precondition_of_the_reference_has_a_violation():
    assert set(VIOLATIONS) == _precondition_ids_in_reference()


@pytest.mark.parametrize("precondition_id", sorted(VIOLATIONS))
def test_violation_is_rejected_with_its_id(precondition_id):
    violate, field, request = VIOLATIONS[precondition_id]
    with pytest.raises(PreconditionError) as caught:
        violate()
    error = caught.value
    assert error.precondition_id == precondition_id, str(error)
    assert error.field == field, str(error)
    assert f"field {field}" in str(error) and f"[{precondition_id}]" in str(error)
    assert error.request == request, str(error)
    if request is not None:
        assert f"request {request}" in str(error)


@pytest.mark.parametrize(
    "make_output",
    [
        pytest.param(lambda local: None, id="none-while-owning"),
        pytest.param(lambda local: replace(_output(local), num_nans=None), id="no-nan-counts"),
        pytest.param(
            lambda local: replace(_output(local), num_sampled=torch.ones(local.num_reqs + 2, dtype=torch.int32)),
            id="num-sampled-shape",
        ),
    ],
)
def test_local_output_variants_are_rejected(make_output):
    with pytest.raises(PreconditionError) as caught:
        _gather(make_output, logprobs_dims=(2, 0))
    assert caught.value.precondition_id == "PRE-LOCAL-OUTPUT"


def test_rank_owning_nothing_may_pass_none():
    batch = build_input_batch([2], [1])  # rank 1 owns nothing, whether by slot or by position
    sharder = ReferenceSharder(8, 4, comm=LoopbackComm(1, TP))
    shard = sharder.shard_sampler_inputs(batch, None)
    out = sharder.gather_sampler_output(
        None, shard.metadata, batch, shard.local_batch, gather_num_nans=True, logprobs_dims=(2, 0)
    )
    assert out.sampled_token_ids.shape == (1, 1)


def test_rejection_writes_nothing():
    """Capacity violations raise before any output exists (INV-REJECT-INVALID): inputs stay intact."""
    batch = build_input_batch([4, 1, 9], [1, 1, 1])
    before = batch.idx_mapping.clone()
    with pytest.raises(PreconditionError):
        _shard(batch)
    assert torch.equal(batch.idx_mapping, before)


@pytest.mark.parametrize("dims", [(-1, 0), (-3, -2), (2,)], ids=str)
def test_rank_owning_nothing_rejects_bad_logprobs_dims_too(dims):
    """logprobs_dims is replicated, so every rank must reject it, not only owners."""
    batch = build_input_batch([2], [1])  # rank 1 owns nothing, whether by slot or by position
    sharder = ReferenceSharder(8, 4, comm=LoopbackComm(1, TP))
    shard = sharder.shard_sampler_inputs(batch, None)
    with pytest.raises(PreconditionError) as caught:
        sharder.gather_sampler_output(None, shard.metadata, batch, shard.local_batch, logprobs_dims=dims)
    assert caught.value.precondition_id == "PRE-LOGPROBS-DIMS"


# -- what each profile adds or words its own way -------------------------------------------------


@pytest.mark.parametrize("delta", [-1, 1])
def test_seed_grammar_needs_one_row_per_logits_row(delta):
    with pytest.raises(PreconditionError) as caught:
        _shard(*_grammar_with_rows(delta), profile=VLLM_SEED)
    assert caught.value.precondition_id == "PRE-GRAMMAR-BITMASK"


@pytest.mark.parametrize(
    ("edit", "block_rows", "position"),
    [
        pytest.param(lambda g: replace(g, num_acceptable_drafts=[0]), 4, None, id="acceptable-count-short"),
        pytest.param(lambda g: g, 1, 2, id="block-below-the-rows-of-request-2"),
        pytest.param(lambda g: replace(g, grammar_bitmask=g.grammar_bitmask[0]), 4, None, id="one-dim"),
    ],
)
def test_grammar_blocks_are_checked(edit, block_rows, position):
    with pytest.raises(PreconditionError) as caught:
        _shard(*_grammar_blocks(edit, block_rows), profile=VLLM_033)
    assert (caught.value.precondition_id, caught.value.request) == ("PRE-GRAMMAR-BITMASK", position), str(caught.value)


def test_wide_grammar_blocks_move_whole_with_their_counts():
    batch, grammar = _grammar_blocks(lambda g: g, block_rows=6)
    # vLLM 0.33: rank 0 owns request 2 (slot 2) and 0 (slot 4), and the counts move with the blocks
    local = _shard(batch, grammar, profile=VLLM_033).local_grammar_output
    assert local.structured_output_request_ids == grammar.structured_output_request_ids
    assert torch.equal(local.grammar_bitmask, grammar.grammar_bitmask) and local.num_acceptable_drafts == [1, 0]


def _admitted(admitted, **overrides):
    batch = build_input_batch(SLOTS, COUNTS, admitted_drafts=admitted, seq_lens_upper_bound=True)
    return replace(batch, **overrides)


@pytest.mark.parametrize(
    ("make_batch", "field", "position"),
    [
        pytest.param(lambda: _admitted([0, 3, 1, 0, 1]), "num_admitted_draft_tokens", 1, id="above-scheduled"),
        pytest.param(lambda: _admitted([0, 1, 1, 0, 1], num_draft_tokens=5), "num_draft_tokens", None, id="total"),
        pytest.param(
            lambda: _admitted([0, 1, 1, 0, 1], num_draft_tokens_per_req=None),
            "num_admitted_draft_tokens",
            None,
            id="without-scheduled-counts",
        ),
    ],
)
def test_admitted_draft_counts_are_checked(make_batch, field, position):
    with pytest.raises(PreconditionError) as caught:
        _shard(make_batch())
    assert (caught.value.precondition_id, caught.value.field, caught.value.request) == ("PRE-DRAFTS", field, position)


def test_admitted_counts_move_the_plan_to_the_admitted_rows():
    shard = _shard(_admitted([0, 1, 0, 0, 0]))  # scheduled rows 1, 3, 2, 1, 2; admitted 1, 2, 1, 1, 1
    assert shard.metadata.num_logits_per_rank == [3, 3] and shard.metadata.max_num_logits_per_req == 2
    assert shard.local_batch.num_draft_tokens == 0 and shard.local_batch.cu_num_logits_np.tolist() == [0, 1, 2, 3]


def test_the_seed_profile_ignores_vllm_033_fields():
    batch = build_input_batch(SLOTS, COUNTS, seq_lens_upper_bound=True)
    shard = _shard(replace(batch, seq_lens_cpu_upper_bound=torch.ones(2)), profile=VLLM_SEED)
    assert shard.local_batch.seq_lens_cpu_upper_bound is not None  # an engine's field, carried over
