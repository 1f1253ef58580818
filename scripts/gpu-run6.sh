#!/usr/bin/env bash
# GPU run 6: float16 conversions by cvt instructions; kernel tests and
# bandwidth, then the engine's GPU tests (every dtype × op × count).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 120 ./bin/cuda.test -test.v -test.timeout 115s > "$OUT/cuda.log" 2>&1; echo "cuda.test rc=$?"
FAIRGO_OUT=$OUT timeout 130 ./bin/hier.test -test.run GPU -test.v -test.timeout 125s -rapid.checks=25 > "$OUT/hier-gpu.log" 2>&1; echo "hier.test rc=$?"
echo "== failures"; grep -h -E -- '--- FAIL|panic:' "$OUT"/*.log | head -20
for f in cuda hier-gpu; do echo "$f: pass=$(grep -c -- '^--- PASS' "$OUT/$f.log") fail=$(grep -c -- '^--- FAIL' "$OUT/$f.log")"; done
grep -h -E 'GB/s|gpu_test.go:213' "$OUT"/cuda.log "$OUT"/hier-gpu.log | head -12
