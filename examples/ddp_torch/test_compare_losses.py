"""Tests of compare_losses.py with synthetic runs (no PyTorch):
python3 -m unittest discover -s examples/ddp_torch"""

import io
import json
import math
import tempfile
import unittest
from pathlib import Path

import compare_losses

U = 2.0 ** -24


def curve(steps, rank, drift):
    """A falling loss whose relative deviation from the base curve is drift(step)."""
    return [(6.9 - 0.05 * s + 0.01 * rank) * (1 + drift(s)) for s in range(steps)]


class Runs:
    def __init__(self, d, world=2, steps=12):
        self.d, self.world, self.steps = Path(d), world, steps

    def write(self, name, drift=lambda s: 0.0, hook=None, grad_check=None, **kw):
        losses = [curve(self.steps, r, drift) for r in range(self.world)]
        run = {"hook": hook or name, "world_size": self.world, "steps": self.steps, "batch_size": 32, "image_size": 224,
               "seed": 0, "losses": losses[0], "losses_by_rank": losses, "images_per_s": 1000.0, "ms_per_step": 64.0}
        if grad_check is not None:
            run["grad_check"] = grad_check
        run.update(kw)
        p = self.d / f"{name}.json"
        p.write_text(json.dumps(run))
        return str(p)


def growing(start, rate=2.0, sign=1):
    """Training's drift: 0 at step 0 (no allreduce yet), then growing geometrically."""
    return lambda s: 0.0 if s == 0 else sign * start * rate ** (s - 1)


def grad_check(world, errors):
    """A step-0 gradient sample whose averaged values are off by errors[i]
    (in units of the float32 bound of a sum of world terms)."""
    exact = [0.5, -1.25e-3, 3e-6, 0.0]
    mag = [0.75, 2e-3, 4e-6, 0.0]
    values = [e + k * (world + 2) * U * m for e, m, k in zip(exact, mag, errors)]
    return {"world_size": world, "values": values, "exact": exact, "abs_mean": mag}


def run_compare(*args, **kw):
    out = io.StringIO()
    return compare_losses.compare(*args, out=out, **kw), out.getvalue()


class TestEnvelope(unittest.TestCase):
    def test_verdicts(self):
        cases = [
            # name, the candidate's drift, the reference runs' drifts, want
            ("within the envelope", growing(3e-7, sign=-1), [growing(1e-7), growing(2e-7, sign=-1)], 0),
            ("at 3x the envelope", growing(6e-7), [growing(2e-7)], 0),
            ("at 6x the envelope", growing(1.2e-6), [growing(2e-7)], 1),
            ("no drift, under the floor", growing(1e-9, rate=1.0), [lambda s: 0.0, lambda s: 0.0], 0),
            ("no drift, over the floor", growing(1e-4, rate=1.0), [lambda s: 0.0, lambda s: 0.0], 1),
            ("a NaN", lambda s: math.nan if s == 5 else 0.0, [growing(1e-7)], 1),
        ]
        for name, cand, refs, want in cases:
            with self.subTest(name), tempfile.TemporaryDirectory() as d:
                runs = Runs(d)
                base = runs.write("default")
                paths = [runs.write(f"ref{i}", r, hook="default", nccl_algo=algo) for i, (r, algo) in enumerate(zip(refs, ["Ring", "Tree"]))]
                rc, out = run_compare(base, runs.write("fairgo", cand), paths)
                self.assertEqual(rc, want, out)
                self.assertIn("agree" if want == 0 else "DIFFER", out.splitlines()[-1])
                self.assertIn("envelope", out)
                self.assertIn("NCCL_ALGO=Ring", out)

    def test_envelope_is_the_running_maximum(self):
        """Two correct curves that cross at step 6 (spread 0 there) still
        allow the drift reached before."""
        def crossing(s):
            return {3: 1e-5, 4: 2e-5, 5: 4e-5}.get(s, 0.0)
        env = compare_losses.envelope([compare_losses.load(p) for p in self._paths(crossing)])
        self.assertEqual(env[2], 0.0)
        self.assertAlmostEqual(env[5], 4e-5, delta=1e-8)
        self.assertEqual(env[6], env[5])
        self.assertEqual(env[-1], env[5])

    def _paths(self, drift):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        runs = Runs(self._tmp.name)
        return [runs.write("default"), runs.write("ref", drift)]

    def test_worst_step_named(self):
        with tempfile.TemporaryDirectory() as d:
            runs = Runs(d)
            spike = lambda s: 5e-4 if s == 7 else 0.0  # noqa: E731
            rc, out = run_compare(runs.write("default"), runs.write("fairgo", spike), [runs.write("ring", growing(1e-7))])
        self.assertEqual(rc, 1, out)
        self.assertIn("worst step 7", out)


class TestGradients(unittest.TestCase):
    def test_bound(self):
        nonzero = grad_check(4, [0.0] * 4)
        nonzero["values"][3] = 1e-20  # where every rank's gradient is 0, the sum is exactly 0
        cases = [(grad_check(4, [0.0] * 4), 0), (grad_check(4, [0.5, -0.9, 0.99, 0.0]), 0), (grad_check(4, [0.2, 3.0, 0.0, 0.0]), 1),
                 (nonzero, 1)]
        for gc, want in cases:
            with self.subTest(values=gc["values"]), tempfile.TemporaryDirectory() as d:
                runs = Runs(d, world=4)
                gc_ok = grad_check(4, [0.0] * 4)
                rc, out = run_compare(runs.write("default", grad_check=gc_ok), runs.write("fairgo", grad_check=gc),
                                      [runs.write("ring", growing(1e-7), grad_check=gc_ok)])
                self.assertEqual(rc, want, out)
                self.assertIn("float32 bound of a sum of 4 terms", out)

    def test_ratio(self):
        run = {"grad_check": grad_check(8, [0.25, -0.5, 0.0, 0.0])}
        self.assertAlmostEqual(compare_losses.grad_bound_ratio(run), 0.5, places=6)
        self.assertIsNone(compare_losses.grad_bound_ratio({}))
        bad = grad_check(8, [0.0] * 4)
        bad["values"] = bad["values"][:2]
        self.assertEqual(compare_losses.grad_bound_ratio({"grad_check": bad}), math.inf)

    def test_not_recorded(self):
        with tempfile.TemporaryDirectory() as d:
            runs = Runs(d)
            rc, out = run_compare(runs.write("default"), runs.write("fairgo"), [runs.write("ring")])
        self.assertEqual(rc, 0, out)
        self.assertIn("not recorded by", out)


class TestFixedTolerance(unittest.TestCase):
    """The former two-file usage: a fixed relative tolerance."""

    def test_agree_and_differ(self):
        with tempfile.TemporaryDirectory() as d:
            runs = Runs(d, steps=3)
            base = runs.write("default")
            cases = [
                ("identical", lambda s: 0.0, 0, "max relative loss difference 0.000e+00"),
                ("within", lambda s: 5e-4 if s == 1 else 0.0, 0, "step 1"),
                ("beyond", lambda s: 2e-3 if s == 2 else 0.0, 1, "step 2"),
                ("nan", lambda s: math.nan if s == 1 else 0.0, 1, "inf"),
            ]
            for name, drift, want, text in cases:
                with self.subTest(name):
                    rc, out = run_compare(base, runs.write(f"fairgo-{name}", drift))
                    self.assertEqual(rc, want, out)
                    self.assertIn(text, out)
                    self.assertIn("images/s", out)

    def test_incomparable(self):
        with tempfile.TemporaryDirectory() as d:
            runs = Runs(d, steps=2)
            base = runs.write("a")
            rc, out = run_compare(base, Runs(d, steps=3).write("b"))
            self.assertEqual(rc, 2, out)
            rc, out = run_compare(base, runs.write("c", batch_size=64))
            self.assertEqual(rc, 2)
            self.assertIn("batch_size", out)
            rc, out = run_compare(base, runs.write("e"), [runs.write("ref", seed=1)])
            self.assertEqual(rc, 2)
            self.assertIn("seed", out)

    def test_main(self):
        with tempfile.TemporaryDirectory() as d:
            runs = Runs(d)
            a, b, r = runs.write("default"), runs.write("fairgo", growing(1e-7)), runs.write("ring", growing(1e-7))
            self.assertEqual(compare_losses.main([a, b, "--envelope", r]), 0)
            self.assertEqual(compare_losses.main([a, b, "--envelope", r, "--multiple", "0.1", "--floor", "0"]), 1)
            self.assertEqual(compare_losses.main([a, b, "--rtol", "1e-9"]), 1)


if __name__ == "__main__":
    unittest.main()
