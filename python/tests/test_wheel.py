"""The wheel `make wheel` builds (dist/fairgo_torch-*.whl): it installs into
a fresh virtual environment with pip alone, and the installed package finds
the libfairgo.so it carries without FAIRGO_LIB, which still overrides it.
Builds nothing (make python-test builds the wheel first); skips when no
wheel is there.
"""

import os
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, fairgo_torch
lib = fairgo_torch.load()
print(json.dumps({"package": fairgo_torch.__file__, "lib": str(lib.path), "abi": lib.dll.fairgo_abi_version()}))
"""


def wheels():
    return sorted((REPO / "dist").glob("fairgo_torch-*.whl"))


class TestWheel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        found = wheels()
        if not found:
            raise unittest.SkipTest("no dist/fairgo_torch-*.whl (make wheel)")
        if len(found) > 1:
            raise AssertionError(f"several wheels in dist/: {found} (make wheel removes the old ones)")
        cls.wheel = found[0]
        cls.tmp = tempfile.TemporaryDirectory()
        venv = Path(cls.tmp.name) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
        cls.python = venv / "bin" / "python"
        out = subprocess.run([str(cls.python), "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
                              str(cls.wheel)], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise AssertionError(f"pip install {cls.wheel.name} failed:\n{out.stdout}{out.stderr}")
        cls.site = Path(subprocess.run([str(cls.python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def probe(self, **env):
        """Runs PROBE in the venv, away from the repository (no PYTHONPATH,
        another working directory)."""
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAIRGO_LIB")}
        clean.update(env)
        out = subprocess.run([str(self.python), "-c", PROBE], capture_output=True, text=True, timeout=120, env=clean, cwd=self.tmp.name)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        import json

        return json.loads(out.stdout.strip().splitlines()[-1])

    def test_contents(self):
        with zipfile.ZipFile(self.wheel) as z:
            names = set(z.namelist())
            info = [n for n in names if n.endswith(".dist-info/METADATA")]
            self.assertEqual(len(info), 1)
            meta = z.read(info[0]).decode()
            wheel = z.read(info[0].replace("METADATA", "WHEEL")).decode()
        self.assertIn("fairgo_torch/libfairgo.so", names)
        self.assertIn("fairgo_torch/__init__.py", names)
        self.assertIn("Requires-Dist: torch>=2.1", meta)
        self.assertIn("Requires-Dist: numpy", meta)
        self.assertRegex(wheel, r"Tag: py3-none-manylinux_2_\d+_(x86_64|aarch64)")
        self.assertIn("Root-Is-Purelib: false", wheel)

    def test_bundled_library(self):
        got = self.probe()
        self.assertTrue(Path(got["package"]).resolve().is_relative_to(self.site.resolve()), got)
        self.assertEqual(Path(got["lib"]).resolve(), (self.site / "fairgo_torch" / "libfairgo.so").resolve())
        self.assertGreaterEqual(got["abi"], 2)

    def test_fairgo_lib_overrides(self):
        sim = REPO / "lib" / "libfairgo_sim.so"
        if not sim.is_file():
            self.skipTest("lib/libfairgo_sim.so not built (make libfairgo-sim)")
        got = self.probe(FAIRGO_LIB=str(sim))
        self.assertEqual(Path(got["lib"]), sim)


if __name__ == "__main__":
    unittest.main()
