#!/usr/bin/env python3
"""Trains torchvision's ResNet-18 with PyTorch DDP on synthetic images, with
DDP's own allreduce (--hook default) or fairgo's (--hook fairgo), and
reports the per-step losses and images/s.

Under torchrun (1 machine x 2 GPUs):

    export NCCL_NVLS_ENABLE=0 FAIRGO_LIB=$PWD/lib/libfairgo.so PYTHONPATH=$PWD/python
    torchrun --nproc-per-node 2 examples/ddp_torch/train_resnet.py --hook default --losses-out /tmp/default.json
    torchrun --nproc-per-node 2 examples/ddp_torch/train_resnet.py --hook fairgo --losses-out /tmp/fairgo.json
    NCCL_ALGO=allreduce:ring torchrun --nproc-per-node 2 examples/ddp_torch/train_resnet.py --hook default --losses-out /tmp/ring.json
    NCCL_ALGO=allreduce:tree torchrun --nproc-per-node 2 examples/ddp_torch/train_resnet.py --hook default --losses-out /tmp/tree.json
    python3 examples/ddp_torch/compare_losses.py /tmp/default.json /tmp/fairgo.json --envelope /tmp/ring.json /tmp/tree.json

Paired, in one launch: one model per run (fairgo's hook, DDP's allreduce
as NCCL chooses, with NCCL's ring, with its tree, each DDP on a process
group whose NCCL communicator was made with that NCCL_ALGO), the same
seeds, trained in turns of --block-steps steps, the order rotated every
round, so that the host's drift weighs on every run alike; one file per
run, {run} in --losses-out standing for its name:

    torchrun --nproc-per-node 2 examples/ddp_torch/train_resnet.py --pair fairgo,default,ring,tree \
        --steps 305 --losses-out '/tmp/{run}.json'

Under fairrun (2 emulated machines x 2 ranks sharing 2 GPUs):

    bin/fairrun --nproc-per-node 4 --emulate-machines 2 -- python3 examples/ddp_torch/train_resnet.py --hook fairgo

The data are random images and labels drawn from a generator seeded by
(--seed, rank, step), and the model is initialised from --seed, so two runs
with the same seeds and layout see the same numbers; cuDNN runs its
deterministic algorithms (--no-deterministic trades that for speed). Only
the allreduce differs between the hooks, so the losses agree up to the
rounding of a different summation order, which training amplifies step after
step: compare_losses.py judges fairgo's drift against the drift between
runs of DDP's own allreduce with different NCCL algorithms. --grad-check
records a sample of the first step's averaged gradient with its exact
(float64) average and the ranks' mean magnitude, for the float32 bound.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # fairgo_torch in this repository


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hook", choices=["fairgo", "default", "pyhook"], default="fairgo",
                   help="gradient allreduce: fairgo's comm hook, DDP's own (NCCL), or DDP's through PyTorch's Python comm hook")
    p.add_argument("--pair", metavar="RUNS",
                   help="train one model per run of RUNS (comma-separated: fairgo, default, ring, tree) in one "
                        "launch, in turns of --block-steps steps; --losses-out names each run's file with {run}")
    p.add_argument("--block-steps", type=int, default=25, help="--pair: the steps of one run's turn")
    p.add_argument("--steps", type=int, default=50, help="training steps (of each run, with --pair)")
    p.add_argument("--warmup", type=int, default=5, help="steps not counted in images/s")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    p.add_argument("--image-size", type=int, default=224, help="height and width of the synthetic images")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket size")
    p.add_argument("--op-timeout", type=float, default=600.0, help="fairgo's watchdog in seconds (0: off)")
    p.add_argument("--no-deterministic", dest="deterministic", action="store_false", help="let cuDNN pick its fastest (nondeterministic) algorithms")
    p.add_argument("--losses-out", type=Path, help="write the per-step losses and throughput as JSON (rank 0)")
    p.add_argument("--grad-check", type=int, default=4096, metavar="N",
                   help="record N elements of step 0's averaged gradient and their exact average (0: off)")
    p.add_argument("--trace", type=Path, metavar="FILE",
                   help="after the timed steps, run --trace-steps more under torch.profiler and write rank 0's "
                        "Chrome trace (CPU and CUDA) to FILE")
    p.add_argument("--trace-steps", type=int, default=3, help="steps the --trace covers")
    args = p.parse_args(argv)
    args.runs = [args.hook]
    if args.pair is not None:
        args.runs = parse_runs(args.pair)
        if args.block_steps < 1:
            p.error("--block-steps must be at least 1")
        if args.losses_out is not None and "{run}" not in str(args.losses_out):
            p.error("--pair: --losses-out must name each run's file with {run}")
        if args.trace is not None:
            p.error("--pair takes no --trace")
    return args


# The runs of --pair: fairgo's hook, and DDP's allreduce with NCCL's own
# choice or with NCCL_ALGO set for its communicator (allreduce only: NCCL
# has no Tree all-gather, which DDP's setup calls); pyhook is DDP's
# allreduce through PyTorch's own comm hook in Python (default_hooks.
# allreduce_hook), what any hook written in Python pays: shown beside the
# others, but not one of DDP's settings fairgo is compared with.
RUNS = {"fairgo": None, "default": None, "ring": "allreduce:ring", "tree": "allreduce:tree", "pyhook": None}
BASELINES = ("default", "ring", "tree")


def bucket_sizes(ddp):
    """The byte sizes of a DDP model's gradient buckets as its reducer holds
    them now, smallest first (none where this PyTorch cannot say)."""
    try:
        buckets = ddp.reducer._get_zeros_like_grad_buckets()
    except (AttributeError, RuntimeError):
        return []
    return sorted({b.buffer().numel() * b.buffer().element_size() for b in buckets})


def parse_runs(spec):
    """The runs of --pair, in order: known names, none twice, at least two."""
    runs = [r.strip() for r in spec.split(",") if r.strip()]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        raise SystemExit(f"--pair: unknown run {', '.join(unknown)} (known: {', '.join(RUNS)})")
    if len(set(runs)) != len(runs) or len(runs) < 2:
        raise SystemExit(f"--pair {spec!r}: at least two runs, each once")
    return runs


def schedule(runs, steps, warmup, block):
    """The turns of a paired launch: first every run's warm-up steps, in
    order (timed as round 0, not counted), then rounds of one turn of
    `block` steps per run, the order rotated by one each round; steps that
    do not fill a last round are left out. Each turn is (round, run,
    first step, end step)."""
    turns = [(0, r, 0, warmup) for r in runs if warmup > 0]
    rounds = max(steps - warmup, 0) // block
    for k in range(rounds):
        first = warmup + k * block
        for i in range(len(runs)):
            turns.append((k + 1, runs[(i + k) % len(runs)], first, first + block))
    return turns


def paired_ratios(per_round):
    """fairgo's rounds against DDP's best setting (of BASELINES, the highest
    median images/s over the rounds; ties: the higher mean): (the setting,
    fairgo / it per round, fairgo / each round's fastest setting). The
    first is what a user who keeps one setting gets; the second divides by
    the best of several noisy samples a round, which no user can pick."""
    base = [r for r in BASELINES if per_round.get(r)]
    best = max(base, key=lambda r: (statistics.median(per_round[r]), statistics.fmean(per_round[r])))
    fairgo = per_round["fairgo"]
    ratios = [f / per_round[best][i] for i, f in enumerate(fairgo)]
    oracle = [f / max(per_round[r][i] for r in base) for i, f in enumerate(fairgo)]
    return best, ratios, oracle


def round_rates(turns, seconds, images_per_step):
    """Images/s per run and round (rounds from 1) from each turn's seconds,
    and per run over all its timed turns."""
    per_round, total = {}, {}
    for (k, run, first, end), sec in zip(turns, seconds):
        if k == 0 or end <= first:
            continue
        per_round.setdefault(run, []).append((end - first) * images_per_step / sec)
        steps, secs = total.get(run, (0, 0.0))
        total[run] = (steps + end - first, secs + sec)
    return per_round, {run: steps * images_per_step / secs for run, (steps, secs) in total.items()}


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

    import fairgo_torch

    if "fairgo" in args.runs:
        # Before PyTorch: a Go shared library needs a little static TLS,
        # which libraries loaded before it can use up.
        fairgo_torch.load()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = 0 if torch.cuda.device_count() == 1 else local  # fairrun --emulate-machines pins one GPU
    torch.cuda.set_device(device)
    dev = torch.device("cuda", device)
    torch.backends.cudnn.benchmark = not args.deterministic
    torch.backends.cudnn.deterministic = args.deterministic
    torch.use_deterministic_algorithms(args.deterministic, warn_only=True)

    # torch.distributed's own process group (DDP's parameter broadcast,
    # buffer sync, and the default hook's allreduce); under fairrun its store
    # moves off fairgo's port.
    fairgo_torch.init_process_group("nccl", device_id=dev)

    def algo_group(algo):
        """A process group whose NCCL communicator is made, by its first
        collective, under NCCL_ALGO=algo; the variable is put back after."""
        before = os.environ.get("NCCL_ALGO")
        os.environ["NCCL_ALGO"] = algo
        try:
            group = dist.new_group(backend="nccl")
            dist.all_reduce(torch.zeros(1, device=dev), group=group)
            torch.cuda.synchronize()
        finally:
            if before is None:
                del os.environ["NCCL_ALGO"]
            else:
                os.environ["NCCL_ALGO"] = before
        return group

    comm = fairgo_ddp = hook_impl = None
    models, ddps, opts = {}, {}, {}
    for run in args.runs:
        torch.manual_seed(args.seed)
        model = torchvision.models.resnet18(num_classes=args.classes).to(dev)
        group = algo_group(RUNS[run]) if args.pair is not None and RUNS[run] else None
        ddp = DDP(model, device_ids=[device], bucket_cap_mb=args.bucket_cap_mb, process_group=group)
        if run == "fairgo":
            comm = fairgo_torch.init(op_timeout=args.op_timeout or None)
            fairgo_ddp = ddp
            if args.trace is None:
                hook_impl = fairgo_torch.register_hook(ddp, comm)  # as a trainer would; FAIRGO_TORCH_HOOK picks
            else:
                def hook(state, bucket):
                    with torch.profiler.record_function("fairgo allreduce_hook"):  # named in the trace
                        return fairgo_torch.allreduce_hook(state, bucket)

                ddp.register_comm_hook(comm, hook)
        elif run == "pyhook":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        models[run], ddps[run] = model, ddp
        opts[run] = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=1e-4)
    gen = torch.Generator(device=dev)

    def batch(step):
        gen.manual_seed(args.seed * 1_000_003 + rank * 10_007 + step)
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=gen, device=dev)
        y = torch.randint(0, args.classes, (args.batch_size,), generator=gen, device=dev)
        return x, y

    def grad_sample(run):
        """args.grad_check gradient elements of run's model, evenly spaced
        over all the parameters' gradients in order, as float64."""
        flat = torch.cat([p.grad.detach().reshape(-1) for p in models[run].parameters() if p.requires_grad])
        idx = torch.linspace(0, flat.numel() - 1, steps=min(args.grad_check, flat.numel()), dtype=torch.float64, device=dev)
        return flat[idx.round().long()].double()

    grad_check = None
    if args.grad_check > 0:
        # This rank's own gradient of step 0: under no_sync DDP reduces
        # nothing. The gradients are then dropped and BatchNorm's running
        # statistics put back, so the training below starts from the same
        # state in every run (every model starts from the same seed).
        run = args.runs[0]
        model, ddp = models[run], ddps[run]
        x, y = batch(0)
        saved = [b.detach().clone() for b in model.buffers()]
        model.zero_grad(set_to_none=True)
        with ddp.no_sync():
            F.cross_entropy(ddp(x), y).backward()
        local = grad_sample(run)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for b, v in zip(model.buffers(), saved):
                b.copy_(v)
        exact, magnitude = local.clone(), local.abs()
        dist.all_reduce(exact)  # float64 sums over the ranks
        dist.all_reduce(magnitude)
        grad_check = {"world_size": world, "samples": local.numel(),
                      "exact": (exact / world).tolist(), "abs_mean": (magnitude / world).tolist()}
    grad_checks = {run: dict(grad_check) for run in args.runs} if grad_check else {}

    if rank == 0:
        print(f"resnet18 DDP: {world} ranks, {'runs ' + ', '.join(args.runs) if args.pair else 'hook ' + args.hook}, "
              f"batch {args.batch_size}/rank, {args.image_size}px, {args.steps} steps, torch {torch.__version__}"
              + (f", {comm}, its hook in {hook_impl or 'python'}" if comm else ""), flush=True)

    def train_step(run, step):
        ddp, opt = ddps[run], opts[run]
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        if step == 0 and run in grad_checks:
            grad_checks[run]["values"] = grad_sample(run).tolist()  # averaged by the hook under test
        opt.step()
        return loss.item()  # waits for the step's device work

    losses = {run: [] for run in args.runs}
    step_ms = {run: [] for run in args.runs}
    images_per_step = args.batch_size * world
    if args.pair is None:
        turns = [(0, args.hook, 0, min(args.warmup, args.steps)), (1, args.hook, min(args.warmup, args.steps), args.steps)]
    else:
        turns = schedule(args.runs, args.steps, args.warmup, args.block_steps)
    seconds = []
    for k, run, first, end in turns:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for step in range(first, end):
            began = time.perf_counter()
            losses[run].append(train_step(run, step))
            step_ms[run].append(1000 * (time.perf_counter() - began))
            if rank == 0 and args.pair is None:
                print(f"step {step:3d} loss {losses[run][-1]:.6f}", flush=True)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    per_round, rates = round_rates(turns, seconds, images_per_step)
    timed = {run: len(losses[run]) - min(args.warmup, len(losses[run])) for run in args.runs}
    if args.trace and args.trace_steps > 0:
        # Extra steps, outside the timing and the losses; every rank runs
        # them (DDP reduces their gradients), rank 0 records them.
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if rank == 0 else None
        with prof if prof is not None else contextlib.nullcontext():
            for step in range(args.steps, args.steps + args.trace_steps):
                with torch.profiler.record_function(f"train step {step}"):
                    train_step(args.hook, step)
            torch.cuda.synchronize()
        if prof is not None:
            prof.export_chrome_trace(str(args.trace))
            print(f"wrote {args.trace}", flush=True)
    if comm is not None:
        comm.synchronize(60)  # raises if any of fairgo's work failed
    by_rank = {}
    for run in args.runs:
        by_rank[run] = [None] * world
        dist.all_gather_object(by_rank[run], losses[run])
    # The algorithm fairgo took for each bucket size (the same on every rank).
    routes = None
    if comm is not None and hasattr(comm, "algorithm_for"):  # a fairgo_torch older than C ABI 3 has none
        routes = {n: comm.algorithm_for(n)[0] for n in bucket_sizes(fairgo_ddp)}
    if rank == 0:
        if routes:
            print("fairgo routes: " + ", ".join(f"{n} bytes {a}" for n, a in routes.items()), flush=True)
        for run in args.runs:
            ips = rates.get(run, float("nan"))
            ms = 1000 * images_per_step / ips if ips == ips else float("nan")
            name = f"{run}: " if args.pair else ""
            print(f"{name}images/s {ips:.1f} ({timed[run]} steps after {args.warmup} warm-up, "
                  f"{ms:.1f} ms/step, {world} ranks)", flush=True)
        if args.pair and "fairgo" in args.runs and len(per_round.get("fairgo", [])) > 0 and set(BASELINES) & set(args.runs):
            best, ratios, oracle = paired_ratios(per_round)
            print(f"fairgo / best of DDP's ({best}, its best setting over the rounds), per round: median "
                  f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}, {len(ratios)} rounds of "
                  f"{args.block_steps} steps); against each round's fastest setting {statistics.median(oracle):.3f}", flush=True)
        if args.losses_out:
            for run in args.runs:
                hook = run if run in ("fairgo", "pyhook") else "default"
                nccl_algo = RUNS[run] if args.pair else os.environ.get("NCCL_ALGO")
                ips = rates.get(run, float("nan"))
                out = {
                    "hook": hook, "world_size": world, "steps": args.steps, "warmup": args.warmup,
                    "batch_size": args.batch_size, "image_size": args.image_size, "seed": args.seed,
                    "deterministic": args.deterministic, "torch": torch.__version__,
                    "nccl_algo": nccl_algo, "nccl_proto": os.environ.get("NCCL_PROTO"),
                    "fairgo_algorithm": os.environ.get("FAIRGO_ALGORITHM") if run == "fairgo" or not args.pair else None,
                    "layout": str(comm) if comm else None,
                    "images_per_s": ips, "ms_per_step": 1000 * images_per_step / ips if ips == ips else None,
                    "routes": routes if run == "fairgo" else None,
                    "hook_impl": (hook_impl or "python") if run == "fairgo" else None,
                    "losses": losses[run], "losses_by_rank": by_rank[run], "grad_check": grad_checks.get(run),
                    "step_ms": step_ms[run],
                }
                if args.pair:
                    out.update({"paired": args.runs, "block_steps": args.block_steps,
                                "round_images_per_s": per_round.get(run, [])})
                path = Path(str(args.losses_out).replace("{run}", run))
                path.write_text(json.dumps(out, indent=1) + "\n")
                print(f"wrote {path}", flush=True)
    dist.barrier()
    if comm is not None:
        fairgo_torch.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
