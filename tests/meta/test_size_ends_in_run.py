"""The default run's own cases reject the broken entries of the sizes' ends (conformance/broken/sizes.py): at
every tp, some generated case that draws the end fails the entry by its invariant. A case that draws an end
in a form no wrong implementation shows (local logprobs of width 0 whose selected ranks equal a padding
row's) passes the coverage tests, and would pass the entry too."""

import pytest

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.broken import BY_NAME
from shardspec.conformance.cases.coverage import exercised
from shardspec.conformance.replay import run_case_in_process
from shardspec.conformance.run import resolve
from shardspec.conformance.run.collect import collect_cases
from shardspec.spec.profiles import rules_of

# Each end of a size (a variation key) and the entry whose defect shows only there.
ENTRIES = {
    "G:size=empty": "grammar-listing-nothing-handed-on",
    "k:size=largest": "logprob-columns-staged-in-fixed-buffer",
    "extension_fields:size=empty": "extensions-none-when-none-declared",
    "extension_fields:size=largest": "extension-fields-in-fixed-table",
    "E:size=largest": "extension-entries-staged-in-fixed-buffer",
    "w:size=empty": "zero-width-ids-taken-for-an-idle-rank",
    "w:size=largest": "local-ids-skipped-past-fixed-buffer",
    "c:size=empty": "zero-width-logprobs-taken-for-none",
    "c:size=largest": "local-logprobs-skipped-past-fixed-buffer",
}


@pytest.fixture(scope="module")
def default_run():
    # The profile of `nox -s conformance`'s main run (noxfile.py's MAIN_PROFILE).
    config = resolve.resolve_run({"impl": "reference", "profile": "vllm-0.34-strict"}, {}).config
    return config, collect_cases(config)


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_the_default_run_rejects_each_size_end_s_entry(default_run, key):
    config, case_set = default_run
    entry = BY_NAME[ENTRIES[key]]
    sizes = [tp for tp in config.tp_sizes if tp >= rules_of(config.profile).min_tp]
    assert sizes
    for tp in sizes:
        drawing = [
            c
            for c in case_set.cases
            if c.tp_size == tp and c.case_id in case_set.generated and key in {v.key for v in exercised(c)}
        ]
        assert drawing, (key, tp)
        found = [
            {v["invariant_id"] for v in run_case_in_process(case, ImplChoice(entry.target)).violations}
            for case in drawing
        ]
        assert any(entry.invariant_id in ids for ids in found), (key, tp, [c.case_id for c in drawing], found)
