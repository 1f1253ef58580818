#!/usr/bin/env python3
"""Judges fairgo's hook against DDP's own allreduce from train_resnet.py runs
with the same seeds (--losses-out):

    python3 examples/ddp_torch/compare_losses.py default.json fairgo.json --envelope ring.json tree.json

default.json is DDP's allreduce as NCCL chooses it, fairgo.json fairgo's
hook, and the --envelope files more correct runs that differ from the
default only in the summation order of NCCL's allreduce (NCCL_ALGO=Ring,
NCCL_ALGO=Tree, or another NCCL_PROTO). Two checks:

- Losses: floating-point addition is not associative, and training amplifies
  the last bits of a gradient step after step, so two correct runs drift
  apart. The envelope at step s is the largest relative loss difference
  (|a - b| / max(|a|, |b|), over ranks and over every pair of the correct
  runs) at any step up to s: how far correct runs have drifted by then (at
  one step two drifting curves may cross, so the running maximum is the
  drift). fairgo agrees when at every step its relative difference from the
  default run is at most --multiple times the envelope plus --floor. The
  floor covers the first steps, where two NCCL algorithms that share most
  of their summation order barely drift apart (ResNet-18 on emulated 2 x 2:
  envelope 1.4e-7 at step 1) while a hierarchical order, with step-0
  gradients well inside the float32 bound, differs by 2.3e-6.
- Step-0 gradients, when the runs recorded them (train_resnet.py
  --grad-check): the averaged gradient of the first step, before training
  has amplified anything, must be within the float32 bound of a sum of W
  terms of the exact (float64) average of the ranks' gradients:
  |g - exact| <= (W + 2) u mean_r |g_r|, u = 2^-24 (W - 1 additions and the
  division's rounding, one rounding of the result, one for the ranks'
  gradients being recomputed for the check).

Without --envelope (the former usage) the losses must agree within --rtol
relative at every step. Prints the figures and "agree" or "DIFFER"; exits
0 when they agree, 1 when not, 2 when the runs cannot be compared
(different steps, ranks, batch or seeds). No PyTorch needed.
"""

import argparse
import json
import math
import sys

U = 2.0 ** -24  # float32's unit roundoff

SAME = ("world_size", "steps", "batch_size", "image_size", "seed")


def load(path):
    with open(path) as f:
        run = json.load(f)
    run["_path"] = path
    run["_losses"] = run.get("losses_by_rank") or [run["losses"]]
    return run


def name(run):
    algo = run.get("nccl_algo")
    hook = run.get("hook", run["_path"])
    return f"{hook} (NCCL_ALGO={algo})" if algo and hook == "default" else hook


def rel_diff(a, b):
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def comparable(runs, out):
    """None when the runs can be compared, else the reason."""
    first = runs[0]
    for run in runs[1:]:
        for key in SAME:
            if first.get(key) != run.get(key):
                return f"{key} differs ({first.get(key)} in {first['_path']}, {run.get(key)} in {run['_path']})"
        a, b = first["_losses"], run["_losses"]
        if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
            return f"different numbers of ranks or steps ({first['_path']}, {run['_path']})"
    if not first["_losses"] or not first["_losses"][0]:
        return "no losses"
    return None


def step_diffs(a, b):
    """The largest relative difference over ranks at each step, and the rank."""
    out = []
    for step in range(len(a[0])):
        d, r = max((rel_diff(a[r][step], b[r][step]), r) for r in range(len(a)))
        out.append((d, r))
    return out


def envelope(correct):
    """The running maximum, over steps, of the largest relative difference
    between any two correct runs at a step."""
    steps = len(correct[0]["_losses"][0])
    per_step = [0.0] * steps
    for i in range(len(correct)):
        for j in range(i + 1, len(correct)):
            for step, (d, _) in enumerate(step_diffs(correct[i]["_losses"], correct[j]["_losses"])):
                per_step[step] = max(per_step[step], d)
    env, worst = [], 0.0
    for d in per_step:
        worst = max(worst, d)
        env.append(worst)
    return env


def grad_bound_ratio(run):
    """The largest |g - exact| / bound over the recorded step-0 gradient
    sample, or None when the run recorded none."""
    gc = run.get("grad_check")
    if not gc or not gc.get("values"):
        return None
    w = gc["world_size"]
    if not len(gc["values"]) == len(gc["exact"]) == len(gc["abs_mean"]):
        return math.inf
    worst = 0.0
    for v, exact, mag in zip(gc["values"], gc["exact"], gc["abs_mean"]):
        bound = (w + 2) * U * mag + 1e-38
        err = abs(v - exact) if math.isfinite(v) else math.inf
        worst = max(worst, err / bound)
    return worst


def compare_envelope(base, cand, refs, multiple, floor, out):
    correct = [base] + refs
    env = envelope(correct)
    dev = step_diffs(base["_losses"], cand["_losses"])
    ok = True
    worst, where = -1.0, None
    for step, ((d, r), e) in enumerate(zip(dev, env)):
        allowance = multiple * e + floor
        ratio = 0.0 if d == 0 else (d / allowance if allowance > 0 else math.inf)
        if ratio > worst:
            worst, where = ratio, (step, r, d, e)
        ok = ok and ratio <= 1
    ranks, steps = len(base["_losses"]), len(env)
    print(f"{name(cand)} vs {name(base)}, envelope from {', '.join(name(r) for r in correct)}: {ranks} ranks x {steps} steps", file=out)
    marks = sorted({1, min(3, steps - 1), min(10, steps - 1), steps // 2, steps - 1})
    print("  envelope (largest relative loss spread of the correct runs so far): "
          + ", ".join(f"step {s} {env[s]:.2e}" for s in marks if s < steps), file=out)
    print("  deviation of the candidate:                                       "
          + ", ".join(f"step {s} {dev[s][0]:.2e}" for s in marks if s < steps), file=out)
    step, r, d, e = where
    print(f"  worst step {step} (rank {r}): deviation {d:.2e} = {worst:.2f} of the allowance "
          f"{multiple:g} x envelope {e:.2e} + floor {floor:g}", file=out)
    return ok


def compare_rtol(base, cand, rtol, out):
    worst, where = -1.0, None
    for r, (xs, ys) in enumerate(zip(base["_losses"], cand["_losses"])):
        for step, (x, y) in enumerate(zip(xs, ys)):
            d = rel_diff(x, y)
            if d > worst:
                worst, where = d, (r, step, x, y)
    r, step, x, y = where
    steps = len(base["_losses"][0])
    print(f"{name(base)} vs {name(cand)}: {len(base['_losses'])} ranks x {steps} steps, "
          f"max relative loss difference {worst:.3e} (rank {r}, step {step}: {x:.6f} vs {y:.6f}), tolerance {rtol:g}", file=out)
    return worst <= rtol


def compare(base_path, cand_path, refs=(), rtol=1e-3, multiple=4.0, floor=1e-5, out=sys.stdout):
    """Returns the exit code: 0 agree, 1 differ, 2 incomparable."""
    base, cand = load(base_path), load(cand_path)
    ref_runs = [load(p) for p in refs]
    runs = [base, cand] + ref_runs
    why = comparable(runs, out)
    if why:
        print(f"cannot compare: {why}", file=out)
        return 2
    if ref_runs:
        ok = compare_envelope(base, cand, ref_runs, multiple, floor, out)
    else:
        ok = compare_rtol(base, cand, rtol, out)
    ratios = [(name(run), grad_bound_ratio(run)) for run in runs]
    checked = [(n, x) for n, x in ratios if x is not None]
    if checked:
        w = next(run["grad_check"]["world_size"] for run in runs if run.get("grad_check"))
        print(f"  step-0 gradients, error as a share of the float32 bound of a sum of {w} terms: "
              + ", ".join(f"{n} {x:.2f}" for n, x in checked), file=out)
        ok = ok and all(x <= 1 for _, x in checked)
    missing = [n for n, x in ratios if x is None]
    if missing:
        print(f"  step-0 gradients not recorded by: {', '.join(missing)}", file=out)
    for run in runs:
        ips = run.get("images_per_s")
        if ips is not None:
            print(f"  {name(run)}: {ips:.1f} images/s, {run.get('ms_per_step', float('nan')):.1f} ms/step ({run['_path']})", file=out)
    print("agree" if ok else "DIFFER", file=out)
    return 0 if ok else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("baseline", help="DDP's own allreduce (--hook default), NCCL's choice of algorithm")
    p.add_argument("candidate", help="the run to judge (--hook fairgo)")
    p.add_argument("--envelope", nargs="+", default=[], metavar="REF",
                   help="correct runs that differ only in NCCL's summation order (NCCL_ALGO=Ring, Tree)")
    p.add_argument("--multiple", type=float, default=4.0, help="allowed multiple of the envelope (default 4)")
    p.add_argument("--floor", type=float, default=1e-5,
                   help="allowed relative difference where the envelope is near 0 (default 1e-5, about 80 float32 roundings)")
    p.add_argument("--rtol", type=float, default=1e-3, help="without --envelope: the fixed relative tolerance (default 1e-3)")
    args = p.parse_args(argv)
    if not args.multiple > 0 or not args.floor >= 0 or not args.rtol >= 0:
        p.error("--multiple must be positive, --floor and --rtol not negative")
    return compare(args.baseline, args.candidate, args.envelope, args.rtol, args.multiple, args.floor)


if __name__ == "__main__":
    sys.exit(main())
