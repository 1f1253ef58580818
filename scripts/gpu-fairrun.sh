#!/usr/bin/env bash
# examples/allreduce under fairrun with the cuda backend (hier.New: one rank
# per process, topology discovered through fairrun's store, communicators by
# ncclCommSplit) on the 2-GPU machine: 1 machine × 2 ranks, then 2 × 2 and
# 4 × 2 emulated machines (each its own NCCL_HOSTID; sockets on loopback
# between them, NVLink inside them) with shuffled global rank orders. Every
# rank checks its own result against the host reference and prints "ok".
#
# Needs bin/fairrun and bin/allreduce from `make gpu-bin`; no Go. Run from
# anywhere; logs go to $OUT (default /tmp/fairgo-fairrun), the summary last.
# Exit status: 0 when every run passed on every rank.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
OUT="${OUT:-/tmp/fairgo-fairrun}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

{
  date -u
  nvidia-smi -L 2>&1
  env | grep -E '^(NCCL|CUDA|FAIRGO)_' | sort
} >"$OUT/machine.txt"

declare -a summary
status=0
# run NAME NPROC "FAIRRUN FLAGS" "ALLREDUCE FLAGS"
run() {
  local name=$1 nproc=$2 fr=$3 ar=$4 log="$OUT/$1.log"
  for b in bin/fairrun bin/allreduce; do
    if [ ! -x "$b" ]; then
      summary+=("$name: MISSING $b (run make gpu-bin on the build machine)")
      status=1
      return
    fi
  done
  local start=$SECONDS
  # shellcheck disable=SC2086
  timeout 150 bin/fairrun --nproc-per-node "$nproc" $fr -- bin/allreduce -backend cuda $ar >"$log" 2>&1
  local rc=$?
  local oks
  oks=$(grep -c -E '^\[[0-9]+\] ok ' "$log")
  local verdict=PASS
  if [ "$rc" -ne 0 ] || [ "$oks" -ne "$nproc" ]; then
    verdict=FAIL
    status=1
  fi
  summary+=("$verdict $name: rc=$rc ok=$oks/$nproc ($((SECONDS - start))s) fairrun --nproc-per-node $nproc $fr -- allreduce $ar")
  if [ "$verdict" = FAIL ]; then
    summary+=("$(grep -v -E '^\[[0-9]+\] (ok|iteration|rank [0-9]+: grid)' "$log" | tail -12 | sed 's/^/    | /')")
  fi
}

# 1 × 2: one machine, two processes, one GPU each.
run 1x2-f32-sum 2 "--shuffle-ranks 3" "-dtype float32 -op sum -count 1048579 -iters 2"
run 1x2-bf16-avg 2 "" "-dtype bfloat16 -op avg -count 3000001"
run 1x2-i32-max-small 2 "--shuffle-ranks 5" "-dtype int32 -op max -count 777 -flat-threshold -1"

# 2 × 2: two emulated machines of two ranks (GPUs 0 and 1 in each).
E2="--emulate-machines 2 --shuffle-ranks 7"
run 2x2-f32-sum 4 "$E2" "-dtype float32 -op sum -count 1048579 -iters 2"
run 2x2-bf16-avg 4 "$E2" "-dtype bfloat16 -op avg -count 4000037 -slice 1048576"
run 2x2-i64-min 4 "$E2" "-dtype int64 -op min -count 100003 -flat-threshold -1"

# 4 × 2: four emulated machines of two ranks; four processes per GPU.
E4="--emulate-machines 4 --shuffle-ranks 9"
run 4x2-f32-sum 8 "$E4" "-dtype float32 -op sum -count 2000003"
run 4x2-f16-prod 8 "$E4" "-dtype float16 -op prod -count 65537 -flat-threshold -1"
run 4x2-bf16-avg 8 "$E4" "-dtype bfloat16 -op avg -count 1000003 -slice 1048576"

echo "== grids (one line per rank: global rank, grid, device)"
for f in "$OUT"/1x2-f32-sum.log "$OUT"/2x2-f32-sum.log "$OUT"/4x2-f32-sum.log; do
  [ -f "$f" ] && { echo "-- $(basename "$f" .log)"; grep -E '^\[[0-9]+\] rank [0-9]+: grid' "$f" | sort -t']' -k1.2n; }
done
echo "== ok lines per rank"
for f in "$OUT"/*x*.log; do
  echo "-- $(basename "$f" .log)"
  grep -E '^\[[0-9]+\] ok ' "$f" | sort -t']' -k1.2n
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
