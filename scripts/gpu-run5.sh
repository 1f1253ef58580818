#!/usr/bin/env bash
# GPU run 5: everything GPU-side at the final commit: nccl and cuda unit
# tests, the engine's GPU tests, examples/allreduce under fairrun (1×2,
# emulated 2×2 and 4×2), and the ddp trainer.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
H=$(mktemp -d)
timeout 60 ./bin/nccl.test -test.v -test.timeout 55s > "$H/nccl.log" 2>&1; echo "nccl.test rc=$?"
timeout 120 ./bin/cuda.test -test.v -test.timeout 115s > "$H/cuda.log" 2>&1; echo "cuda.test rc=$?"
FAIRGO_OUT=$H timeout 130 ./bin/hier.test -test.run GPU -test.v -test.timeout 125s -rapid.checks=25 > "$H/hier-gpu.log" 2>&1; echo "hier.test rc=$?"
OUT=$H/fairrun timeout 200 bash scripts/gpu-fairrun.sh > "$H/fairrun-summary.txt" 2>&1; echo "gpu-fairrun rc=$?"
D=$(mktemp -d); OUT=$D timeout 150 bash scripts/gpu-ddp.sh > "$H/ddp-summary.txt" 2>&1; echo "gpu-ddp rc=$?"; cp "$D"/*.log "$H/" 2>/dev/null
tar -C "$H" -czf "$OUT/run5.tgz" .
echo "== failures"; grep -h -E -- '--- FAIL|panic:' "$H"/*.log | head -20
echo "== counts"; for f in nccl cuda hier-gpu; do echo "$f: pass=$(grep -c -- '^--- PASS' "$H/$f.log") fail=$(grep -c -- '^--- FAIL' "$H/$f.log") skip=$(grep -c -- '^--- SKIP' "$H/$f.log")"; done
grep -h -E 'gpu_test.go:213|GB/s' "$H"/hier-gpu.log "$H"/cuda.log | head -12
echo "== fairrun"; grep -E '^(PASS|FAIL)' "$H/fairrun-summary.txt"
echo "== ddp"; tail -8 "$H/ddp-summary.txt"
