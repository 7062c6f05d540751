"""data_model.yaml and the Python data model (and what the reference produces) agree."""

import dataclasses

import numpy as np
import pytest
import torch

from shardspec.comm import LockstepGroup
from shardspec.reference import ReferenceSharder
from shardspec.reference.sampler import toy_sample
from shardspec.spec import model as py_model
from shardspec.spec.builders import build_grammar_output, build_input_batch, build_token_logits
from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import rules_of

TP, VOCAB, LOGPROBS_DIMS = 2, 100, (2, 3)
TORCH_DTYPES = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32}
NUMPY_DTYPES = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "intp": np.intp}


@pytest.fixture(scope="module", params=py_model.PROFILES)
def spec(request):
    return load_spec(profile=request.param)


def _python_fields(cls) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls._fields)  # NamedTuple


def test_types_mirror_the_python_classes_field_by_field(spec):
    mirrored = [t for t in spec.data_model.types if t.python]
    assert {t.python for t in mirrored} == {
        "InputBatch",
        "GrammarOutput",
        "SamplerOutput",
        "LogprobsTensors",
        "BatchShardMetadata",
        "ShardResult",
        "ExtensionSpec",
    }
    for type_spec in mirrored:
        names, python = [f.name for f in type_spec.fields], _python_fields(getattr(py_model, type_spec.python))
        # The Python classes carry every profile's fields: a profile's come first, in order, and the
        # fields only other profiles have come after them.
        assert names == python[: len(names)], type_spec.name


def test_every_python_field_belongs_to_some_profile():
    fields: dict[str, set[str]] = {}
    for profile in py_model.PROFILES:
        for type_spec in load_spec(profile=profile).data_model.types:
            if type_spec.python:
                fields.setdefault(type_spec.python, set()).update(f.name for f in type_spec.fields)
    for name, names in fields.items():
        assert set(_python_fields(getattr(py_model, name))) == names, name


def test_profile_names_in_code_equal_the_index(spec):
    assert {p.name for p in spec.profiles} == set(py_model.PROFILES)
    assert next(p.name for p in spec.profiles if p.default) == py_model.DEFAULT_PROFILE


# -- the reference's outputs have the dtypes and shapes the data model states --


def _step(comm, batch, grammar, token_logits, profile):
    sharder = ReferenceSharder(64, 4, comm=comm, rules=rules_of(profile))
    # Under an owner table (owner rule owner_table), one that is neither slot nor position mod tp.
    table = (np.arange(64, dtype=np.int32) + 1) % comm.world_size if rules_of(profile).owner_by_table else None
    shard = sharder.shard_sampler_inputs(batch, grammar, **({} if table is None else {"owner_table": table}))
    width = token_logits.shape[1] // comm.world_size
    logits_shard = token_logits[shard.sorted_logits_indices][:, comm.rank * width : (comm.rank + 1) * width]
    full = sharder.all_to_all_logits(logits_shard, shard.metadata)
    local = toy_sample(
        full[:, :VOCAB].float(), shard.local_batch, shard.local_grammar_output, LOGPROBS_DIMS[0], rules_of(profile)
    )
    gathered = sharder.gather_sampler_output(
        local, shard.metadata, batch, shard.local_batch, gather_num_nans=True, logprobs_dims=LOGPROBS_DIMS
    )
    return shard, full, local, gathered


BATCHES = {
    "speculative-with-grammar": ([5, 2, 9, 0, 7], [1, 3, 2, 4, 1], [4, 0, 2]),
    "rank-1-owns-nothing": ([0, 2], [1, 1], [1]),
    "empty": ([], [], None),
}


@pytest.fixture(params=sorted(BATCHES))
def step_results(request, spec):
    slots, counts, grammar_positions = BATCHES[request.param]
    rules = rules_of(spec.profile)
    batch = build_input_batch(slots, counts, seq_lens_upper_bound=rules.has_upper_bound)
    grammar = None
    if grammar_positions is not None:
        block = 4 if rules.grammar_blocks else None
        grammar = build_grammar_output(batch, grammar_positions, VOCAB, seed=1, block_rows=block)
    num_tokens = int(batch.query_start_loc[-1]) if slots else 1
    token_logits = build_token_logits(max(num_tokens, 1), 128 * TP, seed=3).to(torch.bfloat16)
    return batch, LockstepGroup(TP, timeout_s=20).run(_step, batch, grammar, token_logits, spec.profile)


def _symbols(batch, shard) -> dict[str, int]:
    md = shard.metadata
    k, t = LOGPROBS_DIMS
    return {
        "tp": TP,
        "N": batch.num_reqs,
        "L": batch.num_logits,
        "n": md.num_local_reqs,
        "L_local": md.num_local_logits,
        "M": md.max_num_reqs_per_rank,
        "W": md.max_num_logits_per_req,
        "k": k,
        "t": t,
        "C": 1 + max(k, t),
        "Ls": batch.num_logits,
        "S": 4,
        "g": 1,
        "Vs": 128,
        "V": VOCAB,
    }


def _expected_shape(shape, symbols):
    if shape is None or any(name not in symbols for expr in shape for name in _names(expr)):
        return None
    return tuple(eval(expr, {"__builtins__": {}}, symbols) for expr in shape)  # noqa: S307 (schema-restricted)


def _names(expr: str) -> list[str]:
    return [
        token
        for token in expr.replace("(", " ")
        .replace(")", " ")
        .replace("+", " ")
        .replace("*", " ")
        .replace("-", " ")
        .split()
        if not token.isdigit()
    ]


def _check(value, field, symbols, where, model, local=False, logits_dtype=None, batch=None):
    view = field.local if local and field.local else None
    dtype = (view.dtype if view and view.dtype else None) or field.dtype
    if dtype == "input":  # the batch field's own dtype (CL-LOCAL-DTYPES)
        dtype = str(getattr(batch, field.name).dtype).removeprefix("torch.")
    shape = (view.shape if view and view.shape else None) or field.shape
    if value is None:
        assert field.optional, f"{where} is None but not optional"
        return
    if field.type == "record":
        for child in model.type(field.ref).fields:
            _check(
                getattr(value, child.name), child, symbols, f"{where}.{child.name}", model, local, logits_dtype, batch
            )
        return
    expected_shape = _expected_shape(shape, symbols)
    if field.type == "tensor":
        assert isinstance(value, torch.Tensor), where
        assert value.dtype == (logits_dtype if dtype == "logits" else TORCH_DTYPES[dtype]), (where, value.dtype)
    elif field.type == "ndarray":
        assert isinstance(value, np.ndarray) and value.dtype == NUMPY_DTYPES[dtype], (where, value.dtype)
    elif field.type in ("list[int]", "list[str]"):
        item = int if field.type == "list[int]" else str
        assert isinstance(value, list) and all(type(v) is item for v in value), where
        expected_shape = expected_shape and expected_shape[:1]
    elif field.type == "int":
        assert type(value) is int, where
    if expected_shape is not None:
        assert tuple(np.shape(value)) == expected_shape, (where, np.shape(value), expected_shape)


def test_reference_outputs_match_the_data_model(spec, step_results):
    model = spec.data_model
    batch, per_rank = step_results
    for rank, (shard, full, local, gathered) in enumerate(per_rank):
        symbols = _symbols(batch, shard)
        outputs = {
            "local_batch": shard.local_batch,
            "sorted_logits_indices": shard.sorted_logits_indices,
            "local_grammar_output": shard.local_grammar_output,
            "metadata": shard.metadata,
            "full_vocab_logits": full,
            "gathered": gathered,
        }
        for name, value in outputs.items():
            field = model.resolve_output(name)
            _check(
                value,
                field,
                symbols,
                f"rank {rank}: {name}",
                model,
                local=(field.view == "local"),
                logits_dtype=torch.bfloat16,
                batch=batch,
            )
        _check(local, model.resolve_argument("local_output"), symbols, f"rank {rank}: local_output", model)
        _check(batch, model.resolve_argument("batch"), symbols, f"rank {rank}: batch", model)
