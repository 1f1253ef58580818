#!/usr/bin/env python3
"""Measures the host time of one gradient-bucket reduction as DDP makes it:
fairgo's comm hook (fairgo_torch.allreduce_hook) against DDP's own
allreduce (torch.distributed.all_reduce(async_op=True).get_future()), and
the parts of the hook: the library call (Comm.allreduce_), the side
stream's wait on the current one, the CUDA future, record_stream.

Each figure is the median (and 10th and 90th percentiles) of --calls calls
of one part, each timed alone with the GPUs idle (torch.cuda.synchronize()
before it), so that it is the caller's host time, not the reduction's.
Rank 0 prints a table. Under torchrun (1 machine x 2 GPUs):

    export NCCL_NVLS_ENABLE=0 FAIRGO_LIB=$PWD/lib/libfairgo.so PYTHONPATH=$PWD/python
    torchrun --nproc-per-node 2 examples/ddp_torch/hook_cost.py --bytes 16M

FAIRGO_ALGORITHM fixes fairgo's route (default: auto).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # fairgo_torch in this repository


def size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s and s[-1].upper() in units else int(s)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=size, default=size("16M"), help="bucket size (float32; K, M, G suffixes)")
    p.add_argument("--calls", type=int, default=300, help="timed calls of each part")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls of each part first")
    args = p.parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

    import fairgo_torch

    fairgo_torch.load()  # before PyTorch (see train_resnet.py)
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    fairgo_torch.init_process_group("nccl", device_id=dev)
    comm = fairgo_torch.init()
    buf = torch.ones(args.bytes // 4, device=dev)

    class Bucket:  # what DDP hands a comm hook
        def buffer(self):
            return buf

    cur = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(device=dev)

    def future():
        f = torch.futures.Future(devices=[dev])
        with torch.cuda.stream(side):
            f.set_result(buf)

    parts = {
        "fairgo hook": lambda: fairgo_torch.allreduce_hook(comm, Bucket()),
        "DDP allreduce": lambda: dist.all_reduce(buf, async_op=True).get_future(),
        "Comm.allreduce_": lambda: comm.allreduce_(buf, op="avg", stream=side),
        "wait_stream": lambda: side.wait_stream(cur),
        "CUDA future": future,
        "record_stream": lambda: buf.record_stream(side),
    }
    rows = []
    for name, fn in parts.items():
        xs = []
        for i in range(args.warmup + args.calls):
            torch.cuda.synchronize()
            if i % 50 == 0:
                dist.barrier(device_ids=[dev.index])
            start = time.perf_counter()
            fn()
            if i >= args.warmup:
                xs.append(1e6 * (time.perf_counter() - start))
        torch.cuda.synchronize()
        q = statistics.quantiles(xs, n=10)
        rows.append((name, statistics.median(xs), q[0], q[-1]))
    comm.synchronize(60)
    if rank == 0:
        print(f"host time of one call, {args.bytes} bytes, {dist.get_world_size()} ranks, "
              f"FAIRGO_ALGORITHM={os.environ.get('FAIRGO_ALGORITHM', 'auto')} (µs)")
        print(f"{'part':18s} {'median':>8s} {'p10':>8s} {'p90':>8s}")
        for name, med, p10, p90 in rows:
            print(f"{name:18s} {med:8.1f} {p10:8.1f} {p90:8.1f}")
    dist.barrier(device_ids=[dev.index])
    fairgo_torch.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
