#!/usr/bin/env bash
# GPU run 4: engine GPU tests with the engine's spin (timing: flat vs fairgo
# with and without spin), the ddp trainer on GPUs (issue 6), and the 1×2 and
# emulated 2×2 float32 sweeps again with the spin default.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
H=$(mktemp -d)
FAIRGO_OUT=$H timeout 130 ./bin/hier.test -test.run GPU -test.v -test.timeout 125s -rapid.checks=25 > "$H/hier-gpu.log" 2>&1; echo "hier.test rc=$?"
grep -h -E -- '^(--- |ok|FAIL)|gpu_test.go:(213|44[0-9])|panic' "$H/hier-gpu.log" | tail -34
D=$(mktemp -d); OUT=$D timeout 240 bash scripts/gpu-ddp.sh > "$H/ddp-summary.txt" 2>&1; echo "gpu-ddp rc=$?"
cp "$D"/*.log "$H/" 2>/dev/null
timeout 60 ./bin/fairbench -backend cuda -machines 1 -devices 2 -dtype float32 -b 1M -e 256M -f 4 -w 2 -n 5 -reps 3 -check -label 1x2-spin -json "$H/sweep-1x2-spin.jsonl" > "$H/sweep-1x2.txt" 2>&1; echo "sweep 1x2 rc=$?"
timeout 90 ./bin/fairrun --emulate-machines 2 --nproc-per-node 4 -- ./bin/fairbench -backend cuda -dtype float32 -b 1M -e 256M -f 4 -w 1 -n 3 -reps 3 -check -label emu2x2-spin -json "$H/sweep-emu2x2-spin.jsonl" > "$H/sweep-emu2x2.txt" 2>&1; echo "sweep emu2x2 rc=$?"
tar -C "$H" -czf "$OUT/run4.tgz" .
echo "== ddp"; tail -25 "$H/ddp-summary.txt"
echo "== sweep 1x2"; grep -v '^#' "$H/sweep-1x2.txt" | tail -8
echo "== sweep emu 2x2"; grep -v '^#' "$H/sweep-emu2x2.txt" | tail -8
