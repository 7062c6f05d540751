"""Every output of every step is constrained, and every name resolves."""

import pytest

from shardspec.spec.loader import load_spec

STEPS = ("shard", "all_to_all", "gather", "step")


@pytest.fixture(scope="module")
def spec():
    return load_spec()


def test_every_output_field_is_constrained_by_a_must_or_should_invariant(spec):
    named = {
        name for inv in spec.invariants if not inv.retired and inv.level in ("MUST", "SHOULD") for name in inv.fields
    }
    unconstrained = [path for path, _ in spec.data_model.output_leaves() if path not in named]
    assert not unconstrained, f"outputs no invariant constrains: {unconstrained}"


def test_every_step_has_outputs_and_invariants(spec):
    for step in STEPS:
        assert any(o.step == step for o in spec.data_model.outputs), step
        assert any(i.step == step for i in spec.invariants), step


def test_the_wire_buffers_are_outputs(spec):
    for name in (
        "wire.all_to_all",
        "wire.all_gather_sampled",
        "wire.all_gather_logprob_ids",
        "wire.all_gather_logprobs",
        "wire.all_gather_extensions",
        "wire.sequence",
    ):
        buffer = spec.data_model.resolve_output(name)
        assert buffer is not None and buffer.type == "collective", name
    for name in (
        "wire.all_to_all",
        "wire.all_gather_sampled",
        "wire.all_gather_logprob_ids",
        "wire.all_gather_logprobs",
        "wire.all_gather_extensions",
    ):
        buffer = spec.data_model.resolve_output(name)
        assert buffer.dtype and buffer.shape and buffer.received_shape and buffer.layout, name


def test_every_invariant_field_resolves_to_an_output(spec):
    for inv in spec.invariants:
        for name in inv.fields:
            assert spec.data_model.resolve_output(name) is not None, (inv.id, name)


def test_every_precondition_field_resolves_to_an_argument(spec):
    for pre in spec.preconditions:
        for name in pre.fields:
            assert spec.data_model.resolve_argument(name) is not None, (pre.id, name)


def test_nested_paths_resolve_through_referenced_types(spec):
    model = spec.data_model
    assert model.resolve_output("gathered.logprobs_tensors.logprobs").dtype == "float32"
    assert model.resolve_output("local_batch.idx_mapping").local.dtype == "input"
    seed = load_spec(profile="vllm-seed").data_model
    assert seed.resolve_output("local_batch.idx_mapping").local.dtype == "int32"
    assert model.resolve_output("local_batch.no_such_field") is None
    assert model.resolve_argument("sharder.max_num_reqs").type == "int"


def test_every_batch_field_says_whether_it_is_localized(spec):
    batch = spec.data_model.type("InputBatch")
    assert all(f.local is not None for f in batch.fields)
    assert [f.name for f in batch.fields if f.local.scope == "global"] == ["query_start_loc"]
