#!/usr/bin/env python3
"""Measures the host time of gradient-bucket reductions as DDP makes them:
fairgo's comm hook (fairgo_torch.allreduce_hook) against DDP's own
allreduce (torch.distributed.all_reduce(async_op=True).get_future()), over
a backward pass of --buckets buckets (the last one makes the current stream
wait for all), and the parts of the hook: the library's asynchronous call
(Comm.allreduce_async), the stream wait, the CUDA future.

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
    p.add_argument("--buckets", type=int, default=4, help="buckets of one backward pass")
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
        def __init__(self, last):
            self.last = last

        def buffer(self):
            return buf

        def is_last(self):
            return self.last

    cur = torch.cuda.current_stream(dev)
    earlier, last = Bucket(False), Bucket(True)
    n = args.buckets

    def fairgo_pass():
        for _ in range(n - 1):
            fairgo_torch.allreduce_hook(comm, earlier)
        fairgo_torch.allreduce_hook(comm, last)

    def ddp_pass():
        for _ in range(n):
            dist.all_reduce(buf, async_op=True).get_future()

    def future():
        f = torch.futures.Future(devices=[dev])
        f.set_result(buf)

    count, dtype = buf.numel(), fairgo_torch.fairgo_dtype(buf.dtype)
    # name: (what one timed call does, the buckets it reduces)
    parts = {
        "fairgo hook": (fairgo_pass, n),
        "DDP allreduce": (ddp_pass, n),
        "allreduce_async": (lambda: comm.allreduce_async(buf.data_ptr(), count, dtype, "avg", cur.cuda_stream).free(), 1),
        "stream_wait": (lambda: work.stream_wait(cur.cuda_stream), 1),
        "CUDA future": (future, 1),
    }
    work = comm.allreduce_async(buf.data_ptr(), count, dtype, "avg", cur.cuda_stream)
    rows = []
    for name, (fn, per) in parts.items():
        xs = []
        for i in range(args.warmup + args.calls):
            torch.cuda.synchronize()
            if i % 50 == 0:
                dist.barrier(device_ids=[dev.index])
            start = time.perf_counter()
            fn()
            if i >= args.warmup:
                xs.append(1e6 * (time.perf_counter() - start) / per)
        torch.cuda.synchronize()
        q = statistics.quantiles(xs, n=10)
        rows.append((name, statistics.median(xs), q[0], q[-1]))
    work.wait(60)
    work.free()
    comm.synchronize(60)
    if rank == 0:
        print(f"host time per bucket, {args.bytes} bytes, {n} buckets a pass, {dist.get_world_size()} ranks, "
              f"FAIRGO_ALGORITHM={os.environ.get('FAIRGO_ALGORITHM', 'auto')} (µs)")
        print(f"{'part':18s} {'median':>8s} {'p10':>8s} {'p90':>8s}")
        for name, med, p10, p90 in rows:
            print(f"{name:18s} {med:8.1f} {p10:8.1f} {p90:8.1f}")
    dist.barrier(device_ids=[dev.index])
    fairgo_torch.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
