#!/usr/bin/env bash
# GPU run 3: the engine's GPU tests (after reverting the inline path), then the
# benchmark script (sweeps 1×2 / emulated 2×2 and 4×2, overlap, links, scale, model).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
H=$(mktemp -d)
FAIRGO_OUT=$H timeout 130 ./bin/hier.test -test.run GPU -test.v -test.timeout 125s -rapid.checks=25 > "$H/hier-gpu.log" 2>&1; echo "hier.test rc=$?"
grep -h -E -- '^(--- |ok|FAIL)|gpu_test.go:(213|443)|panic' "$H/hier-gpu.log" | tail -28
tar -C "$H" -czf "$OUT/hier.tgz" .
BUDGET=400 OUT=$OUT bash scripts/gpu-bench.sh
