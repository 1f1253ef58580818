"""Tests of compare_losses.py (no PyTorch): python3 -m unittest discover -s examples/ddp_torch"""

import io
import json
import tempfile
import unittest
from pathlib import Path

import compare_losses


class TestCompare(unittest.TestCase):
    def write(self, d, name, losses, **kw):
        run = {"hook": name, "world_size": len(losses), "steps": len(losses[0]), "batch_size": 32, "image_size": 224,
               "seed": 0, "losses": losses[0], "losses_by_rank": losses, "images_per_s": 1000.0, "ms_per_step": 64.0}
        run.update(kw)
        p = Path(d) / f"{name}.json"
        p.write_text(json.dumps(run))
        return str(p)

    def run_compare(self, a, b, rtol=1e-3):
        out = io.StringIO()
        return compare_losses.compare(a, b, rtol, out), out.getvalue()

    def test_agree_and_differ(self):
        base = [[6.9, 6.8, 6.5], [6.95, 6.7, 6.4]]
        cases = [
            ("identical", base, 0, "max relative loss difference 0.000e+00"),
            ("within", [[6.9, 6.8 * (1 + 5e-4), 6.5], [6.95, 6.7, 6.4]], 0, "rank 0, step 1"),
            ("beyond", [[6.9, 6.8, 6.5], [6.95, 6.7, 6.4 * (1 + 2e-3)]], 1, "rank 1, step 2"),
            ("nan", [[6.9, float("nan"), 6.5], [6.95, 6.7, 6.4]], 1, "inf"),
        ]
        for name, other, want, text in cases:
            with self.subTest(name), tempfile.TemporaryDirectory() as d:
                rc, out = self.run_compare(self.write(d, "default", base), self.write(d, "fairgo", other))
                self.assertEqual(rc, want, out)
                self.assertIn(text, out)
                self.assertIn("images/s", out)

    def test_incomparable(self):
        base = [[6.9, 6.8]]
        with tempfile.TemporaryDirectory() as d:
            rc, out = self.run_compare(self.write(d, "a", base), self.write(d, "b", [[6.9, 6.8, 6.7]]))
            self.assertEqual(rc, 2, out)
            rc, out = self.run_compare(self.write(d, "c", base), self.write(d, "e", base, batch_size=64))
            self.assertEqual(rc, 2)
            self.assertIn("batch_size", out)


if __name__ == "__main__":
    unittest.main()
