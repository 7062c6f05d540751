#!/usr/bin/env bash
# Re-records the conformance reports the HTML report's tests read (a few fixture cases each,
# so that the files stay small). Run from the repository root: bash tests/conformance/data/record.sh
# run-v1-legacy-format.json is not re-recorded: it is run-v1 as written before reports counted the
# cases that judged each invariant, kept to test that the HTML report derives what such reports lack.
set -uo pipefail
data="$(pwd)/tests/conformance/data"
export PYTHONPATH="$data${PYTHONPATH:+:$PYTHONPATH}"
cases=(--case tp1-decode --case tp2-decode --case tp2-error-local-output-rows --case tp2-explicit-missing-logprobs)
# Exit code 1 (a failing report) is expected for the second run; anything else is not.
record() {
    python -m shardspec.conformance "$@" > /dev/null
    local rc=$?
    if [ "$rc" -gt 1 ]; then echo "recording failed (exit $rc): $*" >&2; exit "$rc"; fi
}
REGRESSION_ADAPTER_VERSION=1 record --impl regression_adapter:make_sharder,reference/production \
    "${cases[@]}" --json "$data/run-v1.json"
REGRESSION_ADAPTER_VERSION=2 record --impl regression_adapter:make_sharder,reference/production \
    "${cases[@]}" --case tp3-one-request-spec --json "$data/run-v2.json"
