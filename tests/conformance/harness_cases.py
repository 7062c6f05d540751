"""Small cases shared by the harness tests."""

import pathlib

from bundled import profile_for_tp

from shardspec.spec.case import Case
from shardspec.spec.profiles import rules_of

PLUGINS = pathlib.Path(__file__).resolve().parent / "plugins"
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "out_of_tree_adapter"


def small_cases(tp: int) -> list[Case]:
    """Three cases of 2, 3 and 4 requests; the faulty sharders misbehave on the 3-request one. Under the default
    profile where it builds a sharder of ``tp`` ranks, else vllm-seed (vllm-0.33 and vllm-0.34 refuse one rank:
    PRE-TP-SIZE)."""
    return [
        Case(
            f"small-tp{tp}-{n}",
            tp,
            rules=rules_of(profile_for_tp(tp)),
            description=f"{n} requests",
            slots=[5, 2, 9, 0][:n],
            num_logits_per_req=[1, 2, 1, 3][:n],
            grammar_positions=[0],
            nan_tokens=[1],
            logprobs_dims=(2, 3),
        )
        for n in (2, 3, 4)
    ]


def write_cases(cases: list[Case], folder: pathlib.Path) -> list[str]:
    from shardspec.fixtures import case_to_yaml

    paths = []
    for case in cases:
        path = folder / f"{case.case_id}.yaml"
        path.write_text(case_to_yaml(case))
        paths.append(str(path))
    return paths
