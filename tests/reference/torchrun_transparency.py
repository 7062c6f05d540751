"""Worker launched by torchrun: the reference's whole step over gloo vs the replicated path.

Each rank runs every case of the catalogue's toy cases for its group size plus
a few random ones, and writes one JSON line per case with what disagreed.
Usage: torchrun --nproc-per-node TP tests/reference/torchrun_transparency.py OUT_DIR
"""

import json
import pathlib
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from shardspec.comm import TorchDistComm
from shardspec.conformance.harness.expectations import replicated_of
from shardspec.fixtures import load_cases
from shardspec.fixtures.run import reference_sharder
from shardspec.reference.local_sampler import local_sampler_output
from shardspec.spec.case import Case, build_case_inputs, local_logits_shard
from shardspec.spec.case_edits import gather_options
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of


def cases_for(tp: int) -> list[Case]:
    # The default profile where it builds a sharder of tp ranks; vllm-seed for a group of one (vllm-0.33 and
    # vllm-0.34 refuse it: PRE-TP-SIZE).
    profile = DEFAULT_PROFILE if tp >= rules_of(DEFAULT_PROFILE).min_tp else "vllm-seed"
    catalogue = [c for c in load_cases(profile) if c.tp_size == tp and c.local_outputs == "toy" and not c.expect_error]
    randoms = [
        Case(
            f"random-tp{tp}-{k}",
            tp,
            slots=[(7 * k + 3 * i) % 40 for i in range(k + 3)],
            num_logits_per_req=[1 + (i * k) % 4 for i in range(k + 3)],
            grammar_positions=[k % (k + 3), 0][: 1 + k % 2],
            seed=k,
            nan_tokens=[k, 2 * k + 1],
            logprobs_dims=(k % 3, 4 * (k % 2)),
            max_num_reqs=40,
            rules=rules_of(profile),
        )
        for k in range(4)
    ]
    return catalogue + randoms


def disagreements(case: Case, comm) -> list[str]:
    inputs = build_case_inputs(case)
    sharder = reference_sharder(case, comm)
    shard = sharder.shard_sampler_inputs(inputs.batch, inputs.grammar)
    full = sharder.all_to_all_logits(
        local_logits_shard(inputs, shard.sorted_logits_indices, case, comm.rank), shard.metadata
    )
    local_output = local_sampler_output(case, comm.rank, full, shard)
    got = sharder.gather_sampler_output(
        local_output,
        shard.metadata,
        inputs.batch,
        shard.local_batch,
        gather_num_nans=case.gather_num_nans,
        logprobs_dims=case.logprobs_dims,
        **gather_options(case.extensions, case.edits),
    )
    want = replicated_of(case, inputs)
    if want is None:
        return [] if got.sampled_token_ids.shape[0] == 0 else ["empty batch produced rows"]
    problems = [
        name
        for name in ("num_sampled", "num_rejected", "num_nans")
        if not _same(getattr(got, name), getattr(want, name))
    ]
    for i, n in enumerate(want.num_sampled.tolist()):
        if not torch.equal(got.sampled_token_ids[i, :n], want.sampled_token_ids[i, :n]):
            problems.append(f"sampled_token_ids of request {i}")
    if want.logprobs_tensors is not None:
        for name in ("logprob_token_ids", "logprobs", "selected_token_ranks", "cu_num_generated_tokens"):
            value, rows = getattr(got.logprobs_tensors, name), want.logprobs_tensors.logprobs.shape[0]
            value = value[:rows] if isinstance(value, torch.Tensor) else value  # later rows are unspecified
            if not _same(value, getattr(want.logprobs_tensors, name)):
                problems.append(f"logprobs_tensors.{name}")
    return problems


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def main(out_dir: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.set_num_threads(1)  # float reductions then match the single-threaded replicated path
    comm = TorchDistComm()
    lines = [
        json.dumps({"case": case.case_id, "rank": comm.rank, "problems": disagreements(case, comm)})
        for case in cases_for(comm.world_size)
    ]
    pathlib.Path(out_dir, f"rank{comm.rank}.jsonl").write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
