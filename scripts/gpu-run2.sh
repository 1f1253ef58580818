#!/usr/bin/env bash
# GPU run 2: engine GPU tests again (after the inline fast path), the split-based
# local communicators, then examples/allreduce under fairrun (issue 4).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FAIRGO_OUT=$OUT timeout 200 ./bin/hier.test -test.run GPU -test.v -test.timeout 190s -rapid.checks=25 > "$OUT/hier-gpu.log" 2>&1; echo "hier.test rc=$?"
timeout 60 ./bin/cuda.test -test.run 'LocalRanks|CommAbort' -test.v -test.timeout 55s > "$OUT/cuda-comm.log" 2>&1; echo "cuda.test comm rc=$?"
OUT=$OUT/fairrun timeout 330 bash scripts/gpu-fairrun.sh > "$OUT/fairrun-summary.txt" 2>&1; echo "gpu-fairrun rc=$?"
tar czf "$OUT/fairrun-logs.tgz" -C "$OUT" fairrun 2>/dev/null; rm -rf "$OUT/fairrun"
echo "== failures"; grep -h -E -- '--- FAIL|panic:' "$OUT"/*.log | head -20
echo "== hier"; grep -h -E -- '^(--- |ok|FAIL)|gpu_test.go:(213|443)' "$OUT/hier-gpu.log" | tail -30
echo "== fairrun"; tail -45 "$OUT/fairrun-summary.txt"
