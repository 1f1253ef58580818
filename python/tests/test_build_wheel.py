"""python/build_wheel.py: its ELF reader against objdump and against small
shared objects gcc builds here, the platform tag it derives, the metadata
it writes; and cmd/libfairgo/glibc_compat.h, which binds the functions
glibc 2.34 moved into libc.so.6 to their old versions. Skips what needs gcc
or objdump where they are missing.
"""

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

COMPAT_H = REPO / "cmd" / "libfairgo" / "glibc_compat.h"

# The calls runtime/cgo, package net and the CUDA and NCCL loaders make,
# all of which glibc 2.32 or 2.34 gave new versions.
PROBE_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <resolv.h>
#include <signal.h>

static void* run(void* arg) { return arg; }

int probe(int dns) {
    pthread_t t;
    pthread_attr_t a;
    size_t n = 0;
    sigset_t s;
    unsigned char ans[512];
    pthread_attr_init(&a);
    pthread_attr_getstacksize(&a, &n);
    pthread_sigmask(SIG_SETMASK, 0, &s);
    if (pthread_create(&t, &a, run, 0) == 0) pthread_join(t, 0);
    void* h = dlopen("libm.so.6", RTLD_NOW);
    if (h) { dlsym(h, "cos"); dlclose(h); } else dlerror();
    if (dns) res_search("localhost", 1, 1, ans, sizeof ans); /* referenced; the test does not query */
    return (int)n;
}
"""


def host_glibc():
    """The build host's glibc as (2, N), or None."""
    try:
        out = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    m = re.search(r"(?i)(glibc|gnu libc).*?(\d+)\.(\d+)", out.splitlines()[0] if out else "")
    return (int(m[2]), int(m[3])) if m else None


def objdump_imports(path):
    """{symbol: version} of objdump -T's undefined, versioned symbols."""
    out = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        m = re.search(r"\*UND\*\s+\S+\s+(?:Base\s+)?\(?([A-Za-z0-9_.]+)\)?\s+(\S+)$", line)
        if m and m[1] != "Base":
            got[m[2]] = m[1]
    return got


@unittest.skipUnless(shutil.which("gcc"), "gcc not found")
class TestCompatHeader(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = Path(cls.tmp.name)
        (d / "probe.c").write_text(PROBE_C)
        link = ["-Wl,--push-state,--no-as-needed", "-l:libpthread.so.0", "-l:libdl.so.2", "-l:libresolv.so.2",
                "-Wl,--pop-state"]
        cls.plain = d / "plain.so"
        cls.compat = d / "compat.so"
        for out, extra in ((cls.plain, []), (cls.compat, ["-include", str(COMPAT_H)])):
            r = subprocess.run(["gcc", "-shared", "-fPIC", "-O1", *extra, "-o", str(out), str(d / "probe.c"), *link],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise unittest.SkipTest(f"gcc cannot build the probe library: {r.stderr}")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_reader_matches_objdump(self):
        if shutil.which("objdump") is None:
            self.skipTest("objdump not found")
        for lib in (self.plain, self.compat):
            got = {s: v for s, (v, _) in build_wheel.elf_versioned_imports(lib.read_bytes()).items()}
            self.assertEqual(got, objdump_imports(lib), lib.name)

    def test_plain_build_needs_the_host_glibc(self):
        """Without the header, a build on glibc 2.34 or newer needs 2.34:
        what the compat build and the wheel test guard against."""
        g = host_glibc()
        if g is None or g < (2, 34) or sys.platform != "linux" or build_wheel.elf_glibc_needs(self.plain.read_bytes())[0] != "x86_64":
            self.skipTest(f"needs an x86_64 build host with glibc 2.34 or newer (this one: {g})")
        imports = build_wheel.elf_versioned_imports(self.plain.read_bytes())
        self.assertEqual(imports["pthread_create"][0], "GLIBC_2.34")
        self.assertEqual(imports["dlopen"][0], "GLIBC_2.34")
        self.assertEqual(build_wheel.elf_glibc_needs(self.plain.read_bytes())[1], 34)
        self.assertEqual(build_wheel.platform_tag(self.plain.read_bytes()), "manylinux_2_34_x86_64")

    def test_compat_build_needs_glibc_2_28_or_older(self):
        data = self.compat.read_bytes()
        if build_wheel.elf_glibc_needs(data)[0] != "x86_64":
            self.skipTest("glibc_compat.h binds versions on x86_64 only")
        imports = build_wheel.elf_versioned_imports(data)
        for sym in ("pthread_create", "pthread_join", "pthread_attr_getstacksize", "pthread_sigmask", "dlopen", "dlsym",
                    "dlclose", "dlerror"):
            self.assertEqual(imports[sym], ("GLIBC_2.2.5", "libc.so.6"), sym)
        self.assertEqual(imports["__res_search"][0], "GLIBC_2.2.5")
        self.assertNotIn("res_search", imports)
        _, newest = build_wheel.elf_glibc_needs(data)
        self.assertLessEqual(newest, 28)
        self.assertEqual(build_wheel.platform_tag(data), f"manylinux_2_{max(newest, 17)}_x86_64")
        self.assertLessEqual({"libpthread.so.0", "libdl.so.2", "libresolv.so.2", "libc.so.6"},
                             set(build_wheel.elf_needed(data)))

    def test_dl_stubs_bind_unversioned_references(self):
        """A reference without the header (as from a Go object: purego's
        //go:linkname dlopen dlopen) binds to glibc_compat_linux_amd64.S's
        hidden stubs, which take the GLIBC_2.2.5 versions; the stubs work."""
        stubs = COMPAT_H.with_name("glibc_compat_linux_amd64.S")
        d = Path(self.tmp.name)
        (d / "dl.c").write_text(
            "#include <dlfcn.h>\n"
            "int dl(void) { void* h = dlopen(\"libm.so.6\", RTLD_NOW); if (!h) { dlerror(); return 0; }"
            " int ok = dlsym(h, \"cos\") != 0; dlclose(h); return ok; }\n")
        out = d / "dl.so"
        r = subprocess.run(["gcc", "-shared", "-fPIC", "-DFAIRGO_GLIBC_COMPAT=1", "-o", str(out), str(d / "dl.c"), str(stubs),
                            "-Wl,--no-as-needed", "-l:libdl.so.2"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        data = out.read_bytes()
        if build_wheel.elf_glibc_needs(data)[0] != "x86_64":
            self.skipTest("the stubs are for x86_64")
        imports = build_wheel.elf_versioned_imports(data)
        for sym in ("dlopen", "dlsym", "dlerror", "dlclose"):
            self.assertEqual(imports[sym][0], "GLIBC_2.2.5", sym)
        import ctypes

        self.assertEqual(ctypes.CDLL(str(out)).dl(), 1)

    def test_compat_build_runs(self):
        """The old versions are the same functions: the probe, loaded with
        ctypes, starts a thread and loads libm."""
        import ctypes

        lib = ctypes.CDLL(str(self.compat))
        self.assertGreater(lib.probe(0), 0)

    def test_wheel_of_compat_build(self):
        with tempfile.TemporaryDirectory() as out:
            wheel = build_wheel.build(self.compat, Path(out))
            with zipfile.ZipFile(wheel) as z:
                tag = re.search(r"(?m)^Tag: py3-none-(\S+)$", z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode())[1]
                meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        self.assertEqual(tag, build_wheel.platform_tag(self.compat.read_bytes()))
        self.assertTrue(wheel.name.endswith(f"-py3-none-{tag}.whl"), wheel.name)
        self.assertNotIn("Requires-Dist: numpy", meta)
        self.assertIn("Description-Content-Type: text/markdown", meta)


class TestTag(unittest.TestCase):
    def test_glibc_version(self):
        self.assertEqual(build_wheel.glibc_version("GLIBC_2.34"), (2, 34))
        self.assertEqual(build_wheel.glibc_version("GLIBC_2.2.5"), (2, 2))
        self.assertEqual(build_wheel.glibc_version("GLIBC_2.3.2"), (2, 3))
        self.assertIsNone(build_wheel.glibc_version("GLIBC_PRIVATE"))
        self.assertIsNone(build_wheel.glibc_version("GCC_3.0"))

    def test_not_elf(self):
        with self.assertRaises(ValueError):
            build_wheel.platform_tag(b"#!/bin/sh\n")

    def test_main_glibc(self):
        lib = REPO / "lib" / "libfairgo.so"
        if not lib.is_file():
            self.skipTest("lib/libfairgo.so not built (make libfairgo)")
        out = subprocess.run([sys.executable, str(REPO / "python" / "build_wheel.py"), "--glibc", str(lib)],
                             capture_output=True, text=True, check=True).stdout
        self.assertRegex(out, r"(?m)^tag: manylinux_2_\d+_\w+$")


if __name__ == "__main__":
    unittest.main()
