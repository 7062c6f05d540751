"""Run a case's whole step with a chosen implementation per rank, and compare traces.

Every rank of a :class:`LockstepGroup` runs ``shard -> all_to_all -> local
sampler -> gather`` with either the reference or the production sharder; what
each rank returned and sent is kept so two runs can be compared field by field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from bundled import VLLM_033

from shardspec.comm import LockstepGroup
from shardspec.fixtures.run import RankTrace, run_rank_step
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.case import Case, CaseInputs, build_case_inputs
from shardspec.spec.case_edits import extension_fields
from shardspec.spec.profiles import rules_of

IMPLS = {"reference": ReferenceSharder, "production": ProductionSharder}
# Compiled kernels on a GPU; the interpreter on CPU tensors elsewhere (tests/conftest.py).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def all_ranks(name: str) -> Callable[[int], str]:
    return lambda rank: name


def mixed(rank: int) -> str:
    """Reference on even ranks, production on odd ranks."""
    return "production" if rank % 2 else "reference"


def _rank_step(comm, case: Case, inputs: CaseInputs, impl_of: Callable[[int], str]) -> RankTrace:
    impl = IMPLS[impl_of(comm.rank)]
    return run_rank_step(comm, case, inputs, impl)


def run_case(case: Case, impl_of: Callable[[int], str], inputs: CaseInputs | None = None) -> list[RankTrace]:
    inputs = build_case_inputs(case, DEVICE) if inputs is None else inputs
    return LockstepGroup(case.tp_size, timeout_s=60).run(_rank_step, case, inputs, impl_of)


# -- comparison ---------------------------------------------------------------


def assert_same(expected, actual, where: str) -> None:
    """Equal values, dtypes and shapes (NaN equals NaN) for tensors, arrays, dataclasses, tuples and dicts."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual)} is not a tensor"
        assert expected.dtype == actual.dtype, f"{where}: dtype {actual.dtype}, expected {expected.dtype}"
        assert expected.shape == actual.shape, f"{where}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        assert expected.device.type == actual.device.type, f"{where}: device {actual.device}"
        assert torch.equal(_nan_free(expected), _nan_free(actual)), f"{where}: {actual} != {expected}"
        assert torch.equal(_nans(expected), _nans(actual)), f"{where}: NaN positions differ"
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{where}: {type(actual)} is not an array"
        assert expected.dtype == actual.dtype, f"{where}: dtype {actual.dtype}, expected {expected.dtype}"
        assert np.array_equal(expected, actual), f"{where}: {actual} != {expected}"
    elif dataclasses.is_dataclass(expected):
        assert type(expected) is type(actual), f"{where}: {type(actual)}"
        for f in dataclasses.fields(expected):
            assert_same(getattr(expected, f.name), getattr(actual, f.name), f"{where}.{f.name}")
    elif isinstance(expected, tuple) and hasattr(expected, "_fields"):
        assert type(expected) is type(actual), f"{where}: {type(actual)}"
        for name in expected._fields:
            assert_same(getattr(expected, name), getattr(actual, name), f"{where}.{name}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(expected) == len(actual), f"{where}: {actual!r} != {expected!r}"
        for k, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{where}[{k}]")
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and list(expected) == list(actual), f"{where}: keys {list(actual)}"
        for key, value in expected.items():
            assert_same(value, actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, torch.device):
        assert expected.type == actual.type, f"{where}: {actual} != {expected}"
    else:
        assert type(expected) is type(actual) and expected == actual, f"{where}: {actual!r} != {expected!r}"


def _nan_free(t: torch.Tensor) -> torch.Tensor:
    return t.nan_to_num(0.0) if t.is_floating_point() else t


def _nans(t: torch.Tensor) -> torch.Tensor:
    return t.isnan() if t.is_floating_point() else torch.zeros(0)


def assert_traces_equal(case: Case, expected: list[RankTrace], actual: list[RankTrace]) -> None:
    """Every output of every rank, and the wire sends on their non-padding rows."""
    for ref, got in zip(expected, actual, strict=True):
        where = f"{case.case_id} rank {ref.rank}"
        assert_same(ref.shard, got.shard, f"{where} shard")
        assert_same(ref.full_vocab_logits, got.full_vocab_logits, f"{where} full_vocab_logits")
        assert_same(ref.gathered, got.gathered, f"{where} gathered")
        assert_wire_equal(case, ref, got, where)


def assert_wire_equal(case: Case, ref: RankTrace, got: RankTrace, where: str) -> None:
    assert [w.kind for w in ref.wire] == [w.kind for w in got.wire], f"{where}: collective sequence differs"
    a2a_ref, a2a_got = ref.wire[0], got.wire[0]
    assert a2a_ref.input_split_sizes == a2a_got.input_split_sizes, f"{where}: all_to_all splits"
    assert a2a_ref.output_split_sizes == a2a_got.output_split_sizes, f"{where}: all_to_all splits"
    local = ref.shard.local_batch
    width = ref.shard.metadata.max_num_logits_per_req
    kinds = _gather_kinds(case)
    assert len(ref.wire) == 1 + len(kinds), f"{where}: {len(ref.wire) - 1} all-gathers, expected {len(kinds)}"
    for k, (w_ref, w_got, kind) in enumerate(zip(ref.wire[1:], got.wire[1:], kinds, strict=True)):
        assert w_ref.send.dtype == w_got.send.dtype and w_ref.send.shape == w_got.send.shape, f"{where}: gather {k}"
        rows = _payload_rows(kind, local, width)
        assert_same(w_ref.send[rows], w_got.send[rows], f"{where}: all_gather {k} payload rows")


def _gather_kinds(case: Case) -> list[str]:
    """What each all-gather of the gather carries rows of: sampled ids, logprobs, then extension fields."""
    kinds = ["request"] + (["logits_row"] * 2 if case.logprobs_dims is not None else [])
    return kinds + [spec.per for spec in (extension_fields(case.extensions) or {}).values()]


def _payload_rows(kind: str, local, width: int) -> torch.Tensor:
    """Rows that carry data: local requests (sampled ids, per-request fields), or their logits rows
    j*W + p (logprobs, per-row fields)."""
    if kind == "request":
        return torch.arange(local.num_reqs, device=local.idx_mapping.device)
    counts = np.diff(local.cu_num_logits_np.astype(np.int64))
    rows = [j * width + p for j, n in enumerate(counts) for p in range(n)]
    return torch.tensor(rows, dtype=torch.int64, device=local.idx_mapping.device)


def random_case(seed: int, tp: int, *, max_reqs: int = 24, max_logits: int = 4, profile: str | None = None) -> Case:
    """A valid random step: slots, drafts, grammar subset and order, NaNs, logprob dims; with
    ``profile``, judged under it, and under vllm-0.33 with its inputs drawn too (admitted draft
    counts, adaptive verification, grammar blocks and acceptable drafts, device field dtypes)."""
    rng = np.random.default_rng(seed)
    num_reqs = int(rng.integers(0, max_reqs + 1))
    slots = rng.choice(max_reqs * 2, size=num_reqs, replace=False).tolist()
    spec = bool(rng.integers(0, 2))
    counts = rng.integers(1, max_logits + 1, size=num_reqs).tolist() if spec else [1] * num_reqs
    grammar = None
    if num_reqs and rng.integers(0, 2):
        grammar = rng.permutation(num_reqs)[: int(rng.integers(0, num_reqs + 1))].tolist()
    dims = [None, (0, 0), (2, 0), (1, 4), (5, 2)][int(rng.integers(0, 5))]
    case = Case(
        case_id=f"random-tp{tp}-{seed}",
        tp_size=tp,
        slots=slots,
        num_logits_per_req=counts,
        max_num_reqs=max_reqs * 2,
        max_num_logits_per_req=max_logits,
        spec_decode=spec or None,
        grammar_positions=grammar,
        vocab_size=int(rng.integers(40, 200)),
        seed=seed,
        nan_tokens=rng.integers(0, 3 * max(1, num_reqs), size=2).tolist(),
        gather_num_nans=bool(rng.integers(0, 2)),
        logprobs_dims=dims,
    )
    if profile is None:
        return case
    case = dataclasses.replace(case, rules=rules_of(profile))
    return _with_033_inputs(case, rng) if profile == VLLM_033 else case


def _with_033_inputs(case: Case, rng: np.random.Generator) -> Case:
    """``case`` with vLLM 0.33's inputs drawn: each present or not, independently."""
    counts = np.asarray(case.num_logits_per_req, dtype=np.int64)
    changes: dict = {"adaptive_verification": bool(rng.integers(0, 2))}
    if case.spec_decode and rng.integers(0, 2):
        # A budget that binds: at most the scheduled drafts, and now and then none at all.
        changes["admitted_drafts"] = (rng.integers(0, counts) if rng.integers(0, 4) else counts * 0).tolist()
    if case.grammar_positions:
        changes["grammar_block_rows"] = case.max_num_logits_per_req + int(rng.integers(0, 3))
        if rng.integers(0, 2):
            changes["num_acceptable_drafts"] = rng.integers(0, case.max_num_logits_per_req, len(case.grammar_positions))
            changes["num_acceptable_drafts"] = changes["num_acceptable_drafts"].tolist()
    fields = ("idx_mapping", "cu_num_logits", "seq_lens", "expanded_idx_mapping", "expanded_local_pos")
    changes["batch_dtypes"] = {name: str(rng.choice(["int32", "int64"])) for name in fields if rng.integers(0, 3) == 0}
    if changes["adaptive_verification"]:
        # With an int64 cu_num_logits the reference's cu_num_generated_tokens_tensor is int64, production's
        # int32 as the spec says: test_impl_profiles.py checks that case on its own.
        changes["batch_dtypes"].pop("cu_num_logits", None)
    return dataclasses.replace(case, **changes)
