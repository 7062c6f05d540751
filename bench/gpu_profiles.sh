#!/usr/bin/env bash
# The conformance suite under every profile on one CUDA GPU: production and the mixed
# reference/production group in-process with compiled kernels (tp 1-8, the ranks taking turns on the
# GPU), and production and the reference at tp 1 on NCCL (under a profile that builds no one-rank sharder,
# vllm-0.33 among them, tp 1 judges the PRE-TP-SIZE refusal only). JSON reports and logs under OUT.
#   bash bench/gpu_profiles.sh [PROFILE ...]      (default: vllm-0.33 vllm-seed)
set -u
OUT=${OUT:-gpu-profiles}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
for profile in ${*:-vllm-0.33 vllm-seed}; do
  start=$SECONDS
  timeout 420 python -m shardspec.conformance --profile "$profile" --in-process --in-process-device cuda \
    --impl production,reference/production --tp 1,2,3,4,8 --json "$OUT/in-process-$profile.json" \
    >"$OUT/in-process-$profile.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=$rc
  echo "== $profile in-process cuda: exit $rc in $((SECONDS - start)) s"; grep -E "case\(s\):|PASSED|FAILED" "$OUT/in-process-$profile.log" | tail -12
  start=$SECONDS
  timeout 200 python -m shardspec.conformance --profile "$profile" --impl production,reference --tp 1 \
    --json "$OUT/nccl-tp1-$profile.json" >"$OUT/nccl-tp1-$profile.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=$rc
  echo "== $profile tp 1 NCCL: exit $rc in $((SECONDS - start)) s"; grep -E "case\(s\):|PASSED|FAILED" "$OUT/nccl-tp1-$profile.log" | tail -4
done
exit $status
