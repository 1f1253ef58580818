#!/usr/bin/env python3
"""GPU smoke test of fairgo_torch (needs PyTorch, CUDA GPUs and libfairgo.so).

    NCCL_NVLS_ENABLE=0 FAIRGO_LIB=$PWD/lib/libfairgo.so PYTHONPATH=$PWD/python \\
        torchrun --nproc-per-node 2 python/tests/gpu_smoke.py
    # or on emulated machines (fairgo's store from fairrun):
    bin/fairrun --nproc-per-node 4 --emulate-machines 2 -- python3 python/tests/gpu_smoke.py

Every rank checks: allreduce_ against a reference for several dtypes, ops
and sizes (and against torch.distributed's NCCL allreduce); that a call
returns while the GPU is still busy with earlier work on the stream and
that the stream's later work sees the result (ordering without host
blocking); the algorithm a reached size takes, alike on every rank; the DDP
hook's future, and that the hook leaves the current
stream free while a bucket waits for a late rank; both of register_hook's
hooks (Python and C++; SMOKE_HOOKS=python leaves out the C++ one, which
needs a compiler) inside DDP against the ranks' averaged gradients; the
error paths; close. Prints
"gpu_smoke: ok" per rank, or raises.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # python/ for fairgo_torch

import fairgo_torch  # noqa: E402

# Load libfairgo.so before PyTorch: a Go shared library needs a little static
# TLS, which libraries loaded before it can use up.
fairgo_torch.load()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))


def log(*a):
    print(f"[rank {RANK}]", *a, flush=True)


def inputs(rank, n, dtype, device, op):
    """Deterministic per-rank input (every rank can compute every rank's)."""
    g = torch.Generator(device="cpu").manual_seed(1000 + rank)
    if dtype.is_floating_point:
        lo, hi = (0.5, 1.5) if op == "prod" else (-4.0, 4.0)
        x = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
    else:
        hi = 2 if op == "prod" else (100 // max(WORLD, 1) if dtype == torch.uint8 else 1000)
        lo = 0 if dtype == torch.uint8 else (-hi if op != "prod" else 1)
        x = torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.int64)
    return x.to(dtype).to(device)


def reference(xs, op, dtype):
    acc = torch.stack([x.to(torch.float64 if dtype.is_floating_point else torch.int64) for x in xs])
    if op == "sum":
        r = acc.sum(0)
    elif op == "avg":
        r = acc.sum(0) / len(xs) if dtype.is_floating_point else torch.div(acc.sum(0), len(xs), rounding_mode="trunc")
    elif op == "max":
        r = acc.max(0).values
    elif op == "min":
        r = acc.min(0).values
    else:
        r = acc.prod(0)
    return r


def check_allreduce(comm, device):
    cases = [
        (torch.float32, "avg"), (torch.float32, "sum"), (torch.bfloat16, "avg"), (torch.float16, "sum"),
        (torch.float64, "prod"), (torch.int32, "max"), (torch.int64, "min"), (torch.uint8, "sum"), (torch.int32, "avg"),
    ]
    for n in [0, 1, 1000, 3_000_001]:
        for dtype, op in cases:
            t = inputs(RANK, n, dtype, device, op)
            comm.allreduce_(t, op=op)
            want = reference([inputs(r, n, dtype, "cpu", op) for r in range(WORLD)], op, dtype)
            got = t.cpu()  # on the current stream, which waits for the result
            if dtype.is_floating_point:
                tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
                ok = torch.allclose(got.to(torch.float64), want, rtol=tol, atol=tol)
            else:
                ok = torch.equal(got.to(torch.int64), want)
            if not ok:
                bad = (got.to(torch.float64) - want.to(torch.float64)).abs().argmax().item() if n else -1
                raise AssertionError(f"allreduce {dtype} {op} n={n}: element {bad}: got {got[bad].item()}, want {want[bad].item()}")
    comm.synchronize(60)
    log("allreduce: dtypes, ops and sizes match the reference")

    # The algorithm of a size a call has reached is settled, and every rank
    # names the same one (a package older than C ABI 3 cannot tell).
    if hasattr(comm, "algorithm_for"):
        nbytes = 3_000_001 * 4
        name, settled = comm.algorithm_for(nbytes)
        if name not in fairgo_torch._lib.ALGORITHMS or name == "auto" or not settled:
            raise AssertionError(f"algorithm_for({nbytes}) = {name!r}, settled {settled}")
        names = [None] * WORLD
        dist.all_gather_object(names, name)
        if len(set(names)) != 1:
            raise AssertionError(f"algorithm_for({nbytes}) differs between ranks: {names}")
        log(f"allreduce: {nbytes} bytes take {name} on every rank")

    # Against torch.distributed's own NCCL allreduce.
    x = torch.randn(1 << 20, device=device, generator=torch.Generator(device=device).manual_seed(RANK))
    y = x.clone()
    comm.allreduce_(x, op="sum")
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    log("allreduce: matches torch.distributed (NCCL)")


def check_ordering(comm, device):
    """The call returns while the stream is still busy (no host wait on the
    GPU), the reduction sees the stream's earlier work, and the stream's
    later work sees the result."""
    t = torch.zeros(1 << 22, device=device)
    torch.cuda.synchronize()
    # Calibrate _sleep: cycles for ~300 ms.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles = int(10_000_000 * 300 / max(start.elapsed_time(end), 1e-3))
    dist.barrier()
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)  # the GPU is busy ~300 ms
    t.fill_(RANK + 1)  # written by the stream after the sleep
    t0 = time.perf_counter()
    comm.allreduce_(t, op="sum")
    call_ms = (time.perf_counter() - t0) * 1000
    r = t.clone()  # after the result, on the same stream
    got = r[:8].cpu()
    want = WORLD * (WORLD + 1) / 2
    if not torch.all(got == want):
        raise AssertionError(f"ordering: got {got.tolist()}, want {want}")
    if call_ms > 150:
        raise AssertionError(f"allreduce_ took {call_ms:.1f} ms while the GPU slept 300 ms: it blocked the host")
    comm.synchronize(60)
    log(f"ordering: call returned in {call_ms:.2f} ms with the GPU busy; results ordered on the stream")


class FakeBucket:
    """A GradBucket as the hook reads it; last=None: one without is_last."""

    def __init__(self, t, last=None):
        self._t = t
        if last is not None:
            self.is_last = lambda: last

    def buffer(self):
        return self._t


def check_hook(comm, device):
    buf = torch.full((1 << 20,), float(RANK + 1), device=device)
    torch.cuda._sleep(50_000_000)
    t0 = time.perf_counter()
    fut = fairgo_torch.allreduce_hook(comm, FakeBucket(buf))
    hook_ms = (time.perf_counter() - t0) * 1000
    if not fut.done():
        raise AssertionError("the hook's future is not completed")
    want = (WORLD + 1) / 2  # the average of 1..WORLD
    side = torch.cuda.Stream(device=device)
    with torch.cuda.stream(side):  # a CUDA future syncs the waiting stream
        v = fut.wait()
        got = v[:4].clone()
    side.synchronize()
    if v.data_ptr() != buf.data_ptr() or not torch.all(got == want):
        raise AssertionError(f"hook: got {got.tolist()}, want {want} in the bucket's own buffer")
    fut2 = fairgo_torch.allreduce_hook(None, FakeBucket(torch.ones(10, device=device)))  # the default comm
    if not torch.all(fut2.wait() == 1.0):
        raise AssertionError("hook with the default comm")
    # A backward pass of three buckets: the earlier two stay pending until
    # the last, which completes all three as of the current stream.
    bufs = [torch.full((n,), float((RANK + 1) * (i + 1)), device=device) for i, n in enumerate([1 << 18, 1 << 20, 1000])]
    torch.cuda._sleep(50_000_000)
    futs = [fairgo_torch.allreduce_hook(comm, FakeBucket(b, last=False)) for b in bufs[:-1]]
    if any(f.done() for f in futs):
        raise AssertionError("an earlier bucket's future completed before the last bucket")
    futs.append(fairgo_torch.allreduce_hook(comm, FakeBucket(bufs[-1], last=True)))
    if not all(f.done() for f in futs):
        raise AssertionError("the last bucket left a future pending")
    with torch.cuda.stream(side):
        got = [f.wait()[-4:].clone() for f in futs]
    side.synchronize()
    for i, (b, f, g) in enumerate(zip(bufs, futs, got)):
        if f.value().data_ptr() != b.data_ptr() or not torch.all(g == want * (i + 1)):
            raise AssertionError(f"hook bucket {i}: got {g.tolist()}, want {want * (i + 1)} in its own buffer")
    comm.synchronize(60)
    log(f"hook: completed CUDA future in {hook_ms:.2f} ms, value synced on another stream; three buckets of a backward")


def check_hook_overlap(comm, device):
    """The hook leaves the current stream free: work enqueued there after
    the hook runs while the reduction still waits for a late rank (rank 0
    joins 1.5 s late), as the backward pass must."""
    buf = torch.full((1 << 20,), float(RANK + 1), device=device)
    torch.cuda.synchronize(device)
    if RANK == 0:
        time.sleep(1.5)
    fut = fairgo_torch.allreduce_hook(comm, FakeBucket(buf, last=False))
    if RANK != 0:
        marker = torch.cuda.Event()
        marker.record(torch.cuda.current_stream(device))
        t0 = time.perf_counter()
        while not marker.query():
            if time.perf_counter() - t0 > 1.0:
                raise AssertionError("the current stream waits for the hook's reduction: the backward would stall behind it")
            time.sleep(0.001)
    if fut.done():
        raise AssertionError("a bucket's future completed before the last bucket")
    last = fairgo_torch.allreduce_hook(comm, FakeBucket(torch.ones(8, device=device), last=True))
    with torch.cuda.stream(torch.cuda.Stream(device=device)):
        got = fut.wait()[:4].clone()
        ones = last.wait()[:4].clone()
    torch.cuda.synchronize(device)
    want = (WORLD + 1) / 2
    if not torch.all(got == want) or not torch.all(ones == 1.0):
        raise AssertionError(f"hook overlap: got {got.tolist()} and {ones.tolist()}, want {want} and 1.0")
    log("hook: the current stream runs on while a bucket waits for a late rank")


def check_ddp_hooks(comm, device):
    """Both of register_hook's hooks inside DDP: a two-layer model in three
    buckets, three steps (the first rebuilds DDP's buckets); each step's
    gradients must be the average of every rank's own, computed apart and
    gathered with torch.distributed."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    impls = os.environ.get("SMOKE_HOOKS", "python,cpp").split(",")
    for impl in impls:
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 16)).to(device)
        alone = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 16)).to(device)
        alone.load_state_dict(model.state_dict())
        ddp = DDP(model, device_ids=[device.index], bucket_cap_mb=1)
        got = fairgo_torch.register_hook(ddp, comm, impl=impl)
        if got != impl:
            raise AssertionError(f"register_hook(impl={impl!r}) registered {got!r}")
        for step in range(3):
            g = torch.Generator(device=device).manual_seed(1000 * step + RANK)
            x = torch.randn(64, 512, generator=g, device=device)
            ddp.zero_grad(set_to_none=True)
            ddp(x).square().mean().backward()
            alone.zero_grad(set_to_none=True)
            alone(x).square().mean().backward()
            for (name, p), q in zip(model.named_parameters(), alone.parameters()):
                want = q.grad.clone()
                dist.all_reduce(want)
                want /= WORLD
                if not torch.allclose(p.grad, want, rtol=1e-4, atol=1e-6):
                    err = (p.grad - want).abs().max().item()
                    raise AssertionError(f"{impl} hook, step {step}, {name}: gradient off the ranks' average by {err:g}")
            with torch.no_grad():
                for p, q in zip(model.parameters(), alone.parameters()):
                    p.sub_(0.01 * p.grad)
                    q.copy_(p)
        comm.synchronize(60)
        log(f"hook in DDP ({impl}): three steps' gradients the ranks' average")


def check_errors(comm, device):
    def expect(exc, fn, text):
        try:
            fn()
        except exc as e:
            if text not in str(e):
                raise AssertionError(f"{exc.__name__} without {text!r}: {e}")
            return
        raise AssertionError(f"no {exc.__name__} ({text})")

    expect(TypeError, lambda: comm.allreduce_(torch.ones(4, dtype=torch.bool, device=device)), "torch.bool")
    expect(fairgo_torch.InvalidArgumentError, lambda: comm.allreduce_(torch.ones(4)), "CUDA tensor")
    expect(fairgo_torch.InvalidArgumentError, lambda: comm.allreduce_(torch.ones(4, 4, device=device).t()), "contiguous")
    expect(ValueError, lambda: comm.allreduce_(torch.ones(4, device=device), op="band"), "band")
    w = comm.allreduce_(torch.ones(4, device=device), track=False)
    w.wait(60)
    w.free()
    log("errors: raised as documented")


def main():
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    device = 0 if torch.cuda.device_count() == 1 else LOCAL
    torch.cuda.set_device(device)
    dev = torch.device("cuda", device)
    fairgo_torch.init_process_group("nccl", device_id=dev)
    comm = fairgo_torch.init(op_timeout=120)
    log(comm)
    check_allreduce(comm, dev)
    check_ordering(comm, dev)
    check_hook(comm, dev)
    check_hook_overlap(comm, dev)
    check_ddp_hooks(comm, dev)
    check_errors(comm, dev)
    dist.barrier()
    fairgo_torch.shutdown()
    try:
        comm.allreduce_(torch.ones(1, device=dev))
        raise AssertionError("allreduce_ after close")
    except fairgo_torch.BadHandleError:
        pass
    dist.destroy_process_group()
    log("gpu_smoke: ok")


if __name__ == "__main__":
    main()
