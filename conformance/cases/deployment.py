"""Cases at the sizes engines deploy, in every run that generates cases: a batch of DEPLOYED_REQUESTS requests
and a vocabulary of DEPLOYED_VOCAB columns split over the group.

Generated batches stop at a few hundred requests and vocabularies at a few hundred columns (the Triton
interpreter costs about 0.5 ms per program instance, and the reference's toy sampler sorts every full-vocab
row), so a gather wrong only past 512 requests, or an exchange wrong only past a 4096-column vocabulary, would
pass every one of them. Engines run 1024 requests and more over vocabularies of 128k-262k tokens. Each size
gets a case of its own, never both at once: the many requests over a small vocabulary, one logits row each;
the wide vocabulary with two requests per rank of the group. Production's kernels launch one program per
block of requests (impl/sharder.py, _block), never per vocabulary column, so neither case adds more than a
few programs per launch.
"""

from __future__ import annotations

import numpy as np

from shardspec.conformance.usage import DEFAULT_TIER, DEPLOY_TIER
from shardspec.spec.case import Case, least_capacity
from shardspec.spec.rules import Rules

# max_num_seqs of engines serving many short requests, and as many requests in the batch: every slot in use.
DEPLOYED_REQUESTS = 1024
# Qwen2's vocabulary: not a multiple of 64 * tp at any tp above 1, so the shards are padded as engines pad
# them (Case.padded_vocab_size).
DEPLOYED_VOCAB = 151936
SMALL_VOCAB = 33  # the many requests' vocabulary: every token id differs from its neighbours' most of the time
WIDE_VOCAB_REQS_PER_RANK = 2
WIDE_VOCAB_CAPACITY = 64
# The deploy tier's larger sizes: 4096 requests, Gemma 3's 262144-column vocabulary.
DEPLOY_TIER_REQUESTS = 4096
DEPLOY_TIER_VOCAB = 262144


def deployment_cases(tp: int, rules: Rules, seed: int = 0) -> list[Case]:
    """The deployed-size cases of group size ``tp`` under ``rules``, the same for the same seed."""
    rng = np.random.default_rng([seed, tp, 1024])
    return [_many_requests(tp, rules, seed, rng), _wide_vocabulary(tp, rules, seed, rng)]


def deploy_tier_cases(tp: int, rules: Rules, seed: int = 0) -> list[Case]:
    """The deploy tier's cases of group size ``tp``: the deployed-size cases, and DEPLOY_TIER_REQUESTS requests and
    a vocabulary of DEPLOY_TIER_VOCAB columns, each in a case of its own."""
    rng = np.random.default_rng([seed, tp, 4096])
    wider = [
        _many_requests(tp, rules, seed, rng, DEPLOY_TIER_REQUESTS),
        _wide_vocabulary(tp, rules, seed, rng, DEPLOY_TIER_VOCAB),
    ]
    return deployment_cases(tp, rules, seed) + wider


def _many_requests(tp: int, rules: Rules, seed: int, rng: np.random.Generator, n: int = DEPLOYED_REQUESTS) -> Case:
    """Every one of ``n`` slots in use, in a random order (owners interleave), one row each, half of them listed by
    the grammar output, with logprobs and NaN rows."""
    size = "" if n == DEPLOYED_REQUESTS else f"-{n}"
    slots = [int(s) for s in rng.permutation(n)]
    description = f"{n} requests at a capacity of {n}, one logits row each"
    case = _deployed(f"requests{size}", tp, rules, seed, rng, slots, [1] * n, n, 1, SMALL_VOCAB, description)
    case.nan_tokens = sorted(int(t) for t in rng.choice(n, size=3, replace=False))
    return case


def _wide_vocabulary(tp: int, rules: Rules, seed: int, rng: np.random.Generator, vocab: int = DEPLOYED_VOCAB) -> Case:
    """``vocab`` columns in bfloat16, WIDE_VOCAB_REQS_PER_RANK requests per rank of the group (at random slots),
    of one or two rows each."""
    n = WIDE_VOCAB_REQS_PER_RANK * tp
    capacity = max(WIDE_VOCAB_CAPACITY, n)
    size = "" if vocab == DEPLOYED_VOCAB else f"-{vocab}"
    slots = [int(s) for s in rng.choice(capacity, size=n, replace=False)]
    counts = [int(c) for c in rng.integers(1, 3, size=n)]
    description = f"a vocabulary of {vocab} columns split over {tp} rank(s)"
    case = _deployed(f"vocabulary{size}", tp, rules, seed, rng, slots, counts, capacity, 2, vocab, description)
    case.logits_dtype = "bfloat16"
    return case


def _deployed(
    kind: str,
    tp: int,
    rules: Rules,
    seed: int,
    rng,
    slots: list[int],
    counts: list[int],
    capacity: int,
    max_logits: int,
    vocab: int,
    description: str,
) -> Case:
    """A deployed-size case of ``slots`` with ``counts`` rows each, half of them listed by the grammar output,
    asking for logprobs (the grammar positions, then the case's seed, drawn from ``rng`` in that order)."""
    grammar = [int(p) for p in rng.permutation(len(slots))[: len(slots) // 2]]
    case = Case(
        case_id=f"deployed-{kind}-tp{tp}-s{seed}",
        tp_size=tp,
        slots=slots,
        num_logits_per_req=counts,
        description=description,
        max_num_reqs=capacity,
        max_num_logits_per_req=max_logits,
        grammar_positions=grammar,
        vocab_size=vocab,
        seed=int(rng.integers(0, 2**16)),
        logprobs_dims=(4, 2),
        rules=rules,
    )
    return _at_least_capacity(case)


def _at_least_capacity(case: Case) -> Case:
    """``case`` with the capacity its profile needs at its group size (PRE-CAPACITY-TP)."""
    case.max_num_reqs = max(case.max_num_reqs, least_capacity(case))
    return case


def deployment_cases_for_run(tp: int, rules: Rules, seed: int, run_tp_sizes, tier: str = DEFAULT_TIER) -> list[Case]:
    """The deployed-size cases a run of one seed over group sizes ``run_tp_sizes`` gives size ``tp``. In the default
    tier each case goes to one of the sizes the profile builds a sharder for, rotating with the seed (case i to
    sizes[(i + seed) % len(sizes)]), as the boundary cases do: each one judged once within the run's budget; in the
    deploy tier every size gets every case of :func:`deploy_tier_cases`."""
    sizes = sorted(size for size in set(run_tp_sizes) if size >= rules.min_tp)
    if tp not in sizes:
        return []
    if tier == DEPLOY_TIER:
        return deploy_tier_cases(tp, rules, seed)
    return [case for i, case in enumerate(deployment_cases(tp, rules, seed)) if sizes[(i + seed) % len(sizes)] == tp]
