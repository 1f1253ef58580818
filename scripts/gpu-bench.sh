#!/usr/bin/env bash
# GPU benchmark of issue 5: runs the prebuilt fairbench (make gpu-bin on the
# build machine: bin/fairbench and bin/fairrun, built with -tags cuda) on the
# GPU machine (2 × H200, no Go), from the repository root.
#
#   1. 1×2 sweep, one process over both GPUs (NVLink), float32 and bfloat16
#   2. emulated 2×2 and 4×2 sweeps under bin/fairrun --emulate-machines
#      (NCCL sockets on loopback between emulated machines), both types
#   3. overlap: 64 × 25 MiB buckets on emulated 2×2, parallelism 1,2,4,8
#   4. links: a 2-rank NVLink pair and a 2-rank emulated network pair
#   5. scale: the same tensors over 1, 2 and 4 emulated machines × 2
#   6. report, plots and the cost model over everything
#
# Everything goes under $OUT (default /tmp/fairgo-bench), at most 8 files:
# summary.txt, model.txt, results.jsonl, results.csv, machine.txt,
# plots.tar.gz, logs.tar.gz. The compact summary is printed last.
# The whole script stays within ~8 minutes: every step has a time limit and
# later steps are skipped when the budget runs out.
# Exit status: 0 when every step ran and every check found 0 wrong elements.
set -uo pipefail
export NCCL_NVLS_ENABLE=0            # NVLink multicast stays off on shared hosts
export NCCL_SOCKET_IFNAME=lo         # emulated machines talk over loopback
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# The emulated network's speed depends strongly on these (see shared/GPU.md);
# they are recorded in every result.
export NCCL_SOCKET_NTHREADS="${NCCL_SOCKET_NTHREADS:-4}"
export NCCL_NSOCKS_PERTHREAD="${NCCL_NSOCKS_PERTHREAD:-4}"
OUT="${OUT:-/tmp/fairgo-bench}"
BUDGET="${BUDGET:-460}"              # seconds for all steps
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
WORK=$(mktemp -d)
mkdir -p "$WORK/logs" "$WORK/json" "$WORK/plots"
BIN=./bin
FB="$BIN/fairbench"
FR="$BIN/fairrun"

{
  date -u
  nvidia-smi -L 2>&1
  nvidia-smi topo -m 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* 2>&1
  env | grep -E '^(NCCL|CUDA|FAIRGO)_' | sort
} >"$OUT/machine.txt"

status=0
declare -a steps
start_all=$SECONDS
# step NAME LIMIT CMD...: runs CMD with a time limit unless the budget is spent.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - (SECONDS - start_all)))
  if [ "$left" -lt 20 ]; then
    steps+=("$name: SKIPPED (budget spent)")
    status=1
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  steps+=("$name: rc=$rc $((SECONDS - t0))s (limit ${limit}s)")
  if [ "$rc" -ne 0 ]; then
    status=1
    steps+=("$(tail -8 "$WORK/logs/$name.log" | sed 's/^/    | /')")
  fi
}

if [ ! -x "$FB" ] || [ ! -x "$FR" ]; then
  echo "missing $FB or $FR: run make gpu-bin on the build machine" | tee "$OUT/summary.txt"
  exit 1
fi

SWEEP=(-b 1M -e 256M -f 4 -w 2 -n 5 -reps 3 -check)
for dt in float32 bfloat16; do
  step "sweep-1x2-$dt" 60 "$FB" -backend cuda -machines 1 -devices 2 -dtype "$dt" "${SWEEP[@]}" -label 1x2 \
    -json "$WORK/json/sweep-1x2-$dt.jsonl"
done
EMU=(-b 1M -e 256M -f 4 -w 1 -n 3 -reps 3 -check)
for m in 2 4; do
  for dt in float32 bfloat16; do
    step "sweep-emu${m}x2-$dt" 90 "$FR" --emulate-machines "$m" --nproc-per-node $((2 * m)) -- \
      "$FB" -backend cuda -dtype "$dt" "${EMU[@]}" -label "emu${m}x2" -json "$WORK/json/sweep-emu${m}x2-$dt.jsonl"
  done
done
step overlap-emu2x2 100 "$FR" --emulate-machines 2 --nproc-per-node 4 -- \
  "$FB" -backend cuda -mode overlap -buckets 64 -bucket-bytes 25M -parallelism 1,2,4,8 -w 1 -n 1 -reps 2 \
  -label emu2x2 -json "$WORK/json/overlap-emu2x2.jsonl"
step links 60 "$FB" -backend cuda -mode links -b 4K -e 64M -f 4 -w 2 -n 5 -reps 3 -fairrun "$FR" \
  -json "$WORK/json/links.jsonl"
step scale 120 "$FB" -backend cuda -mode scale -machines-list 1,2,4 -devices 2 -b 16M -e 64M -f 4 -w 1 -n 3 -reps 2 \
  -check -label scale -fairrun "$FR" -json "$WORK/json/scale.jsonl"

cat "$WORK"/json/*.jsonl >"$OUT/results.jsonl" 2>/dev/null
JSONS=$(ls "$WORK"/json/*.jsonl 2>/dev/null | paste -sd, -)
if [ -n "$JSONS" ]; then
  "$FB" -mode report -in "$JSONS" -plot "$WORK/plots" -csv "$OUT/results.csv" >"$OUT/summary.txt" 2>&1 || status=1
  "$FB" -mode model -backend cuda -in "$JSONS" >"$OUT/model.txt" 2>&1 || status=1
  # The same model with the emulated machines sharing the host's loopback:
  # the measured network pair's bandwidth as the cap of the whole job.
  netbw=$(grep -o 'net: α [0-9.]* µs, B [0-9.]* GB/s' "$OUT/model.txt" | head -1 | awk '{print $6}')
  if [ -n "$netbw" ]; then
    { echo; echo "### with -net-total-gbps $netbw (emulated machines share one host's loopback)"
      "$FB" -mode model -backend cuda -in "$JSONS" -net-total-gbps "$netbw" -model-machines 2,4 -model-sizes 16M,256M; } >>"$OUT/model.txt" 2>&1
  fi
fi
# Any wrong element fails the run.
if grep -q '"wrong":[1-9]' "$OUT/results.jsonl" 2>/dev/null; then
  status=1
  steps+=("CHECK FAILED: records with wrong elements: $(grep -c '"wrong":[1-9]' "$OUT/results.jsonl")")
fi
tar -C "$WORK" -czf "$OUT/plots.tar.gz" plots
tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs json
rm -rf "$WORK"

echo "== fairgo GPU bench ($(date -u +%H:%M:%S), $((SECONDS - start_all))s) =="
echo "NCCL_SOCKET_NTHREADS=$NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD=$NCCL_NSOCKS_PERTHREAD NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
for s in "${steps[@]}"; do echo "$s"; done
grep -h -m1 'median |error|' "$OUT/model.txt" 2>/dev/null | sed 's/^# /model: /'
cat "$OUT/summary.txt" 2>/dev/null
[ "$status" -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit "$status"
