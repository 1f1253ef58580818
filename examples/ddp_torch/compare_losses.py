#!/usr/bin/env python3
"""Compares the per-step losses of two train_resnet.py runs (--losses-out):

    python3 examples/ddp_torch/compare_losses.py default.json fairgo.json [--rtol 1e-3]

Every rank's loss at every step must agree within rtol relative
(|a - b| / max(|a|, |b|)); prints the largest relative difference, where it
is, and both runs' images/s. Exits 0 when they agree, 1 when not, 2 when the
runs cannot be compared (different steps, ranks or batch). No PyTorch needed.
"""

import argparse
import json
import math
import sys


def load(path):
    with open(path) as f:
        run = json.load(f)
    by_rank = run.get("losses_by_rank") or [run["losses"]]
    return run, by_rank


def rel_diff(a, b):
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def compare(a_path, b_path, rtol, out=sys.stdout):
    a, a_losses = load(a_path)
    b, b_losses = load(b_path)
    for key in ("world_size", "steps", "batch_size", "image_size", "seed"):
        if a.get(key) != b.get(key):
            print(f"cannot compare: {key} differs ({a.get(key)} vs {b.get(key)})", file=out)
            return 2
    if len(a_losses) != len(b_losses) or any(len(x) != len(y) for x, y in zip(a_losses, b_losses)):
        print("cannot compare: different numbers of ranks or steps", file=out)
        return 2
    worst, where = -1.0, None
    for r, (xs, ys) in enumerate(zip(a_losses, b_losses)):
        for step, (x, y) in enumerate(zip(xs, ys)):
            d = rel_diff(x, y)
            if d > worst:
                worst, where = d, (r, step, x, y)
    if where is None:
        print("cannot compare: no losses", file=out)
        return 2
    r, step, x, y = where
    steps = len(a_losses[0])
    print(f"{a.get('hook', a_path)} vs {b.get('hook', b_path)}: {len(a_losses)} ranks x {steps} steps, "
          f"max relative loss difference {worst:.3e} (rank {r}, step {step}: {x:.6f} vs {y:.6f}), tolerance {rtol:g}", file=out)
    for run, path in ((a, a_path), (b, b_path)):
        ips = run.get("images_per_s")
        if ips is not None:
            print(f"  {run.get('hook', path)}: {ips:.1f} images/s, {run.get('ms_per_step', float('nan')):.1f} ms/step ({path})", file=out)
    ok = worst <= rtol
    print("agree" if ok else "DIFFER", file=out)
    return 0 if ok else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=1e-3)
    args = p.parse_args(argv)
    return compare(args.a, args.b, args.rtol)


if __name__ == "__main__":
    sys.exit(main())
