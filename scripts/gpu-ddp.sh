#!/usr/bin/env bash
# examples/ddp on GPUs (issue 6): the training kernels' tests, then the
# data-parallel trainer computing forward, backward and SGD with the kernels
# of cuda/kernels/train.ptx, each gradient bucket allreduced (Avg) as soon as
# its backward kernels are enqueued, the optimizer ordered after the Works on
# the device.
#
#   1. bin/cuda.test -test.run Train: the kernels against host references
#   2. emulated 2 × 2 under fairrun (hier.New; sockets on loopback between
#      the emulated machines, two processes per GPU)
#   3. 1 × 2 in one process over both GPUs (hier.NewLocal)
#
# Each ddp run must print a falling loss (last epoch below the first) and
# "replicas identical". Needs bin/cuda.test, bin/fairrun and bin/ddp from
# `make gpu-bin` on the build machine; no Go. Logs go to $OUT (default
# /tmp/fairgo-ddp); the summary is printed last. Exit status 0 when all pass.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
OUT="${OUT:-/tmp/fairgo-ddp}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

{
  date -u
  nvidia-smi -L 2>&1
  env | grep -E '^(NCCL|CUDA|FAIRGO)_' | sort
} >"$OUT/machine.txt"

# The model: ~1.2 M parameters (4.7 MiB of float32 gradients, 4 buckets).
MODEL="-in 128 -hidden 1024 -depth 2 -classes 10 -batch 256 -epochs 8 -steps 40"

declare -a summary
status=0
missing() {
  local b
  for b in "$@"; do
    if [ ! -x "$b" ]; then
      summary+=("FAIL: missing $b (run make gpu-bin on the build machine)")
      status=1
      return 0
    fi
  done
  return 1
}

# 1. kernel tests
if ! missing bin/cuda.test; then
  start=$SECONDS
  timeout 180 bin/cuda.test -test.run Train -test.v >"$OUT/kernels.log" 2>&1
  rc=$?
  pass=$(grep -c -- '^--- PASS' "$OUT/kernels.log")
  fail=$(grep -c -- '^--- FAIL' "$OUT/kernels.log")
  skip=$(grep -c -- '^--- SKIP' "$OUT/kernels.log")
  verdict=PASS
  if [ "$rc" -ne 0 ] || [ "$fail" -ne 0 ] || [ "$pass" -eq 0 ]; then verdict=FAIL; status=1; fi
  summary+=("$verdict kernels: rc=$rc pass=$pass fail=$fail skip=$skip ($((SECONDS - start))s) cuda.test -test.run Train")
  [ "$verdict" = FAIL ] && summary+=("$(grep -E -- '--- FAIL|_test.go:[0-9]+' "$OUT/kernels.log" | head -12 | sed 's/^/    | /')")
fi

# check NAME LOG RC SECONDS CMD: falling loss and identical replicas.
check() {
  local name=$1 log=$2 rc=$3 secs=$4 cmd=$5
  local first last verdict=PASS
  first=$(grep -E 'epoch +[0-9]+ +loss' "$log" | head -1 | sed -E 's/.*loss ([0-9.eE+-]+).*/\1/')
  last=$(grep -E 'epoch +[0-9]+ +loss' "$log" | tail -1 | sed -E 's/.*loss ([0-9.eE+-]+).*/\1/')
  if [ "$rc" -ne 0 ] || [ -z "$first" ] || [ -z "$last" ] || ! grep -q 'replicas identical' "$log" ||
    ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
    verdict=FAIL
    status=1
  fi
  summary+=("$verdict $name: rc=$rc loss ${first:-?} -> ${last:-?} ($secs s) $cmd")
  summary+=("$(grep -E 'epoch +[0-9]+ +loss' "$log" | tail -1 | sed 's/^/    last: /')")
  summary+=("$(grep -E 'replicas identical' "$log" | head -1 | sed 's/^/    /')")
  if [ "$verdict" = FAIL ]; then
    summary+=("$(grep -v -E 'epoch +[0-9]+ +loss|bucket [0-9]+:' "$log" | tail -12 | sed 's/^/    | /')")
  fi
}

# 2. emulated 2 × 2 under fairrun
if ! missing bin/fairrun bin/ddp; then
  start=$SECONDS
  # shellcheck disable=SC2086
  timeout 120 bin/fairrun --nproc-per-node 4 --emulate-machines 2 -- bin/ddp -backend cuda $MODEL >"$OUT/ddp-2x2.log" 2>&1
  rc=$?
  check 2x2-fairrun "$OUT/ddp-2x2.log" "$rc" $((SECONDS - start)) "fairrun --nproc-per-node 4 --emulate-machines 2 -- ddp -backend cuda $MODEL"
fi

# 3. 1 × 2 in one process
if ! missing bin/ddp; then
  start=$SECONDS
  # shellcheck disable=SC2086
  timeout 120 bin/ddp -backend cuda -machines 1 -devices 2 $MODEL >"$OUT/ddp-1x2.log" 2>&1
  rc=$?
  check 1x2-local "$OUT/ddp-1x2.log" "$rc" $((SECONDS - start)) "ddp -backend cuda -machines 1 -devices 2 $MODEL"
fi

echo "== kernel tests"
grep -E -- '^(--- |ok|FAIL|PASS)' "$OUT/kernels.log" 2>/dev/null
for f in "$OUT"/ddp-2x2.log "$OUT"/ddp-1x2.log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .log)"
  grep -v -E '^\s*$' "$f" | tail -25
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
