#!/usr/bin/env bash
# GPU smoke test: runs the prebuilt test binaries of the GPU backend (make
# gpu-bin on the build machine) on the GPU machine, from the repository root.
# Logs go to $OUT (default /tmp/fairgo-smoke); a short summary comes last.
# Exit status: 0 when every binary passed.
set -uo pipefail
export NCCL_NVLS_ENABLE=0            # NVLink multicast stays off on shared hosts
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
OUT="${OUT:-/tmp/fairgo-smoke}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

{
  date -u
  nvidia-smi -L 2>&1
  nvidia-smi topo -m 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* 2>&1
  env | grep -E '^(NCCL|CUDA|FAIRGO)_' | sort
} >"$OUT/machine.txt"

declare -a summary
status=0
run() { # name binary args...
  local name=$1 bin=$2
  shift 2
  if [ ! -x "$bin" ]; then
    summary+=("$name: MISSING $bin (run make gpu-bin on the build machine)")
    status=1
    return
  fi
  local start=$SECONDS
  "$bin" -test.v -test.count=1 "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local pass fail skip
  pass=$(grep -c -- '--- PASS' "$OUT/$name.log")
  fail=$(grep -c -- '--- FAIL' "$OUT/$name.log")
  skip=$(grep -c -- '--- SKIP' "$OUT/$name.log")
  summary+=("$name: rc=$rc pass=$pass fail=$fail skip=$skip ($((SECONDS - start))s, log $OUT/$name.log)")
  if [ "$rc" -ne 0 ]; then
    status=1
    local fails
    fails=$(grep -- '--- FAIL' "$OUT/$name.log" | head -20 | sed 's/^/    /')
    [ -n "$fails" ] && summary+=("$fails")
    summary+=("$(tail -15 "$OUT/$name.log" | sed 's/^/    | /')")
  fi
  local skips # t.Skip's message is the line before "--- SKIP"
  skips=$(grep -B1 -- '--- SKIP' "$OUT/$name.log" | grep -v -e '--- SKIP' -e '^--$' | sed 's/^ *//' | cut -c1-160 | sort -u | head -5)
  [ -n "$skips" ] && summary+=("$(echo "$skips" | sed 's/^/    skip: /')")
}

# Timeouts stay under a 10-minute command limit, so a hang ends with the
# goroutine dump in the log rather than with a killed run.
run nccl ./bin/nccl.test -test.timeout 2m
run cuda ./bin/cuda.test -test.timeout 7m

echo
echo "== fairgo GPU smoke summary ($(date -u +%H:%M:%S)) =="
grep -h -E 'NCCL [0-9]+\.[0-9]+\.[0-9]+|loaded NCCL' "$OUT/nccl.log" 2>/dev/null | head -2 | sed 's/^ */  /'
grep -h 'opened cuda' "$OUT/cuda.log" 2>/dev/null | head -1 | sed 's/^ */  /'
grep -h -E 'reduce .* GB/s' "$OUT/cuda.log" 2>/dev/null | sed 's/^ */  /'
for line in "${summary[@]}"; do echo "$line"; done
[ "$status" -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit "$status"
