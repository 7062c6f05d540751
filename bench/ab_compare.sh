#!/usr/bin/env bash
# The benchmark of two source trees on one machine, alternating, so that machine-to-machine
# differences (often 1.5x on shared GPU hosts) do not pass for a speed-up. Whole tables, reference
# included; for differences of a few percent use bench/ab_inprocess.py (one process, alternating bursts).
#   bash bench/ab_compare.sh OLD_TREE [NEW_TREE] [-- bench_step.py options]
# A tree is a directory holding this project, e.g. `git archive COMMIT | tar -x -C old`.
# Each tree is installed (no dependencies) into its own directory under ${AB_DIR:-/tmp/ab}, with
# ${PYTHON:-python3}, which must already have torch, triton and numpy.
set -eu
old=$1; shift
new=.
if [ $# -gt 0 ] && [ "$1" != "--" ]; then new=$1; shift; fi
[ "${1:-}" = "--" ] && shift
options=("$@")
[ ${#options[@]} -eq 0 ] && options=(--tp 8 --num-reqs 1024 --logits-per-req 1 --repeats 3 --target-s 0.05)
root=${AB_DIR:-/tmp/ab}
python=${PYTHON:-python3}
for side in old new; do
  tree=$old; [ $side = new ] && tree=$new
  "$python" -m pip install -q --no-deps --no-build-isolation --no-index --no-compile --upgrade \
    --target "$root/$side" "$tree" >/dev/null
done
for round in ${AB_ROUNDS:-1 2}; do
  for side in old new; do
    tree=$old; [ $side = new ] && tree=$new
    echo "== $side ($tree), round $round"
    PYTHONPATH="$root/$side${PYTHONPATH:+:$PYTHONPATH}" "$python" "$tree/bench/bench_step.py" "${options[@]}" \
      | sed '/^$/q' | grep -E '^ *[0-9]+ +[0-9]+ +[0-9]+ \|'
  done
done
