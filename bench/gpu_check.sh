#!/usr/bin/env bash
# Everything this project checks on one CUDA GPU, in one go, with logs under OUT (default ./gpu-check):
# the GPU tests (tests/cuda_graph_step, the CUDA-graph example's, included), the benchmark table, the
# per-step counts (bench/step_counts.py), and the conformance suite against the production
# implementation (tp 1 on NCCL through torchrun; tp 2 and 4, a process per rank, on the one GPU shared;
# tp 1-8 in-process on the one GPU with compiled kernels, in the lockstep and the torch-threads group;
# tp 2 on gloo with the Triton interpreter).
# Each part has its own time limit; the exit status is the worst part's. With SHARDSPEC_UPSTREAM_FILE
# set (vLLM's batch_shard.py), the benchmark times and counts it too and the part upstream-shared-gpu
# runs the suite over it at tp 2, its known failures (examples/upstream_vllm/known_failures_<release>.yaml,
# keyed by invariant and case property) as xfails.
# The record, $OUT/summary.txt (the commit, the card, each part with its exit code and time, and the
# end of its log), is what bench/results/gpu-check-<commit>.txt keeps: SHARDSPEC_COMMIT names the commit
# where the tree has no .git (a copy sent to a GPU machine).
#   bash bench/gpu_check.sh [PART ...]     (default: every part)
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
summary=${SHARDSPEC_SUMMARY:-$OUT/summary.txt}  # elsewhere where the logs stay on the machine
commit=${SHARDSPEC_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
card=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
versions=$(python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1)
{ echo "gpu_check at $commit, $(date -u +%Y-%m-%dT%H:%MZ)"; echo "card: ${card:-none found}"; echo "$versions"; } >"$summary"
upstream=${SHARDSPEC_UPSTREAM_FILE:-}
default="gpu-tests bench replayable counts conformance-tp1-nccl conformance-in-process-cuda conformance-torch-threads-cuda"
default="$default conformance-shared-gpu conformance-tp2-gloo-interpreted"
[ -n "$upstream" ] && default="$default upstream-shared-gpu"
parts=" ${*:-$default} "
part() {  # part NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  [[ "$parts" == *" $name "* ]] || return 0
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  { echo "== $name: exit $rc in $((SECONDS - start)) s"; tail -n "${TAIL:-6}" "$OUT/$name.log"; } | tee -a "$summary"
  [ "$rc" -ne 0 ] && status=$rc
  return 0
}
part gpu-tests 240 python -m pytest -q -x tests/gpu tests/impl tests/cuda_graph_step tests/test_step_counts.py
part bench 300 python bench/bench_step.py --graph --repeats 5 --target-s 0.1 --out "$OUT/bench.json" \
  ${upstream:+--upstream "$upstream"}
# Production's step captured per batch shape and replayed for other batches of it, checked against eager steps.
part replayable 200 python bench/replayable_step.py ${upstream:+--upstream "$upstream"}
part counts 200 python bench/step_counts.py --out "$OUT/counts.json" ${upstream:+--upstream "$upstream"}
# One process per rank on one GPU is tp 1, which vllm-0.34 (the default) and vllm-0.33 refuse to build, as vLLM's
# config does (PRE-TP-SIZE): the part runs under vllm-seed, the one bundled profile that builds a one-rank sharder.
part conformance-tp1-nccl 300 python -m shardspec.conformance --impl production --tp 1 --profile vllm-seed \
  --json "$OUT/conformance-tp1.json"
# Several ranks, one process each, on the one GPU (--share-gpus: compiled kernels, gloo collectives), under the
# default profile.
part conformance-shared-gpu 300 python -m shardspec.conformance --impl production --tp 2,4 --share-gpus \
  --json "$OUT/conformance-shared-gpu.json"
part conformance-in-process-cuda 480 python -m shardspec.conformance --in-process --in-process-device cuda \
  --impl production,reference/production --tp 1,2,3,4,8 --json "$OUT/conformance-in-process.json"
# SHARDSPEC_THREADS_TP: its group sizes (2,3,4,8 unless set; it is the longest part, about 5 minutes on an H100).
part conformance-torch-threads-cuda 400 python -m shardspec.conformance --in-process-group torch-threads \
  --in-process-device cuda --impl production,reference/production --tp "${SHARDSPEC_THREADS_TP:-2,3,4,8}" --json "$OUT/conformance-torch-threads.json"
part conformance-tp2-gloo-interpreted 200 python -m shardspec.conformance --impl production --tp 2 --fixtures-only
# The file's release: SHARDSPEC_UPSTREAM_PROFILE (vllm-0.34 unless set) names its profile and known failures.
upstream_profile=${SHARDSPEC_UPSTREAM_PROFILE:-vllm-0.34}
# At tp 2 on the shared GPU: vllm-0.34 refuses tp 1, so one rank would judge only that refusal.
part upstream-shared-gpu 300 env PYTHONPATH="examples/upstream_vllm${PYTHONPATH:+:$PYTHONPATH}" \
  python -m shardspec.conformance --impl shardspec_upstream:make_sharder --tp 2 --share-gpus \
  --profile "$upstream_profile" --xfails-file "examples/upstream_vllm/known_failures_${upstream_profile#vllm-}.yaml" \
  --json "$OUT/upstream-shared-gpu.json"
echo "== worst exit: $status" | tee -a "$summary"
exit $status
