"""The wheel `make wheel` builds (dist/fairgo_torch-*.whl): it installs into
a fresh virtual environment with pip alone, and the installed package finds
the libfairgo.so it carries without FAIRGO_LIB, which still overrides it.
Its libfairgo.so needs no glibc symbol version newer than 2.28 and its tag
says what it needs; it requires only what the package imports.
Builds nothing (make python-test builds the wheel first); skips when no
wheel is there.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
import build_wheel  # noqa: E402

# The oldest glibc the wheel must load on: RHEL/Rocky/Alma 8 (Ubuntu 20.04
# has 2.31). cmd/libfairgo/glibc_compat.h and the Makefile's GLIBC_COMPAT
# keep libfairgo.so there.
MAX_GLIBC = (2, 28)
# The libraries a manylinux wheel may link without carrying them (PEP 599's
# list, less the graphics ones fairgo has no use for).
MANYLINUX_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libresolv.so.2",
                  "libutil.so.1", "libnsl.so.1", "libgcc_s.so.1", "libstdc++.so.6", "libz.so.1"}

PROBE = """
import json, os, fairgo_torch
lib = fairgo_torch.load()
print(json.dumps({"package": fairgo_torch.__file__, "lib": str(lib.path), "abi": lib.dll.fairgo_abi_version()}))
"""


def wheels():
    return sorted((REPO / "dist").glob("fairgo_torch-*.whl"))


class TestWheel(unittest.TestCase):
    maxDiff = None

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

    def read(self, suffix):
        with zipfile.ZipFile(self.wheel) as z:
            names = [n for n in z.namelist() if n.endswith(suffix)]
            self.assertEqual(len(names), 1, f"{suffix} in {self.wheel.name}")
            return z.read(names[0])

    def test_contents(self):
        with zipfile.ZipFile(self.wheel) as z:
            names = set(z.namelist())
        wheel = self.read(".dist-info/WHEEL").decode()
        self.assertIn("fairgo_torch/libfairgo.so", names)
        self.assertIn("fairgo_torch/__init__.py", names)
        self.assertIn("fairgo_torch/_hook.cpp", names)  # register_hook builds it where it is installed
        self.assertRegex(wheel, r"Tag: py3-none-manylinux_2_\d+_(x86_64|aarch64)")
        self.assertIn("Root-Is-Purelib: false", wheel)

    def test_metadata(self):
        meta = self.read(".dist-info/METADATA").decode()
        head, _, body = meta.partition("\n\n")
        self.assertEqual(re.findall(r"^Requires-Dist: (.*)$", head, re.M), ["torch>=2.1"])
        self.assertNotIn("numpy", meta)
        self.assertRegex(head, r"(?m)^Summary: \S")
        self.assertIn("Description-Content-Type: text/markdown", head)
        self.assertEqual(body, (REPO / "python" / "README.md").read_text())
        version = re.search(r'^__version__ = "([^"]+)"$', (REPO / "python" / "fairgo_torch" / "_version.py").read_text(), re.M)[1]
        self.assertIn(f"\nVersion: {version}\n", head)
        self.assertIn(f"-{version}-", self.wheel.name)

    def test_requirements_are_imported(self):
        """Every Requires-Dist names a distribution the package imports."""
        meta = self.read(".dist-info/METADATA").decode()
        with zipfile.ZipFile(self.wheel) as z:
            src = "\n".join(z.read(n).decode() for n in z.namelist() if n.startswith("fairgo_torch/") and n.endswith(".py"))
        for req in re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)", meta, re.M):
            module = req.lower().replace("-", "_")
            self.assertRegex(src, rf"(?m)^\s*(import|from) {module}\b",
                             f"the wheel requires {req}, which fairgo_torch never imports")

    def test_tag_is_manylinux_2_28_or_older(self):
        """The tag is the library's real glibc need (build_wheel.platform_tag),
        and that is 2.28 or older."""
        tag = re.search(r"(?m)^Tag: py3-none-(\S+)$", self.read(".dist-info/WHEEL").decode())[1]
        lib = self.read("fairgo_torch/libfairgo.so")
        self.assertEqual(tag, build_wheel.platform_tag(lib))
        self.assertIn(tag, self.wheel.name)
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(x86_64|aarch64)", tag)
        self.assertIsNotNone(m, tag)
        self.assertLessEqual((int(m[1]), int(m[2])), MAX_GLIBC, f"{self.wheel.name} is not installable on glibc 2.28")

    def test_library_needs_glibc_2_28_or_older(self):
        lib = self.read("fairgo_torch/libfairgo.so")
        too_new = sorted(f"{sym}@{ver} ({so})" for sym, (ver, so) in build_wheel.elf_versioned_imports(lib).items()
                         if (build_wheel.glibc_version(ver) or (0, 0)) > MAX_GLIBC)
        self.assertEqual(too_new, [], "libfairgo.so needs glibc symbols newer than 2.28: add them to "
                         "cmd/libfairgo/glibc_compat.h or stop using them")
        _, newest = build_wheel.elf_glibc_needs(lib)
        self.assertLessEqual((2, newest or 0), MAX_GLIBC)
        if shutil.which("objdump") is None:
            return
        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            f.write(lib)
            f.flush()
            out = subprocess.run(["objdump", "-T", f.name], capture_output=True, text=True, check=True).stdout
        versions = [tuple(int(x) for x in v.split(".")[:2]) for v in re.findall(r"\bGLIBC_(\d+\.\d+(?:\.\d+)?)", out)]
        self.assertTrue(versions, "objdump -T lists no GLIBC_ version")
        self.assertLessEqual(max(versions), MAX_GLIBC, "objdump -T of libfairgo.so:\n" + out)

    def test_library_links_only_manylinux_libraries(self):
        lib = self.read("fairgo_torch/libfairgo.so")
        needed = set(build_wheel.elf_needed(lib))
        self.assertIn("libc.so.6", needed)
        self.assertEqual(sorted(needed - MANYLINUX_LIBS), [])
        # Before glibc 2.34 the pthread, dl and resolver functions live in
        # these libraries, not in libc.so.6: the library must load them.
        homes = {r"pthread_|sem_": "libpthread.so.0", r"dl(open|sym|vsym|close|error|addr|addr1|info)$": "libdl.so.2",
                 r"__res_|__dn_": "libresolv.so.2"}
        for sym in build_wheel.elf_versioned_imports(lib):
            for pattern, home in homes.items():
                if re.match(pattern, sym):
                    self.assertIn(home, needed, f"libfairgo.so imports {sym} but does not link {home}")

    def test_import_without_torch(self):
        got = subprocess.run([str(self.python), "-c", "import sys; sys.modules['torch'] = None\n"
                              "import fairgo_torch; print(fairgo_torch.__version__)"],
                             capture_output=True, text=True, timeout=120, cwd=self.tmp.name,
                             env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAIRGO_LIB")})
        self.assertEqual(got.returncode, 0, got.stdout + got.stderr)
        self.assertEqual(got.stdout.strip(), re.search(r'^__version__ = "([^"]+)"$', (REPO / "python" / "fairgo_torch" / "_version.py").read_text(), re.M)[1])

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
