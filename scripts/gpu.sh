#!/usr/bin/env bash
# fairgo's checks and benchmarks on the GPU machine. Run from the repository
# root with the binaries of `make gpu-bin` in bin/ (no Go needed there):
#
#   scripts/gpu.sh SECTION [ARGS] [SECTION [ARGS]] ...
#
# Sections (durations on 2 × H200 with the 10 Gbit/s testbed):
#   tests [MxD ...]     the GPU test binaries in one process (tests-local),
#                       then hier's ^TestGPU tests and cuda's communicator
#                       tests under fairrun, one rank per process, on 2x1 4x1
#                       2x2 4x2 (or the layouts given; tests-launched). A GPU
#                       test that skips on a host with a GPU fails its step
#                       (the table counts skips apart). Past four machines
#                       the check takes other paths (the relay's star, a
#                       check chosen by route, the Board's verdicts): after
#                       a change there, also tests-launched 6x1 6x2 (on one
#                       H200 ~100 s and ~190 s)
#   tests-local         nccl, cuda, the ddp kernels and hier's ^TestGPU tests,
#                       each binary in one process over the host's GPUs (on one
#                       GPU hier's tests run 1x1; ~2-4 min)
#   tests-launched MxD ...  hier's ^TestGPU tests, then cuda's communicator
#                       tests (CUDA_LAUNCHED_TESTS), under fairrun on emulated
#                       machines (--emulate-machines M, M*D ranks; on one GPU
#                       every rank shares it under MPS), every rank checking its
#                       own results against the whole world's (~1-2 min each,
#                       cuda's ~30 s)
#   test NAME REGEX     one test binary (bin/NAME.test) with -test.run REGEX
#   fairrun             examples/allreduce under fairrun: 1×2, then 2×2 and 4×2
#                       on the testbed with shuffled ranks (~2 min)
#   ddp                 examples/ddp on GPUs: 1×2 in one process, 2×2 on the
#                       testbed (~1 min)
#   bench-1x2           T1's sweeps: 1×2 in one process, float32 and bfloat16,
#                       one call at a time and 20 back to back, 64K–1G (~30 s)
#   bench-2x1           T2's in-process sweep: 2×1 in one process, 1M–1G (~10 s)
#   testbed MxD ...     sweeps on fairrun's testbed, e.g. testbed 2x1 2x2 4x2,
#                       1M–1G (2×1 ~30 s, 2×2 ~40 s, 4×2 ~60 s at 10 Gbit/s).
#                       A layout with more ranks per machine than GPUs runs
#                       too (fairrun makes each rank of such a machine an
#                       NCCL host of its own, its intra-machine link loopback
#                       TCP standing in for NVLink, NVLINK_GBIT shaping it;
#                       flat NCCL is then topology-unaware): on one GPU the
#                       targets' testbed is NIC_GBIT=2.5 scripts/gpu.sh
#                       testbed 2x2 2x4 4x2 (slower: the step's limit grows
#                       as NIC_GBIT falls)
#   overlap             T5: 64 × 25 MiB back to back on the testbed's 2×2 (~40 s)
#   links               the model's links: NVLink pair, testbed network pair (~40 s)
#   enqueue             T6: hier's BenchmarkGPUEnqueue (host time to enqueue one
#                       single-slice AllReduce) into enqueue.txt (~1 min)
#   enqueue-job         T6 for one rank per process: BenchmarkGPUEnqueueJob on
#                       the testbed's 2×1 into enqueue-job.txt (~30 s)
#   fault MxD ...       the fault runs: M×D workers under
#                       fairrun (on the testbed when M > 1; 2x2 and 4x2 share
#                       one GPU) run 16 MiB allreduces, and the last rank, after
#                       4 s, per FAULT_MODES (default "kill cut stall"): kill:
#                       SIGKILLs itself; passes when fairrun names it and every
#                       survivor's Wait returns a typed error within timeout +
#                       5 s; cut: closes its store connection, calls on (every
#                       result right) for 3 s, then stops calling; passes when
#                       every survivor gets a *hier.TimeoutError within timeout
#                       + 5 s; stall: stops calling; passes when every rank,
#                       itself included, gets a *hier.TimeoutError within
#                       timeout + 5 s. Every mode also needs no worker process
#                       left behind (timeout 10 s; ~30-40 s each)
#   soak [MxD]          4x2 (or MxD) under fairrun for SOAK_SECONDS (600):
#                       rounds of 2-8 allreduces in flight at once, mixed
#                       dtypes and sizes up to 16 MiB, every result checked;
#                       PASS only with no wrong result and no hang (the
#                       Reducers' timeout is 60 s). One command of the device
#                       lasts at most 10 minutes: there, SOAK_SECONDS=480
#   launchers           examples/allreduce without fairrun: under torchrun
#                       (--nproc-per-node = the GPUs) and mpirun -np GPUs (skipped
#                       when Open MPI is absent) (~30 s)
#   hook MxD ...        the PyTorch comm hook on M×D (torchrun for 1×D, fairrun's
#                       testbed otherwise): python/tests/gpu_smoke.py, then
#                       examples/ddp_torch's ResNet-18, HOOK_STEPS steps, with DDP's
#                       allreduce (default, NCCL_ALGO=allreduce:ring and
#                       allreduce:tree) and with fairgo's hook, same seeds:
#                       fairgo's losses within the envelope of the NCCL runs,
#                       step-0 gradients within the float32 bound, images/s
#                       (~2–3 min each); HOOK_ROUNDS=N adds rounds 2..N of
#                       fairgo's hook beside DDP's (~1 min a run);
#                       HOOK_PAIRED=1 trains the four in one launch
#                       instead, in turns of HOOK_BLOCK steps (each round
#                       one of S7's)
#   targets             T1–T8: every bench section above twice (runs r1, r2; r1
#                       checks results), then the targets, the model and a
#                       digest (~6 min)
#   onegpu PART ...     the U targets on one GPU (and S4, S8) (run RUN): PART is shared
#                       (ONEGPU_LAYOUTS: 2×2, 2×4, 4×2 at 2.5 Gbit/s, 1M–256M, and 20 back to
#                       back at 1M–16M; ~5 min), single (2×1, 4×1, 8×1 at
#                       10 Gbit/s, 256K–256M, and 20 back to back up to 16M;
#                       ~3 min), overlap (64 × 25 MiB on 2×2 and 2×4 at 2.5
#                       Gbit/s; ~3 min), enqueue (T6 on 2×1; ~20 s) or s4
#                       (shared's sweeps at 1M–256M of fairgo and nocheck
#                       alone, for S4 and S6; ~90 s a layout). Every sweep
#                       measures flat, flat-ring, flat-tree, naive, fairgo,
#                       fairgo without the check on fairgo's routes (nocheck:
#                       check:off,routes:fairgo, for U5 and S6) and, but in
#                       s4, the routes Auto chooses among (U6). What one GPU
#                       allows of the S targets is two device commands a run,
#                       each under 10 minutes: RUN=r1 VARIANTS="fairgo
#                       nocheck=check:off,routes:fairgo" NODES_LAYOUTS="8x1
#                       16x1" NODES_ITERS="1 20" scripts/gpu.sh nodes, then
#                       RUN=r1 ONEGPU_OVERLAP_LAYOUTS=2x4 scripts/gpu.sh
#                       onegpu overlap enqueue s4; the same with RUN=r2; then,
#                       with both runs' records under OUT/json and MODEL_LINKS
#                       giving the NVLink link, TARGET_SETS=S ... analyse
#   nodes               fairgo across node counts over real NVLink, on a host
#                       of 4 GPUs with NICs of 10 Gbit/s: the NVLink pair
#                       (fairbench links, for the model), 1x4 (one rank per
#                       process, no emulated network: S1), then 2x1 4x1 2x2
#                       8x1 16x1 on the testbed (8x1 and 16x1 put 2 and 4
#                       ranks on each GPU, under MPS), 64K-64M, 5
#                       repetitions of flat, flat-ring, flat-tree, naive and
#                       fairgo (and the VARIANTS, e.g. "fairgo
#                       nocheck=check:off,routes:fairgo" for S6), each
#                       repetition of a small size repeated to REP_BYTES,
#                       of a large one NODES_MIN_ROUNDS times (4);
#                       then fairbench nodes: nodes.txt and
#                       plots/nodes_fairgo_vs_best.png and .svg (fairgo/best
#                       per layout, measured and modelled, and 64x8 at real
#                       link speeds). 4.5 min on 4 × H100 (16x1 1.5 min, 8x1
#                       70 s, 4x1 40 s, 2x2 30 s, 2x1 25 s, 1x4 and the
#                       NVLink pair 10 s each); every step's limit together
#                       (~9.5 min) stays under one device command's 10
#                       minutes (NODES_LAYOUTS to choose layouts). On a
#                       host of one GPU, NODES_LAYOUTS="8x1 16x1" puts 8 or
#                       16 ranks on it (S3, S5 there) and the NVLink pair
#                       is skipped: MODEL_LINKS gives the model its NVLink
#                       (the network's is fitted from 8x1's flat-ring)
#   ab SECTION [ARGS]...  the rest of the command line with several builds
#                       in turn, BIN (a) and BIN_B (b; several directories,
#                       space-separated, are c, d, ...), AB_ROUNDS times,
#                       forward then backward (runs a1 b1 b2 a2 ..., or
#                       a1 b1 c1 c2 b2 a2 ...: a drift of the host weighs
#                       on all alike), each as a run of its own (RUN, the
#                       records' "run"); then fairbench report over every
#                       record into ab.txt, fairgo / best per run side by
#                       side. For bench sections (nodes, testbed, overlap,
#                       enqueue); e.g.
#                       BIN_B=bin-prev NODES_LAYOUTS="8x1 16x1" scripts/gpu.sh ab nodes
#   analyse             targets (TARGET_SETS), model and digest of the
#                       records under $OUT/json (S7 from the hook section's
#                       $OUT/resnet-*.json), and the nodes report where the
#                       nodes section left records
#
# Settings (environment): OUT (default ./out), BIN (./bin), NIC_GBIT (10;
# on one GPU the targets' testbed is 2.5, a ~10:1 ratio to the loopback that
# stands in for NVLink), NVLINK_GBIT (shapes each machine's loopback with
# --nvlink-gbit where ranks of a machine share GPUs; default not shaped),
# NIC_LATENCY (e.g. 50us; default none), NIC_QUEUE and NIC_RTO_MIN
# (fairrun's --nic-queue and --nic-rto-min; default fairrun's), MPS (auto), RUN (r1: the run label
# of single bench sections), RUNS ("r1 r2": targets), CHECK_RESULTS (onegpu:
# 1 checks every result, 0 warms up instead), NODES_MIN_ROUNDS (nodes: the
# fewest rounds a repetition times, fairbench's -min-rounds; 4: at 64M one
# call at a time a point is then a median of repetitions of four calls,
# not of one each), REP_BYTES (onegpu: a
# repetition repeats its calls until they moved this much, 64M, so that a
# point below it is a mean of many calls, not one), VARIANTS (further
# fairgo variants, e.g. "rsag=algo:rail-rsag a2a=algo:rail-a2a"), ENQUEUE
# (T6: µs, or a file of `go test -bench` output; default enqueue.txt when
# the enqueue section made it), TARGET_SETS (the targets analyse computes:
# S, T, U, comma-separated, or all; default all), NODES_LAYOUTS (the nodes
# section's layouts; default "1x4 2x1 4x1 2x2 8x1 16x1"), NODES_ITERS (the nodes
# section's calls back to back per timed unit, e.g. "1 20": 1 is the report's,
# others are records b2bN-MxD beside it, at NODES_B2B_SIZES, default
# "-b 64K -e 16M -f 4"; default 1), ONEGPU_LAYOUTS (the layouts of onegpu
# shared; default "2x2 2x4 4x2"), ONEGPU_OVERLAP_LAYOUTS (onegpu overlap's;
# default "2x2 2x4"), OVERLAP_ALGOS (the methods of the overlap sections,
# fairbench's -algos; default every baseline and fairgo, whose variants
# are VARIANTS where given), NODES_FLAGS (further flags of the nodes
# section's fairbench sweeps, e.g. "-work-wait end" to wait for fairgo's
# Works only at each repetition's end; default none), ENQUEUE_BENCH (the benchmarks T6 takes the
# worst of, a regular expression; default Enqueue), MODEL_LINKS (links given
# to the model instead of fitted, e.g. "-nvlink-alpha-us 6.5 -nvlink-gbps 315"
# on a host of one GPU), NVLINK_SIZES, NET_SIZES, RAPID_CHECKS (hier's
# property test: 25 in one process, LAUNCHED_RAPID_CHECKS 10 per layout
# under fairrun), FAULT_MODES, SOAK_SECONDS, TEST_COUNT (tests-launched runs
# each test this many times, its time limits grown alike: a flake hunt, e.g.
# TEST_COUNT=5 scripts/gpu.sh tests-launched 2x2), HOOK_ALGORITHMS (hook: one
# more ResNet-18 run of fairgo's hook per algorithm listed, FAIRGO_ALGORITHM
# fixed, images/s only; e.g. "flat rail-rsag"), HOOK_ROUNDS (hook: rounds
# of fairgo's hook beside DDP's default and fastest setting, 1 by default;
# S7 takes the median of the rounds' ratios), HOOK_PAIRED and HOOK_BLOCK
# (hook: 1 trains fairgo's hook and DDP's three settings in one launch,
# one model each, in turns of HOOK_BLOCK steps, 25 by default, the order
# rotated every round: each round is one of S7's, and the host's drift
# between launches weighs on none of them; 0 by default), HOOK_PAIR (the
# runs of a paired launch, fairgo,default,ring,tree by default; add pyhook
# for DDP's allreduce through PyTorch's own Python comm hook, shown but not
# compared with), HOOK_STEPS (hook: training
# steps of each ResNet-18 run, the first 5 not timed; 50 by default: more
# steps average more of the host's noise, ~15 ms a step on 1×4), HOOK_LIB and HOOK_PYTHON
# (hook: the libfairgo.so and the fairgo_torch directory under test,
# default lib/libfairgo.so and python: another build's for a comparison;
# the package checks the library's ABI version), STALL_DUMP_SECONDS (a test
# binary whose log is silent this long gets SIGQUIT for its stacks; 45, under
# the tests' one-minute timeouts), BIN_B and AB_ROUNDS (ab: the other
# builds' binaries, each as bin/ of make gpu-bin in another tree, and how
# many rounds of all; default 2).
#
# Under $OUT: results.tgz (everything below, packed every 15 s while the
# run lasts and once at its end: a remote runner that brings back only a
# few files, or kills a run at its time limit, still gets every record),
# machine.txt, logs/STEP.log (every command's output; all of
# them packed again in logs.tgz),
# json/RUN-STEP.jsonl (the records), gpu-timing.json (hier's GPU timing
# test), enqueue.txt (the enqueue benchmark), and from targets/analyse
# targets.json, targets.txt, model.txt, digest.txt, results.csv; from
# nodes (and analyse after it) nodes.txt and plots/. The last
# thing printed is the targets table (when made) and a table of the steps.
# Exit status 0 when every step passed (a target missed is not a failed step).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these shared hosts, in every process

OUT=${OUT:-./out}
BIN=${BIN:-./bin}
NIC_GBIT=${NIC_GBIT:-10}
NVLINK_GBIT=${NVLINK_GBIT:-}
NIC_LATENCY=${NIC_LATENCY:-}
NIC_QUEUE=${NIC_QUEUE:-}
NIC_RTO_MIN=${NIC_RTO_MIN:-}
MPS=${MPS:-auto}
RUN=${RUN:-r1}
REP_BYTES=${REP_BYTES:-64M}
NODES_MIN_ROUNDS=${NODES_MIN_ROUNDS:-4}
RUNS=${RUNS:-r1 r2}
VARIANTS=${VARIANTS:-}
ENQUEUE=${ENQUEUE:-}
ENQUEUE_BENCH=${ENQUEUE_BENCH:-Enqueue}
TARGET_SETS=${TARGET_SETS:-all}
NODES_LAYOUTS=${NODES_LAYOUTS:-1x4 2x1 4x1 2x2 8x1 16x1}
NODES_ITERS=${NODES_ITERS:-1}
ONEGPU_LAYOUTS=${ONEGPU_LAYOUTS:-2x2 2x4 4x2}
ONEGPU_OVERLAP_LAYOUTS=${ONEGPU_OVERLAP_LAYOUTS:-2x2 2x4}
OVERLAP_ALGOS=${OVERLAP_ALGOS:-flat,flat-ring,flat-tree,naive,fairgo}
NODES_FLAGS=${NODES_FLAGS:-}
MODEL_LINKS=${MODEL_LINKS:-}
RAPID_CHECKS=${RAPID_CHECKS:-25}
LAUNCHED_RAPID_CHECKS=${LAUNCHED_RAPID_CHECKS:-10}
FAULT_MODES=${FAULT_MODES:-kill cut stall}
SOAK_SECONDS=${SOAK_SECONDS:-600}
STALL_DUMP_SECONDS=${STALL_DUMP_SECONDS:-45}
TEST_COUNT=${TEST_COUNT:-1}
HOOK_ALGORITHMS=${HOOK_ALGORITHMS:-}
HOOK_ROUNDS=${HOOK_ROUNDS:-1}
HOOK_PAIRED=${HOOK_PAIRED:-0}
HOOK_BLOCK=${HOOK_BLOCK:-25}
HOOK_PAIR=${HOOK_PAIR:-fairgo,default,ring,tree}
HOOK_STEPS=${HOOK_STEPS:-50}
HOOK_LIB=${HOOK_LIB:-lib/libfairgo.so}
HOOK_PYTHON=${HOOK_PYTHON:-python}
NVLINK_SIZES=${NVLINK_SIZES:--b 64K -e 1G -f 4}
NET_SIZES=${NET_SIZES:--b 1M -e 1G -f 4}
BIN_B=${BIN_B:-}
AB_ROUNDS=${AB_ROUNDS:-2}
mkdir -p "$OUT/logs" "$OUT/json"
OUT=$(cd "$OUT" && pwd)

# pack_results: $OUT, but for the pack itself, into results.tgz (written
# elsewhere and moved in, so that a reader never sees half of one; tar's
# status 1 is a file that grew while read, a log being written).
pack_results() {
  local part="${TMPDIR:-/tmp}/gpu-sh-results.$$.tgz"
  tar czf "$part" -C "$OUT" --exclude=./results.tgz --exclude=./results.tgz.part . 2>/dev/null
  [ $? -le 1 ] && mv "$part" "$OUT/results.tgz.part" && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
}
packer=""
if [ -z "${GPU_SH_PACKING:-}" ]; then # the outermost run packs; the ab section's inner runs do not
  export GPU_SH_PACKING=1
  (
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do
      sleep 15 &
      nap=$!
      wait "$nap"
      pack_results
    done
  ) >/dev/null 2>&1 &
  packer=$!
fi

declare -a table
status=0
CHECK=(-check -w 0) # the check's call of each method warms it up

# note STATUS NAME SECONDS DETAIL: a line of the final table.
note() {
  table+=("$(printf '%-4s %-28s %5ss  %s' "$1" "$2" "$3" "$4")")
  [ "$1" = PASS ] || [ "$1" = SKIP ] || status=1
}

# step NAME LIMIT CMD...: runs CMD with NCCL_NVLS_ENABLE=0 and a time limit,
# output to logs/NAME.log; sets rc and secs. Where STALL_BIN is set (a test
# binary's name), a log that stops growing for STALL_DUMP_SECONDS gets the
# goroutine dumps of every process of that binary (SIGQUIT, GOTRACEBACK=all)
# and a "== stall:" line: a hang leaves its stacks, not only its timeout.
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS log="$OUT/logs/$name.log" watcher=""
  echo "== $name: $*" >"$log"
  if [ -n "${STALL_BIN:-}" ]; then
    stall_dump "$log" "$STALL_BIN" &
    watcher=$!
  fi
  timeout -k 10 "$limit" env NCCL_NVLS_ENABLE=0 GOTRACEBACK=all "$@" >>"$log" 2>&1
  rc=$?
  [ -n "$watcher" ] && kill "$watcher" 2>/dev/null && wait "$watcher" 2>/dev/null
  secs=$((SECONDS - t0))
  [ "$rc" -eq 124 ] && echo "== $name: killed after ${limit}s" >>"$log"
}

# stall_dump LOG BIN: SIGQUIT to every process named BIN once LOG has not
# grown for STALL_DUMP_SECONDS (checked every 5 s).
stall_dump() {
  local log=$1 bin=$2 last=-1 same=0 size
  while sleep 5; do
    size=$(stat -c %s "$log" 2>/dev/null || echo 0)
    if [ "$size" = "$last" ]; then same=$((same + 5)); else same=0 last=$size; fi
    if [ "$same" -ge "$STALL_DUMP_SECONDS" ]; then
      echo "== stall: no output for ${same}s: SIGQUIT to every $bin (goroutine dumps follow)" >>"$log"
      pkill -QUIT -x "$bin"
      return
    fi
  done
}

need() {
  local b
  for b in "$@"; do
    if [ ! -x "$BIN/$b" ]; then
      note FAIL "$b" 0 "missing $BIN/$b: run make gpu-bin on the build machine"
      return 1
    fi
  done
}

machine() {
  {
    date -u
    nvidia-smi -L 2>&1
    nvidia-smi topo -m 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv 2>&1
    ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* 2>&1
    env | grep -E '^(NCCL|CUDA|FAIRGO)_' | sort
    # The CPUs the runs may use: busy-polling threads (NCCL's proxies,
    # fairgo's waits) of many ranks compete for them.
    echo "nproc=$(nproc) online=$(cat /sys/devices/system/cpu/online 2>/dev/null)"
    echo "cgroup cpu.max=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null)"
    echo "loadavg=$(cat /proc/loadavg 2>/dev/null)"
    # The scheduler a napping poller wakes under: its kernel and time slice.
    echo "kernel=$(uname -r) base_slice_ns=$(cat /sys/kernel/debug/sched/base_slice_ns 2>/dev/null || sysctl -n kernel.sched_base_slice_ns 2>/dev/null)"
    echo "cpuidle=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null) hypervisor=$(grep -c -m1 hypervisor /proc/cpuinfo 2>/dev/null)"
  } >"$OUT/machine.txt"
}

# gpus: the GPUs fairrun spreads emulated machines over (CUDA_VISIBLE_DEVICES,
# else nvidia-smi -L, else 1).
gpus() {
  local n
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    n=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
  else
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  fi
  echo $((n > 0 ? n : 1))
}

# fairrun_flags M D: the testbed of M emulated machines of D ranks each; with
# NVLINK_GBIT, their loopback shaped where D ranks share the GPUs (fairrun
# refuses --nvlink-gbit where every rank has a GPU of its own).
fairrun_flags() {
  local f=(--emulate-machines "$1" --nic-gbit "$NIC_GBIT" --mps "$MPS")
  [ -n "$NIC_LATENCY" ] && f+=(--nic-latency "$NIC_LATENCY")
  [ -n "$NIC_QUEUE" ] && f+=(--nic-queue "$NIC_QUEUE")
  [ -n "$NIC_RTO_MIN" ] && f+=(--nic-rto-min "$NIC_RTO_MIN")
  [ -n "$NVLINK_GBIT" ] && [ "$2" -gt "$(gpus)" ] && f+=(--nvlink-gbit "$NVLINK_GBIT")
  echo "${f[@]}"
}

variant_flags() {
  local v
  for v in $VARIANTS; do printf -- '-fairgo %s ' "$v"; done
}

# has_gpu: nvidia-smi lists a GPU.
has_gpu() { [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -gt 0 ]; }

# count_tests LOG: "pass fail skip gpuskip" of a go test -test.v log (lines
# may carry fairrun's "[rank] " prefix). A GPU skip is a skip whose reason
# (the line before "--- SKIP") speaks of a GPU, the driver or NCCL: on a
# host with a GPU none may skip.
count_tests() {
  sed -E 's/^\[[0-9]+\] //' "$1" | awk '
    /^[[:space:]]*--- PASS: / { p++ }
    /^[[:space:]]*--- FAIL: / { f++ }
    /^[[:space:]]*--- SKIP: / { s++; if (prev ~ /GPU|driver|NCCL|libcuda/) g++ }
    { prev = $0 }
    END { print p + 0, f + 0, s + 0, g + 0 }'
}

# test_verdict NAME LOG WHAT: the table line of a test step from its log
# (rc from step); fails on a failed test, no passed test, or a GPU test
# skipped where there is a GPU.
test_verdict() {
  local name=$1 log=$2 what=$3 pass fail skip gskip
  read -r pass fail skip gskip < <(count_tests "$log")
  local verdict=PASS
  { [ "$rc" -ne 0 ] || [ "$fail" -ne 0 ] || [ "$pass" -eq 0 ]; } && verdict=FAIL
  [ "$gskip" -ne 0 ] && has_gpu && verdict=FAIL
  note "$verdict" "$name" "$secs" "rc=$rc pass=$pass fail=$fail skip=$skip gpu-skip=$gskip $what"
  [ "$fail" -ne 0 ] && note FAIL "  failed" 0 "$(sed -E 's/^\[[0-9]+\] //' "$log" | grep -E '^\s*--- FAIL: ' | awk '{print $3}' | sort -u | head -8 | paste -sd' ')"
  grep -q '^== stall:' "$log" && note FAIL "  stalled" 0 "$(grep -m1 '^== stall:' "$log" | cut -c4-)"
  [ "$gskip" -ne 0 ] && note "$(has_gpu && echo FAIL || echo SKIP)" "  skipped" 0 "$(sed -E 's/^\[[0-9]+\] //' "$log" | grep -E '^\s*--- SKIP: ' | awk '{print $3}' | sort -u | head -8 | paste -sd' ')"
  return 0
}

# gotest NAME BINARY LIMIT REGEX [ARGS]: a test binary, the tests chosen by
# name; the verdict from the binary's exit status and its --- lines.
gotest() {
  local name=$1 bin=$2 limit=$3 re=$4
  shift 4
  need "$bin" || return
  STALL_BIN=$bin step "$name" "$limit" "$BIN/$bin" -test.v -test.count=1 -test.timeout "$((limit - 15))s" -test.run "$re" "$@"
  test_verdict "$name" "$OUT/logs/$name.log" "-test.run '$re'"
}

section_tests_local() {
  gotest nccl nccl.test 60 '.'
  gotest cuda cuda.test 180 '.'
  gotest ddpgpu ddpgpu.test 60 '.'
  FAIRGO_OUT=$OUT gotest hier-gpu hier.test 270 '^TestGPU' -rapid.checks="$RAPID_CHECKS"
}

# launched_limit M D: seconds hier's tests may take under fairrun on M×D
# (TEST_COUNT times).
launched_limit() { echo $(((90 + 25 * $1 * $2) * TEST_COUNT)); }

# cuda_launched_limit M D: the same for cuda's communicator tests.
cuda_launched_limit() { echo $(((60 + 10 * $1 * $2) * TEST_COUNT)); }

# The cuda tests that have a launcher form (one rank per process, the
# launcher's grid); the others run in tests-local only.
CUDA_LAUNCHED_TESTS=${CUDA_LAUNCHED_TESTS:-'^Test(LocalRanks|CommArgs|CommAbort|Duplicate)$'}

# launched_test NAME BINARY LIMIT M D REGEX [ARGS]: a test binary under
# fairrun on M×D, one rank per process; every rank must pass the same tests.
launched_test() {
  local name=$1 bin=$2 limit=$3 m=$4 d=$5 re=$6 n=$(($4 * $5))
  shift 6
  # shellcheck disable=SC2046
  FAIRGO_OUT=$OUT STALL_BIN=$bin step "$name" "$limit" "$BIN/fairrun" $(fairrun_flags "$m" "$d") --nproc-per-node "$n" --grace 10s -- \
    "$BIN/$bin" -test.v -test.count="$TEST_COUNT" -test.timeout "$((limit - 20))s" -test.run "$re" "$@"
  local log="$OUT/logs/$name.log" ranks
  ranks=$(grep -cE '^\[[0-9]+\] PASS$' "$log")
  test_verdict "$name" "$log" "ranks passing=$ranks/$n (fairrun ${m}x$d, one rank per process, -test.run '$re', -test.count $TEST_COUNT)"
  [ "$ranks" -eq "$n" ] || note FAIL "  ranks" 0 "only $ranks of $n ranks ended with PASS"
}

# section_tests_launched MxD ...: hier's ^TestGPU tests and cuda's
# communicator tests, one rank per process under fairrun on each layout.
section_tests_launched() {
  need fairrun hier.test cuda.test || return
  local l m d
  for l in "$@"; do
    m=${l%x*} d=${l#*x}
    launched_test "hier-gpu-$l" hier.test "$(launched_limit "$m" "$d")" "$m" "$d" '^TestGPU' -rapid.checks="$LAUNCHED_RAPID_CHECKS"
    launched_test "cuda-gpu-$l" cuda.test "$(cuda_launched_limit "$m" "$d")" "$m" "$d" "$CUDA_LAUNCHED_TESTS"
  done
}

section_tests() {
  section_tests_local
  if [ $# -gt 0 ]; then section_tests_launched "$@"; else section_tests_launched 2x1 4x1 2x2 4x2; fi
}

# allreduce NAME NPROC "FAIRRUN FLAGS" "ALLREDUCE FLAGS": every rank prints ok.
allreduce() {
  local name=$1 nproc=$2 fr=$3 ar=$4
  need fairrun allreduce || return
  # shellcheck disable=SC2086
  step "$name" 150 "$BIN/fairrun" --nproc-per-node "$nproc" $fr -- "$BIN/allreduce" -backend cuda $ar
  local oks
  oks=$(grep -cE '^\[[0-9]+\] ok ' "$OUT/logs/$name.log")
  local verdict=PASS
  { [ "$rc" -ne 0 ] || [ "$oks" -ne "$nproc" ]; } && verdict=FAIL
  note "$verdict" "$name" "$secs" "rc=$rc ok=$oks/$nproc"
}

section_fairrun() {
  # 1 × 2: one GPU each where there are two; on one GPU, one emulated
  # machine whose two ranks share it (each its own NCCL host).
  local one=""
  [ "$(gpus)" -ge 2 ] || one="--emulate-machines 1 --mps on"
  allreduce allreduce-1x2-f32 2 "$one --shuffle-ranks 3" "-dtype float32 -op sum -count 1048579 -iters 2"
  allreduce allreduce-1x2-bf16 2 "$one" "-dtype bfloat16 -op avg -count 3000001"
  allreduce allreduce-2x2-f32 4 "$(fairrun_flags 2 2) --shuffle-ranks 7" "-dtype float32 -op sum -count 1048579 -iters 2"
  allreduce allreduce-2x2-i64 4 "$(fairrun_flags 2 2) --shuffle-ranks 5" "-dtype int64 -op min -count 100003 -flat-threshold -1"
  allreduce allreduce-4x2-bf16 8 "$(fairrun_flags 4 2) --shuffle-ranks 9" "-dtype bfloat16 -op avg -count 1000003 -slice 1048576"
  allreduce allreduce-4x2-f16 8 "$(fairrun_flags 4 2)" "-dtype float16 -op prod -count 65537 -flat-threshold -1"
}

# ddp_check NAME: the loss falls and the replicas end identical.
ddp_check() {
  local log="$OUT/logs/$1.log" first last verdict=PASS
  first=$(grep -E 'epoch +[0-9]+ +loss' "$log" | head -1 | sed -E 's/.*loss ([0-9.eE+-]+).*/\1/')
  last=$(grep -E 'epoch +[0-9]+ +loss' "$log" | tail -1 | sed -E 's/.*loss ([0-9.eE+-]+).*/\1/')
  if [ "$rc" -ne 0 ] || [ -z "$first" ] || [ -z "$last" ] || ! grep -q 'replicas identical' "$log" ||
    ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
    verdict=FAIL
  fi
  note "$verdict" "$1" "$secs" "rc=$rc loss ${first:-?} -> ${last:-?}"
}

section_ddp() {
  local model="-in 128 -hidden 1024 -depth 2 -classes 10 -batch 256 -epochs 8 -steps 40"
  if need ddp; then
    # shellcheck disable=SC2086
    step ddp-1x2 150 "$BIN/ddp" -backend cuda -machines 1 -devices 2 $model
    ddp_check ddp-1x2
  fi
  if need fairrun ddp; then
    # shellcheck disable=SC2086
    step ddp-2x2-testbed 180 "$BIN/fairrun" $(fairrun_flags 2 2) --nproc-per-node 4 -- "$BIN/ddp" -backend cuda $model
    ddp_check ddp-2x2-testbed
  fi
}

# bench NAME LIMIT CMD...: a fairbench command that writes json/RUN-NAME.jsonl;
# passes when it exits 0 and no record has a wrong element or is invalid.
# The note says the intra-machine link the records state (fairrun's
# testbed: nvlink, or loopback standing in for it) and whether flat NCCL
# was topology-unaware there.
bench() {
  local name=$1 limit=$2
  shift 2
  local js="$OUT/json/$RUN-$name.jsonl"
  rm -f "$js"
  step "$RUN-$name" "$limit" "$@" -run "$RUN" -json "$js"
  local n=0 wrong=0 invalid=0 intra=""
  if [ -f "$js" ]; then
    n=$(grep -c . "$js")
    wrong=$(grep -c '"wrong":[1-9]' "$js")
    invalid=$(grep -c '"invalid":' "$js")
    intra=$(grep -m1 -o '"intra":"[a-z]*"' "$js" | cut -d'"' -f4)
    grep -q '"flat_topology_unaware":true' "$js" && intra+=" flat-unaware"
  fi
  local verdict=PASS
  { [ "$rc" -ne 0 ] || [ "$n" -eq 0 ] || [ "$wrong" -ne 0 ] || [ "$invalid" -ne 0 ]; } && verdict=FAIL
  note "$verdict" "$RUN-$name" "$secs" "rc=$rc records=$n wrong=$wrong invalid=$invalid${intra:+ intra=$intra}"
}

section_bench_1x2() {
  need fairbench || return
  local dt n
  for dt in float32 bfloat16; do
    for n in 1 20; do
      # shellcheck disable=SC2086,SC2046
      bench "1x2-$dt-n$n" 120 "$BIN/fairbench" sweep -backend cuda -machines 1 -devices 2 -dtype "$dt" $NVLINK_SIZES \
        -n "$n" -reps 3 "${CHECK[@]}" -label 1x2 $(variant_flags)
    done
  done
}

section_bench_2x1() {
  need fairbench || return
  # shellcheck disable=SC2086,SC2046
  bench 2x1 120 "$BIN/fairbench" sweep -backend cuda -machines 2 -devices 1 $NET_SIZES -n 1 -reps 3 "${CHECK[@]}" -label 2x1 $(variant_flags)
}

# testbed_limit: seconds a testbed sweep may take: 300 at 10 Gbit/s and
# above, more as the NIC slows (2.5 Gbit/s: 960).
testbed_limit() {
  awk -v g="$NIC_GBIT" 'BEGIN { l = int(2400 / g); print (l < 300 ? 300 : l) }'
}

section_testbed() {
  need fairrun fairbench || return
  local l m d
  for l in "$@"; do
    m=${l%x*} d=${l#*x}
    # shellcheck disable=SC2086,SC2046
    bench "testbed-$l" "$(testbed_limit)" "$BIN/fairrun" $(fairrun_flags "$m" "$d") --nproc-per-node $((m * d)) -- \
      "$BIN/fairbench" sweep -backend cuda $NET_SIZES -n 1 -reps 3 "${CHECK[@]}" -label "testbed-$l" $(variant_flags)
  done
}

# onegpu_sweep LAYOUT GBIT SIZES VARIANTS ITERS: one sweep of the U targets'
# testbed; the first run checks results.
onegpu_sweep() {
  local l=$1 gbit=$2 sizes=$3 variants=$4 iters=$5 m d
  m=${l%x*} d=${l#*x}
  # shellcheck disable=SC2086,SC2046
  bench "onegpu-$l-n$iters" "$(testbed_limit)" "$BIN/fairrun" $(NIC_GBIT=$gbit fairrun_flags "$m" "$d") --nproc-per-node $((m * d)) -- \
    "$BIN/fairbench" sweep -backend cuda $sizes -n "$iters" -reps 3 -rep-bytes "$REP_BYTES" "${CHECK[@]}" -label "onegpu-$l" $variants
}

section_onegpu() {
  need fairrun fairbench hier.test || return
  local part l
  # The first run checks every result (its check call warms each method);
  # a second run (CHECK_RESULTS=0) warms up with one untimed call instead.
  local CHECK=(-check -w 0)
  [ "${CHECK_RESULTS:-1}" = 1 ] || CHECK=(-w 1)
  local both="-fairgo fairgo -fairgo nocheck=check:off,routes:fairgo"
  for part in "$@"; do
    case $part in
    shared)
      for l in $ONEGPU_LAYOUTS; do
        onegpu_sweep "$l" 2.5 "-b 1M -e 256M -f 4" "$both -fairgo rar=algo:rail-allreduce -fairgo rsag=algo:rail-rsag" 1
        onegpu_sweep "$l" 2.5 "-b 1M -e 16M -f 4" "$both" 20
      done
      ;;
    s4)
      for l in $ONEGPU_LAYOUTS; do
        onegpu_sweep "$l" 2.5 "-b 1M -e 256M -f 4" "$both" 1
      done
      ;;
    single)
      for l in 2x1 4x1 8x1; do
        onegpu_sweep "$l" 10 "-b 256K -e 256M -f 4" "$both -fairgo sep=fp:0,routes:fairgo -fairgo fflat=algo:flat -fairgo rar=algo:rail-allreduce" 1
        onegpu_sweep "$l" 10 "-b 256K -e 16M -f 4" "$both -fairgo sep=fp:0,routes:fairgo" 20
      done
      ;;
    overlap)
      for l in $ONEGPU_OVERLAP_LAYOUTS; do
        # shellcheck disable=SC2046
        bench "onegpu-overlap-$l" "$(testbed_limit)" "$BIN/fairrun" $(NIC_GBIT=2.5 fairrun_flags "${l%x*}" "${l#*x}") \
          --nproc-per-node $((${l%x*} * ${l#*x})) -- "$BIN/fairbench" overlap -backend cuda -buckets 64 -bucket-bytes 25M -w 0 -reps 3 \
          -algos "$OVERLAP_ALGOS" -label "onegpu-$l" $(variant_flags)
      done
      ;;
    enqueue)
      # shellcheck disable=SC2046
      step "$RUN-enqueue-job" 200 "$BIN/fairrun" $(NIC_GBIT=10 fairrun_flags 2 1) --nproc-per-node 2 -- env FAIRGO_ENQUEUE_WORKER=1 \
        "$BIN/hier.test" -test.run '^$' -test.bench '^BenchmarkGPUEnqueueJob$' -test.benchtime 1000x -test.timeout 180s
      grep -E '^\[0\] Benchmark' "$OUT/logs/$RUN-enqueue-job.log" | sed 's/^\[0\] //' >"$OUT/$RUN-enqueue-job.txt"
      note "$([ "$rc" -eq 0 ] && [ -s "$OUT/$RUN-enqueue-job.txt" ] && echo PASS || echo FAIL)" "$RUN-enqueue-job" "$secs" "rc=$rc ($RUN-enqueue-job.txt)"
      ;;
    *)
      note FAIL "onegpu $part" 0 "unknown part (shared, single, overlap, enqueue, s4)"
      ;;
    esac
  done
}

# The nodes section's NIC rate and sizes: fairbench nodes and the S targets
# compare the layouts at this rate.
NODES_GBIT=10
NODES_SIZES=${NODES_SIZES:-"-b 64K -e 64M -f 4"}
# Calls back to back stop at 16M: 20 calls of 64M over a 10 Gbit/s NIC take
# a second per method and repetition, which no step's limit holds.
NODES_B2B_SIZES=${NODES_B2B_SIZES:-"-b 64K -e 16M -f 4"}

# nodes_limit M D: seconds one nodes sweep may take: 1.4 to 6 times what it
# took on 4 × H100 (16x1 93 s of 152, 8x1 68 of 96), so that every limit of
# the section together (571 s) stays under the device's 10 minutes.
nodes_limit() { echo $((40 + 7 * $1 * $2)); }

section_nodes() {
  need fairrun fairbench || return
  local l m d fr n name sizes
  if [ "$(gpus)" -ge 2 ]; then
    # shellcheck disable=SC2086
    bench nodes-nvlink 45 "$BIN/fairbench" links -backend cuda -link nvlink $NODES_SIZES -w 1 -n 1 -reps 3
  else
    note SKIP nodes-nvlink 0 "one GPU: no NVLink pair to fit (MODEL_LINKS gives the model its links)"
  fi
  for l in $NODES_LAYOUTS; do
    m=${l%x*} d=${l#*x}
    fr=()
    # shellcheck disable=SC2207
    [ "$m" -gt 1 ] && fr=($(NIC_GBIT=$NODES_GBIT fairrun_flags "$m" "$d"))
    for n in $NODES_ITERS; do
      # One call at a time is the report's; n calls back to back are
      # records of their own (b2bN-MxD), beside it.
      name="nodes-$l" sizes=$NODES_SIZES
      [ "$n" -eq 1 ] || name="b2b$n-$l" sizes=$NODES_B2B_SIZES
      # shellcheck disable=SC2086,SC2046
      bench "$name" "$(nodes_limit "$m" "$d")" "$BIN/fairrun" "${fr[@]}" --nproc-per-node $((m * d)) -- \
        "$BIN/fairbench" sweep -backend cuda $sizes -n "$n" -reps 5 -rep-bytes "$REP_BYTES" \
        -min-rounds "$NODES_MIN_ROUNDS" "${CHECK[@]}" \
        -algos flat,flat-ring,flat-tree,naive,fairgo -label "$name" $(variant_flags) $NODES_FLAGS
    done
  done
  nodes_report
}

# nodes_report: fairbench nodes over the nodes section's records (every
# run's; the report takes the first), into nodes.txt and plots/.
nodes_report() {
  local files
  files=$(ls "$OUT"/json/*-nodes-*.jsonl 2>/dev/null | paste -sd, -)
  [ -n "$files" ] || return 0
  # The variant compared: fairgo, or the first of VARIANTS, which replace it.
  local variant=fairgo
  # shellcheck disable=SC2086
  set -- $VARIANTS
  [ $# -gt 0 ] && variant=${1%%=*}
  # shellcheck disable=SC2086
  step nodes-report 20 "$BIN/fairbench" nodes -in "$files" -nic-gbit "$NODES_GBIT" -variant "$variant" \
    -plot "$OUT/plots" $MODEL_LINKS
  tail -n +2 "$OUT/logs/nodes-report.log" >"$OUT/nodes.txt"
  local n
  n=$(grep -c ' measured ' "$OUT/nodes.txt")
  note "$([ "$rc" -eq 0 ] && [ -s "$OUT/plots/nodes_fairgo_vs_best.png" ] && echo PASS || echo FAIL)" nodes-report "$secs" \
    "rc=$rc $n measured points; nodes.txt, plots/nodes_fairgo_vs_best.png"
}

section_overlap() {
  need fairrun fairbench || return
  # shellcheck disable=SC2046
  bench overlap-2x2 "$(testbed_limit)" "$BIN/fairrun" $(fairrun_flags 2 2) --nproc-per-node 4 -- \
    "$BIN/fairbench" overlap -backend cuda -buckets 64 -bucket-bytes 25M -w 1 -reps 3 -algos "$OVERLAP_ALGOS" \
    -label testbed-2x2 $(variant_flags)
}

section_links() {
  need fairrun fairbench || return
  local fr
  fr=$(fairrun_flags 2 1)
  fr=${fr#--emulate-machines 2 } # links sets the machine count itself
  # shellcheck disable=SC2086
  bench links 240 "$BIN/fairbench" links -backend cuda $NET_SIZES -w 1 -n 1 -reps 3 -fairrun "$BIN/fairrun" -fairrun-flags "$fr"
}

# section_ab ARGS...: this script's ARGS with BIN and each build of BIN_B in
# turn (a b c, c b a, ...), each a run of its own, then the report of every
# record.
section_ab() {
  [ $# -gt 0 ] || { echo "usage: BIN_B=DIR... scripts/gpu.sh ab SECTION [ARGS]..." >&2; exit 2; }
  local bins=("$BIN") b
  for b in $BIN_B; do bins+=("$b"); done
  for b in "${bins[@]:1}"; do
    if [ ! -x "$b/fairbench" ]; then
      note FAIL ab 0 "BIN_B holds no fairbench in $b: each of its directories is another build's bin/"
      return
    fi
  done
  if [ ${#bins[@]} -lt 2 ]; then
    note FAIL ab 0 "BIN_B (unset) names no other build's bin/"
    return
  fi
  local letters=(a b c d e f g h) i k side t0 crc order
  [ ${#bins[@]} -le ${#letters[@]} ] || { note FAIL ab 0 "at most ${#letters[@]} builds"; return; }
  for i in $(seq 1 "$AB_ROUNDS"); do
    order=$(seq 0 $((${#bins[@]} - 1)))
    [ $((i % 2)) -eq 0 ] && order=$(seq $((${#bins[@]} - 1)) -1 0)
    for k in $order; do
      side=${letters[$k]}
      t0=$SECONDS
      BIN=${bins[$k]} RUN=$side$i OUT=$OUT bash "$0" "$@" >"$OUT/logs/ab-$side$i.log" 2>&1
      crc=$?
      note "$([ "$crc" -eq 0 ] && echo PASS || echo FAIL)" "ab-$side$i" $((SECONDS - t0)) \
        "rc=$crc BIN=${bins[$k]}: $* (logs/ab-$side$i.log)"
    done
  done
  local files
  files=$(ls "$OUT"/json/[a-h][0-9]*-*.jsonl 2>/dev/null | paste -sd, -)
  [ -n "$files" ] || return 0
  step ab-report 30 "$BIN/fairbench" report -in "$files"
  tail -n +2 "$OUT/logs/ab-report.log" >"$OUT/ab.txt"
  note "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" ab-report "$secs" \
    "rc=$rc ab.txt: fairgo / best per run (a: $BIN, b...: $BIN_B)"
}

section_enqueue() {
  need hier.test || return
  step enqueue 300 "$BIN/hier.test" -test.run '^$' -test.bench '^BenchmarkGPUEnqueue$' -test.benchtime 2000x -test.timeout 280s
  grep -E '^Benchmark' "$OUT/logs/enqueue.log" >"$OUT/enqueue.txt"
  # The engine's own host time on this host's CPUs (a null device, no GPU
  # or NCCL): what of T6 is fairgo's, apart from the backend's calls.
  step enqueue-null 120 "$BIN/hier.test" -test.run '^$' -test.bench '^BenchmarkEngineOverhead$' -test.benchtime 3000x \
    -test.timeout 100s
  grep -E '^Benchmark' "$OUT/logs/enqueue-null.log" >>"$OUT/enqueue.txt"
  local n
  n=$(grep -c 'enqueue-ns/op' "$OUT/enqueue.txt")
  note "$([ "$rc" -eq 0 ] && [ "$n" -gt 0 ] && echo PASS || echo FAIL)" enqueue "$secs" "rc=$rc $n benchmarks (enqueue.txt)"
}

section_enqueue_job() {
  need fairrun hier.test || return
  # shellcheck disable=SC2046
  step enqueue-job 200 "$BIN/fairrun" $(fairrun_flags 2 1) --nproc-per-node 2 -- env FAIRGO_ENQUEUE_WORKER=1 \
    "$BIN/hier.test" -test.run '^$' -test.bench '^BenchmarkGPUEnqueueJob$' -test.benchtime 1000x -test.timeout 180s
  grep -E '^\[0\] Benchmark' "$OUT/logs/enqueue-job.log" | sed 's/^\[0\] //' >"$OUT/enqueue-job.txt"
  local n
  n=$(grep -c 'enqueue-ns/op' "$OUT/enqueue-job.txt")
  note "$([ "$rc" -eq 0 ] && [ "$n" -gt 0 ] && echo PASS || echo FAIL)" enqueue-job "$secs" "rc=$rc $n benchmarks (enqueue-job.txt)"
}

# leftovers: worker processes of the test binary still alive (none may be
# once fairrun has returned; waits up to 5 s for them to go).
leftovers() {
  local n i
  for i in 1 2 3 4 5 6; do
    n=$(pgrep -fc "$BIN/hier.test" 2>/dev/null || true)
    [ "${n:-0}" -eq 0 ] && break
    sleep 1
  done
  echo "${n:-0}"
}

# fault_verdict LOG MODE RANKS VICTIM LIMIT RC LEFT: the verdict of one fault
# run (see the fault section's description).
fault_verdict() {
  local log=$1 mode=$2 n=$3 victim=$4 limit=$5 rc=$6 left=$7 named typed timeouts slow worst want
  named=$(grep -cE "worker failed.* rank=$victim " "$log")
  typed=$(grep -cE 'fault: rank [0-9]+: (Wait returned|Err set) .* typed=true' "$log")
  timeouts=$(grep -cE 'fault: rank [0-9]+: (Wait returned|Err set) .* timeouterror=true' "$log")
  slow=$(grep -E 'fault: rank [0-9]+: (Wait returned|Err set)' "$log" | sed -E 's/.*, ([0-9.-]+) s after the fault.*/\1/' |
    awk -v l="$limit" '$1 >= l { n++ } END { print n + 0 }')
  worst=$(grep -E 'fault: rank [0-9]+: (Wait returned|Err set)' "$log" | sed -E 's/.*, ([0-9.-]+) s after the fault.*/\1/' | sort -g | tail -1)
  local verdict=PASS detail
  case $mode in
  kill)
    { [ "$named" -eq 0 ] || [ "$typed" -ne $((n - 1)) ]; } && verdict=FAIL
    detail="named=$named typed=$typed/$((n - 1))"
    ;;
  stall)
    { [ "$rc" -ne 0 ] || [ "$timeouts" -ne "$n" ]; } && verdict=FAIL
    detail="TimeoutError on $timeouts/$n ranks"
    ;;
  cut)
    want=$(grep -cE "fault: rank $victim: stops calling .* every one right" "$log")
    { [ "$rc" -ne 0 ] || [ "$timeouts" -ne $((n - 1)) ] || [ "$want" -ne 1 ] ||
      ! grep -qE "fault: rank $victim: cut its store connection" "$log"; } && verdict=FAIL
    detail="victim called on after the cut: $([ "$want" -eq 1 ] && echo right || echo NO); TimeoutError on $timeouts/$((n - 1)) survivors"
    ;;
  esac
  { [ "$slow" -ne 0 ] || [ "$left" -ne 0 ]; } && verdict=FAIL
  echo "$verdict" "$detail slowest=${worst:-?}s (limit ${limit}s) left behind=$left"
}

section_fault() {
  need fairrun hier.test || return
  local l m d n fr v mode left
  for l in "$@"; do
    m=${l%x*} d=${l#*x} n=$((m * d))
    fr=(--nproc-per-node "$n" --grace 25s)
    # shellcheck disable=SC2207
    [ "$m" -gt 1 ] && fr+=($(fairrun_flags "$m" "$d"))
    for mode in $FAULT_MODES; do
      step "fault-$mode-$l" 150 "$BIN/fairrun" "${fr[@]}" -- env FAIRGO_FAULT_WORKER=1 FAIRGO_FAULT_MODE="$mode" FAIRGO_FAULT_RANK=$((n - 1)) \
        FAIRGO_FAULT_AFTER=4s FAIRGO_FAULT_CUT_RUN=3s FAIRGO_FAULT_TIMEOUT=10s "$BIN/hier.test" -test.run '^TestWorkerGPUFault$' -test.v
      left=$(leftovers)
      v=$(fault_verdict "$OUT/logs/fault-$mode-$l.log" "$mode" "$n" $((n - 1)) 15 "$rc" "$left")
      note "${v%% *}" "fault-$mode-$l" "$secs" "rc=$rc ${v#* }"
    done
  done
}

# section_soak MxD: the soak (see the description).
section_soak() {
  need fairrun hier.test || return
  local l=$1 m d n
  m=${l%x*} d=${l#*x} n=$((m * d))
  # shellcheck disable=SC2046
  step "soak-$l" $((SOAK_SECONDS + 150)) "$BIN/fairrun" $(fairrun_flags "$m" "$d") --nproc-per-node "$n" --grace 15s -- \
    env FAIRGO_SOAK_WORKER=1 FAIRGO_SOAK_SECONDS="$SOAK_SECONDS" FAIRGO_SOAK_TIMEOUT=60s "$BIN/hier.test" \
    -test.run '^TestWorkerGPUSoak$' -test.v -test.timeout "$((SOAK_SECONDS + 120))s"
  local log="$OUT/logs/soak-$l.log" passed wrong rounds
  passed=$(grep -cE '^\[[0-9]+\] soak: rank [0-9]+: PASS' "$log")
  wrong=$(grep -cE 'soak: rank [0-9]+: WRONG' "$log")
  rounds=$(grep -m1 -oE 'soak: rank [0-9]+: PASS [0-9]+ rounds, [0-9]+ allreduces' "$log" | sed -E 's/.*PASS //')
  local verdict=PASS
  { [ "$rc" -ne 0 ] || [ "$passed" -ne "$n" ] || [ "$wrong" -ne 0 ]; } && verdict=FAIL
  note "$verdict" "soak-$l" "$secs" "rc=$rc ranks passing=$passed/$n wrong=$wrong ${rounds:-no round count} in ${SOAK_SECONDS}s$([ "$rc" -eq 124 ] && echo ' HUNG')"
}

# oks NAME WANT: the allreduce step printed ok WANT times.
oks() {
  local got
  got=$(grep -cE '(^|\] )ok max_abs_error' "$OUT/logs/$1.log")
  note "$({ [ "$rc" -eq 0 ] && [ "$got" -ge "$2" ]; } && echo PASS || echo FAIL)" "$1" "$secs" "rc=$rc ok=$got/$2"
}

section_launchers() {
  need allreduce || return
  local n
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [ "$n" -ge 1 ] || { note FAIL launchers 0 "no GPU listed by nvidia-smi -L"; return; }
  local ar=("$BIN/allreduce" -backend cuda -count 1048579 -iters 2)
  step torchrun 120 python3 -m torch.distributed.run --nproc-per-node "$n" --no-python "${ar[@]}"
  oks torchrun "$n"
  if command -v mpirun >/dev/null; then
    step mpirun 120 mpirun --allow-run-as-root -np "$n" -x NCCL_NVLS_ENABLE=0 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29611 "${ar[@]}"
    oks mpirun "$n"
  else
    note SKIP mpirun 0 "Open MPI is not installed"
  fi
}

section_hook() {
  need fairrun || return
  [ -f "$HOOK_LIB" ] || { note FAIL hook 0 "missing $HOOK_LIB: run make gpu-bin on the build machine"; return; }
  local lib py
  lib=$(cd "$(dirname "$HOOK_LIB")" && pwd)/$(basename "$HOOK_LIB")
  py=$(cd "$HOOK_PYTHON" && pwd)
  local l m d n launch run hook envs verdict
  for l in "$@"; do
    m=${l%x*} d=${l#*x} n=$((m * d))
    if [ "$m" -eq 1 ]; then
      launch=(python3 -m torch.distributed.run --nproc-per-node "$n")
    else
      # shellcheck disable=SC2207
      launch=("$BIN/fairrun" $(fairrun_flags "$m" "$d") --nproc-per-node "$n" -- python3)
    fi
    step "smoke-$l" 180 env FAIRGO_LIB="$lib" PYTHONPATH="$py" "${launch[@]}" python/tests/gpu_smoke.py
    local ok
    ok=$(grep -c 'gpu_smoke: ok' "$OUT/logs/smoke-$l.log")
    note "$({ [ "$rc" -eq 0 ] && [ "$ok" -eq "$n" ]; } && echo PASS || echo FAIL)" "smoke-$l" "$secs" "rc=$rc ok=$ok/$n"
    # DDP's own allreduce as NCCL chooses, fairgo's hook, and DDP's allreduce
    # with NCCL's Ring and Tree: two more correct runs whose spread is the
    # envelope fairgo's drift is judged against.
    if [ "$HOOK_PAIRED" = 1 ]; then
      # One launch: the four runs' models in turns of HOOK_BLOCK steps,
      # the order rotated each round (train_resnet.py --pair).
      step "resnet-$l-paired" 450 env FAIRGO_LIB="$lib" PYTHONPATH="$py" "${launch[@]}" \
        examples/ddp_torch/train_resnet.py --pair "$HOOK_PAIR" --block-steps "$HOOK_BLOCK" \
        --steps "$HOOK_STEPS" --batch-size 32 --losses-out "$OUT/resnet-$l-{run}.json"
      note "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" "resnet-$l-paired" "$secs" \
        "rc=$rc $(grep -m1 -oE 'fairgo / best of DDP.*' "$OUT/logs/resnet-$l-paired.log")"
    else
      for run in default fairgo ring tree; do
        hook_run "$l" "$run" ""
      done
    fi
    step "resnet-$l-compare" 30 python3 examples/ddp_torch/compare_losses.py "$OUT/resnet-$l-default.json" "$OUT/resnet-$l-fairgo.json" \
      --envelope "$OUT/resnet-$l-ring.json" "$OUT/resnet-$l-tree.json"
    verdict=$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)
    note "$verdict" "resnet-$l" "$secs" "$(grep -E 'worst step|step-0 gradients|images/s|^(agree|DIFFER)$' "$OUT/logs/resnet-$l-compare.log" | sed -E 's/ \([^)]*\.json\)//' | paste -sd';' -);$(grep -m1 -oE 'fairgo routes: .*' "$OUT/logs/resnet-$l-fairgo.log")"
    # Rounds 2..HOOK_ROUNDS: fairgo's hook beside DDP's default and round
    # 1's fastest DDP setting, in turn (fairgo first in even rounds), so
    # that S7 takes the median of per-round ratios rather than one pair.
    local k best runs
    best=$(python3 -c 'import json, sys
r = {m: json.load(open(f"{sys.argv[1]}-{m}.json"))["images_per_s"] for m in ("default", "ring", "tree")}
print(max(r, key=r.get))' "$OUT/resnet-$l" 2>/dev/null || echo default)
    for ((k = 2; k <= HOOK_ROUNDS && HOOK_PAIRED != 1; k++)); do
      runs="default $([ "$best" != default ] && echo "$best")"
      if [ $((k % 2)) -eq 0 ]; then runs="fairgo $runs"; else runs="$runs fairgo"; fi
      for run in $runs; do
        hook_run "$l" "$run" ".r$k"
        note "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" "resnet-$l-$run.r$k" "$secs" \
          "rc=$rc $(grep -m1 -oE 'images/s [0-9.]+' "$OUT/logs/resnet-$l-$run.r$k.log")"
      done
    done
    # fairgo's hook with its algorithm fixed (FAIRGO_ALGORITHM), for where
    # its speed comes from: images/s only.
    for run in $HOOK_ALGORITHMS; do
      step "resnet-$l-fairgo-$run" 300 env FAIRGO_LIB="$lib" PYTHONPATH="$py" FAIRGO_ALGORITHM="$run" \
        "${launch[@]}" examples/ddp_torch/train_resnet.py --hook fairgo --steps "$HOOK_STEPS" --batch-size 32 \
        --losses-out "$OUT/resnet-$l-fairgo-$run.json"
      note "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" "resnet-$l-fairgo-$run" "$secs" \
        "rc=$rc FAIRGO_ALGORITHM=$run: $(grep -m1 -oE 'images/s [0-9.]+' "$OUT/logs/resnet-$l-fairgo-$run.log"); $(grep -m1 -oE 'fairgo routes: .*' "$OUT/logs/resnet-$l-fairgo-$run.log")"
    done
  done
}

# hook_run LAYOUT RUN SUFFIX: one ResNet-18 run of section_hook (its lib,
# py and launch): RUN is default, ring or tree (DDP's allreduce, NCCL_ALGO
# set for the allreduce only: NCCL has no Tree all-gather, which DDP's
# setup calls) or fairgo (the hook); its file resnet-LAYOUT-RUN SUFFIX.json.
hook_run() {
  local l=$1 run=$2 suffix=$3 hook=default
  local envs=(FAIRGO_LIB="$lib" PYTHONPATH="$py")
  case $run in fairgo) hook=fairgo ;; ring) envs+=(NCCL_ALGO=allreduce:ring) ;; tree) envs+=(NCCL_ALGO=allreduce:tree) ;; esac
  step "resnet-$l-$run$suffix" 300 env "${envs[@]}" "${launch[@]}" \
    examples/ddp_torch/train_resnet.py --hook "$hook" --steps "$HOOK_STEPS" --batch-size 32 --losses-out "$OUT/resnet-$l-$run$suffix.json"
}

section_analyse() {
  need fairbench || return
  local files
  files=$(ls "$OUT"/json/*.jsonl 2>/dev/null | paste -sd, -)
  if [ -z "$files" ]; then
    note FAIL analyse 0 "no records under $OUT/json"
    return
  fi
  local enq=() e=$ENQUEUE
  [ -z "$e" ] && [ -s "$OUT/enqueue.txt" ] && e=$OUT/enqueue.txt
  [ -n "$e" ] && enq=(-enqueue "$e" -enqueue-bench "$ENQUEUE_BENCH")
  # S7: the hook section's training runs.
  ls "$OUT"/resnet-*.json >/dev/null 2>&1 && enq+=(-hook "$OUT/resnet-*.json")
  # shellcheck disable=SC2086
  step targets 60 "$BIN/fairbench" targets -in "$files" -set "$TARGET_SETS" -out "$OUT/targets.json" "${enq[@]}" $MODEL_LINKS
  tail -n +2 "$OUT/logs/targets.log" >"$OUT/targets.txt"
  local passed all
  passed=$(grep -cE '^[STU][0-9] .* yes ' "$OUT/targets.txt")
  all=$(grep -cE '^[STU][0-9] ' "$OUT/targets.txt")
  note "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" targets "$secs" "rc=$rc targets met: $passed of $all (targets.json)"
  local first
  first=$(ls "$OUT"/json/"${RUNS%% *}"-*.jsonl 2>/dev/null | paste -sd, -)
  # shellcheck disable=SC2086
  step model 60 "$BIN/fairbench" model -in "${first:-$files}" -nic-gbit "$NIC_GBIT" $MODEL_LINKS
  tail -n +2 "$OUT/logs/model.log" >"$OUT/model.txt"
  note "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" model "$secs" "rc=$rc $(grep -m1 'testbed points: worst' "$OUT/model.txt" | sed 's/^# //')$([ "$rc" -ne 0 ] && tail -1 "$OUT/model.txt")"
  step digest 60 "$BIN/fairbench" report -in "$files" -csv "$OUT/results.csv"
  tail -n +2 "$OUT/logs/digest.log" >"$OUT/digest.txt"
  note "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" digest "$secs" "rc=$rc digest.txt, results.csv"
  nodes_report
}

section_targets() {
  local first=1 run single=$RUN
  for run in $RUNS; do
    RUN=$run
    if [ "$first" -eq 1 ]; then CHECK=(-check -w 0); else CHECK=(-w 1); fi
    first=0
    section_bench_1x2
    section_bench_2x1
    section_testbed 2x1 2x2 4x2
    section_overlap
  done
  RUN=$single
  CHECK=(-check -w 0)
  section_analyse
}

[ $# -eq 0 ] && { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
machine
start=$SECONDS
while [ $# -gt 0 ]; do
  s=$1
  shift
  case $s in
  tests | tests-launched)
    layouts=()
    while [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+x[0-9]+$ ]]; do
      layouts+=("$1")
      shift
    done
    if [ "$s" = tests ]; then
      section_tests "${layouts[@]}"
    else
      [ ${#layouts[@]} -gt 0 ] || layouts=(2x1 4x1 2x2 4x2)
      section_tests_launched "${layouts[@]}"
    fi
    ;;
  tests-local) section_tests_local ;;
  soak)
    l=4x2
    if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+x[0-9]+$ ]]; then
      l=$1
      shift
    fi
    section_soak "$l"
    ;;
  test)
    [ $# -ge 2 ] || { echo "usage: scripts/gpu.sh test NAME REGEX" >&2; exit 2; }
    gotest "$1" "$1.test" 300 "$2"
    shift 2
    ;;
  fairrun) section_fairrun ;;
  ddp) section_ddp ;;
  bench-1x2) section_bench_1x2 ;;
  bench-2x1) section_bench_2x1 ;;
  testbed)
    layouts=()
    while [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+x[0-9]+$ ]]; do
      layouts+=("$1")
      shift
    done
    [ ${#layouts[@]} -gt 0 ] || layouts=(2x1 2x2 4x2)
    section_testbed "${layouts[@]}"
    ;;
  overlap) section_overlap ;;
  nodes) section_nodes ;;
  links) section_links ;;
  enqueue) section_enqueue ;;
  enqueue-job) section_enqueue_job ;;
  launchers) section_launchers ;;
  onegpu)
    parts=()
    while [ $# -gt 0 ] && [[ $1 =~ ^(shared|single|overlap|enqueue|s4)$ ]]; do
      parts+=("$1")
      shift
    done
    [ ${#parts[@]} -gt 0 ] || parts=(shared single overlap enqueue)
    section_onegpu "${parts[@]}"
    ;;
  fault | hook)
    layouts=()
    while [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+x[0-9]+$ ]]; do
      layouts+=("$1")
      shift
    done
    [ ${#layouts[@]} -gt 0 ] || { echo "usage: scripts/gpu.sh $s MxD ..." >&2; exit 2; }
    "section_$s" "${layouts[@]}"
    ;;
  targets) section_targets ;;
  analyse) section_analyse ;;
  ab)
    section_ab "$@"
    shift $#
    ;;
  *)
    echo "scripts/gpu.sh: unknown section $s (run it without arguments for the list)" >&2
    exit 2
    ;;
  esac
done

# The logs in one file as well: the device tool brings back a few files of
# a run, and a run writes a log per step.
tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null
if [ -n "$packer" ]; then
  kill "$packer" 2>/dev/null
  wait "$packer" 2>/dev/null
  pack_results
fi

echo
echo "== fairgo GPU run, $(date -u +%H:%M:%S) UTC, $((SECONDS - start)) s, NIC ${NIC_GBIT} Gbit/s, loopback ${NVLINK_GBIT:-not shaped}${NVLINK_GBIT:+ Gbit/s}, MPS $MPS, logs and records in $OUT"
[ -f "$OUT/targets.txt" ] && grep -v '^#' "$OUT/targets.txt"
printf '%s\n' "${table[@]}"
[ "$status" -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit "$status"
