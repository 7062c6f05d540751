"""Inputs as engines pass them: views, storage offsets and logits dtypes (spec/layouts.py).

A view keeps its values and changes only where they sit; the bytes around
it hold wrong values, so a contiguous reading of a view is detectably wrong.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_SEED

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.replay import run_case_in_process
from shardspec.fixtures import case_from_yaml, case_to_yaml
from shardspec.spec.case import Case, ExplicitLocalOutput, build_case_inputs, local_logits_shard
from shardspec.spec.layouts import (
    BATCH_ARRAYS,
    BATCH_TENSORS,
    FIELDS_2D,
    LAYOUT_FIELDS,
    LAYOUTS_2D,
    LOCAL_OUTPUT,
    OFFSET,
    OFFSET_ELEMENTS,
    STRIDED,
    lay_out_array,
    lay_out_sampler_output,
    lay_out_tensor,
)
from shardspec.spec.model import PROFILES
from shardspec.spec.profiles import rules_of

VIEWED = BATCH_TENSORS + BATCH_ARRAYS + ("logits_shard", "grammar_bitmask", LOCAL_OUTPUT)
SPEC_BATCH = dict(tp_size=2, slots=[4, 1, 2, 3, 6], num_logits_per_req=[2, 1, 3, 1, 2], grammar_positions=[2, 0])


@pytest.mark.parametrize("shape", [(5,), (3, 4), (0,)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bfloat16])
def test_strided_view_keeps_values_and_hides_others_in_the_gaps(shape, dtype):
    tensor = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape).to(dtype) + 1
    view = lay_out_tensor(tensor, STRIDED)
    assert view.dtype == dtype and view.shape == tensor.shape and torch.equal(view, tensor)
    if tensor.numel():
        assert not view.is_contiguous() and view.stride(-1) == 2
        as_if_contiguous = torch.as_strided(view, view.shape, tensor.stride())
        assert not torch.equal(as_if_contiguous, tensor)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16])
def test_offset_view_starts_inside_its_storage(dtype):
    tensor = torch.arange(1, 7, dtype=dtype).reshape(2, 3)
    view = lay_out_tensor(tensor, OFFSET)
    assert torch.equal(view, tensor) and view.is_contiguous() and view.storage_offset() == OFFSET_ELEMENTS
    from_storage_start = view.new_empty(0).set_(view.untyped_storage(), 0, view.shape, view.stride())
    assert not torch.equal(from_storage_start, tensor)


@pytest.mark.parametrize("layout", [STRIDED, OFFSET])
def test_host_array_views(layout):
    array = np.array([5, 1, 9, 3], dtype=np.intp)
    view = lay_out_array(array, layout)
    assert view.dtype == array.dtype and np.array_equal(view, array)
    assert view.base is not None  # a view into a larger buffer, not a copy
    assert (not view.flags.c_contiguous) if layout == STRIDED else view.ctypes.data != view.base.ctypes.data


@pytest.mark.parametrize("layout", [STRIDED, OFFSET])
def test_case_inputs_are_views_with_the_contiguous_values(layout):
    plain = Case("plain", **SPEC_BATCH)
    viewed = Case("viewed", **SPEC_BATCH, layouts={name: layout for name in VIEWED}, logits_dtype="float16")
    want, got = build_case_inputs(plain), build_case_inputs(viewed)
    for name in BATCH_TENSORS:
        tensor = getattr(got.batch, name)
        assert torch.equal(tensor, getattr(want.batch, name)), name
        assert (not tensor.is_contiguous()) if layout == STRIDED else tensor.storage_offset() > 0, name
    for name in BATCH_ARRAYS:
        assert np.array_equal(getattr(got.batch, name), getattr(want.batch, name)), name
    assert torch.equal(got.grammar.grammar_bitmask, want.grammar.grammar_bitmask)
    assert got.token_logits.dtype == torch.float16
    assert torch.equal(got.token_logits, want.token_logits.half())
    sorted_rows = torch.arange(sum(SPEC_BATCH["num_logits_per_req"]))
    shard = local_logits_shard(got, sorted_rows, viewed, rank=1)
    assert torch.equal(shard, local_logits_shard(want, sorted_rows, plain, rank=1).half())
    assert (not shard.is_contiguous()) if layout == STRIDED else shard.storage_offset() > 0


def test_layouts_and_dtype_survive_a_case_file():
    case = Case(
        "views", **SPEC_BATCH, layouts={"seq_lens": STRIDED, "cu_num_logits_np": OFFSET}, logits_dtype="bfloat16"
    )
    assert case_from_yaml(case_to_yaml(case)) == case
    assert "layouts" not in case_to_yaml(Case("plain", **SPEC_BATCH))  # older case files read back unchanged


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"layouts": {"seq_len": STRIDED}}, "unknown input field 'seq_len'"),
        ({"layouts": {"seq_lens": "transposed"}}, "unknown layout 'transposed'"),
        ({"logits_dtype": "float8"}, "unknown dtype 'float8'"),
    ],
)
def test_bad_layouts_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        build_case_inputs(Case("bad", **SPEC_BATCH, **fields))


@pytest.mark.parametrize("impl", ["reference", "production"])
@pytest.mark.parametrize("layout", [STRIDED, OFFSET])
def test_implementations_read_views_by_their_strides(impl, layout):
    case = Case(
        f"views-{layout}",
        **SPEC_BATCH,
        nan_tokens=[1],
        layouts={name: layout for name in VIEWED},
        logits_dtype="bfloat16",
    )
    result = run_case_in_process(case, ImplChoice(impl))
    assert (result.errors, result.violations) == ([], [])


@pytest.mark.parametrize("layout", [STRIDED, OFFSET])
def test_local_sampler_output_as_views(layout):
    case = Case(
        "explicit",
        rules=rules_of(VLLM_SEED),  # a sharder of one rank (vllm-0.33 and vllm-0.34 refuse it: PRE-TP-SIZE)
        tp_size=1,
        slots=[0, 1],
        num_logits_per_req=[2, 1],
        local_outputs={
            0: ExplicitLocalOutput(
                sampled_token_ids=[[5, 6], [7, 0]],
                num_sampled=[2, 1],
                num_rejected=[0, 0],
                num_nans=[0, 1, 2],
                logprob_token_ids=[[5, 1], [6, 2], [7, 3]],
                logprobs=[[-0.5, -1.0]] * 3,
                selected_token_ranks=[0, 1, 2],
            )
        },
    )
    plain = case.local_outputs[0].to_sampler_output("cpu")
    viewed = lay_out_sampler_output(plain, {LOCAL_OUTPUT: layout})
    for name in ("sampled_token_ids", "num_nans", "num_sampled", "num_rejected"):
        tensor = getattr(viewed, name)
        assert torch.equal(tensor, getattr(plain, name))
        assert (not tensor.is_contiguous()) if layout == STRIDED else tensor.storage_offset() > 0, name
    for got, want in zip(viewed.logprobs_tensors[:3], plain.logprobs_tensors[:3], strict=True):
        assert torch.equal(got, want)
    for impl in ("reference", "production"):
        result = run_case_in_process(replace(case, layouts={LOCAL_OUTPUT: layout}), ImplChoice(impl))
        assert (result.errors, result.violations) == ([], []), impl


@pytest.mark.parametrize("profile", PROFILES)
def test_two_dimensional_views_are_offered_for_the_fields_the_data_model_makes_two_dimensional(profile):
    from shardspec.conformance.cases.field_paths import path_of_layout_name
    from shardspec.conformance.cases.input_space import LAYOUT, input_space

    two_d = {v.field for v in input_space(rules_of(profile)) if v.axis == LAYOUT and v.value in LAYOUTS_2D}
    offered = {name for name in LAYOUT_FIELDS if two_d & set(path_of_layout_name(name))}
    # Where the profile's callers build contiguous inputs only (the layouts guarantee), no 2-D view is drawn.
    assert offered == (set() if rules_of(profile).contiguous_only else set(FIELDS_2D))
