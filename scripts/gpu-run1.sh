#!/usr/bin/env bash
# First GPU session run: backend unit tests, then the engine's tests on 1×2 and 2×1.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L; nvidia-smi topo -m | head -5
timeout 90 ./bin/nccl.test -test.v -test.timeout 80s > "$OUT/nccl.log" 2>&1; echo "nccl.test rc=$?"
timeout 200 ./bin/cuda.test -test.v -test.timeout 190s > "$OUT/cuda.log" 2>&1; echo "cuda.test rc=$?"
FAIRGO_OUT=$OUT timeout 330 ./bin/hier.test -test.run GPU -test.v -test.timeout 320s -rapid.checks=25 > "$OUT/hier-gpu.log" 2>&1; echo "hier.test rc=$?"
echo "== failures"; grep -h -E -- '--- FAIL|panic|Error:' "$OUT"/*.log | head -30
echo "== cuda"; grep -h -E -- '^(--- |ok|FAIL)|GB/s|BELOW' "$OUT/cuda.log" | tail -40
echo "== hier"; grep -h -E -- '^(--- |ok|FAIL)|gpu_test.go' "$OUT/hier-gpu.log" | tail -45
