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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # fairgo_torch in this repository


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hook", choices=["fairgo", "default"], default="fairgo", help="gradient allreduce: fairgo's comm hook or DDP's own (NCCL)")
    p.add_argument("--steps", type=int, default=50, help="training steps")
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
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

    import fairgo_torch

    if args.hook == "fairgo":
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

    torch.manual_seed(args.seed)
    model = torchvision.models.resnet18(num_classes=args.classes).to(dev)
    ddp = DDP(model, device_ids=[device], bucket_cap_mb=args.bucket_cap_mb)
    comm = None
    bucket_bytes = set()  # the sizes of the buckets fairgo's hook reduced
    if args.hook == "fairgo":
        comm = fairgo_torch.init(op_timeout=args.op_timeout or None)

        def hook(state, bucket):
            buf = bucket.buffer()
            bucket_bytes.add(buf.numel() * buf.element_size())
            return fairgo_torch.allreduce_hook(state, bucket)

        ddp.register_comm_hook(comm, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=1e-4)
    gen = torch.Generator(device=dev)

    def batch(step):
        gen.manual_seed(args.seed * 1_000_003 + rank * 10_007 + step)
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=gen, device=dev)
        y = torch.randint(0, args.classes, (args.batch_size,), generator=gen, device=dev)
        return x, y

    params = [p for p in model.parameters() if p.requires_grad]

    def grad_sample():
        """args.grad_check gradient elements, evenly spaced over all the
        parameters' gradients in order, as float64."""
        flat = torch.cat([p.grad.detach().reshape(-1) for p in params])
        idx = torch.linspace(0, flat.numel() - 1, steps=min(args.grad_check, flat.numel()), dtype=torch.float64, device=dev)
        return flat[idx.round().long()].double()

    grad_check = None
    if args.grad_check > 0:
        # This rank's own gradient of step 0: under no_sync DDP reduces
        # nothing. The gradients are then dropped and BatchNorm's running
        # statistics put back, so the training below starts from the same
        # state in every run.
        x, y = batch(0)
        saved = [b.detach().clone() for b in model.buffers()]
        model.zero_grad(set_to_none=True)
        with ddp.no_sync():
            F.cross_entropy(ddp(x), y).backward()
        local = grad_sample()
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for b, v in zip(model.buffers(), saved):
                b.copy_(v)
        exact, magnitude = local.clone(), local.abs()
        dist.all_reduce(exact)  # float64 sums over the ranks
        dist.all_reduce(magnitude)
        grad_check = {"world_size": world, "samples": local.numel(),
                      "exact": (exact / world).tolist(), "abs_mean": (magnitude / world).tolist()}

    if rank == 0:
        print(f"resnet18 DDP: {world} ranks, hook {args.hook}, batch {args.batch_size}/rank, {args.image_size}px, "
              f"{args.steps} steps, torch {torch.__version__}" + (f", {comm}" if comm else ""), flush=True)

    def train_step(step):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        if step == 0 and grad_check is not None:
            grad_check["values"] = grad_sample().tolist()  # averaged by the hook under test
        opt.step()
        return loss.item()  # waits for the step's device work

    losses, step_ms = [], []
    t0 = None
    for step in range(args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        began = time.perf_counter()
        losses.append(train_step(step))
        step_ms.append(1000 * (time.perf_counter() - began))
        if rank == 0:
            print(f"step {step:3d} loss {losses[-1]:.6f}", flush=True)
    torch.cuda.synchronize()
    timed = args.steps - args.warmup
    seconds = time.perf_counter() - t0 if t0 is not None else float("nan")
    images_per_s = timed * args.batch_size * world / seconds if timed > 0 else float("nan")
    if args.trace and args.trace_steps > 0:
        # Extra steps, outside the timing and the losses; every rank runs
        # them (DDP reduces their gradients), rank 0 records them.
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if rank == 0 else None
        with prof if prof is not None else contextlib.nullcontext():
            for step in range(args.steps, args.steps + args.trace_steps):
                with torch.profiler.record_function(f"train step {step}"):
                    train_step(step)
            torch.cuda.synchronize()
        if prof is not None:
            prof.export_chrome_trace(str(args.trace))
            print(f"wrote {args.trace}", flush=True)
    if comm is not None:
        comm.synchronize(60)  # raises if any of fairgo's work failed
    by_rank = [None] * world
    dist.all_gather_object(by_rank, losses)
    # The algorithm fairgo took for each bucket size (the same on every rank).
    routes = None
    if comm is not None and hasattr(comm, "algorithm_for"):  # a fairgo_torch older than C ABI 3 has none
        routes = {n: comm.algorithm_for(n)[0] for n in sorted(bucket_bytes)}
    if rank == 0:
        if routes:
            print("fairgo routes: " + ", ".join(f"{n} bytes {a}" for n, a in routes.items()), flush=True)
        print(f"images/s {images_per_s:.1f} ({timed} steps after {args.warmup} warm-up, "
              f"{1000 * seconds / max(timed, 1):.1f} ms/step, {world} ranks)", flush=True)
        if args.losses_out:
            out = {
                "hook": args.hook, "world_size": world, "steps": args.steps, "warmup": args.warmup,
                "batch_size": args.batch_size, "image_size": args.image_size, "seed": args.seed,
                "deterministic": args.deterministic, "torch": torch.__version__,
                "nccl_algo": os.environ.get("NCCL_ALGO"), "nccl_proto": os.environ.get("NCCL_PROTO"),
                "fairgo_algorithm": os.environ.get("FAIRGO_ALGORITHM"),
                "layout": str(comm) if comm else None,
                "images_per_s": images_per_s, "ms_per_step": 1000 * seconds / max(timed, 1),
                "routes": routes,
                "losses": losses, "losses_by_rank": by_rank, "grad_check": grad_check,
                "step_ms": step_ms,
            }
            args.losses_out.write_text(json.dumps(out, indent=1) + "\n")
            print(f"wrote {args.losses_out}", flush=True)
    dist.barrier()
    if comm is not None:
        fairgo_torch.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
