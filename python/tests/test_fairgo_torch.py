"""Unit tests of fairgo_torch that need neither PyTorch nor a GPU.

    make python-test     # builds lib/libfairgo_sim.so and runs these

The ctypes layer is exercised against libfairgo_sim.so (the C ABI on the
simulated cluster: one rank, no device memory); the header checks read
cmd/libfairgo/fairgo.h.
"""

import ctypes
import os
import re
import subprocess
import sys
import threading
import time
import unittest
import warnings
from pathlib import Path
from unittest import mock

import fairgo_torch
from fairgo_torch import _comm, _dtypes, _lib

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "cmd" / "libfairgo" / "fairgo.h"


def sim_library_path():
    env = os.environ.get("FAIRGO_LIB", "")
    if env.endswith("_sim.so") and Path(env).is_file():
        return Path(env)
    p = REPO / "lib" / "libfairgo_sim.so"
    return p if p.is_file() else None


class FakeDType:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name


class TestDTypes(unittest.TestCase):
    def test_every_torch_dtype(self):
        want = {
            "torch.float16": 1, "torch.bfloat16": 2, "torch.float32": 3, "torch.float64": 4, "torch.int8": 5,
            "torch.uint8": 6, "torch.int32": 7, "torch.uint32": 8, "torch.int64": 9, "torch.uint64": 10,
        }
        for name, code in want.items():
            with self.subTest(name=name):
                self.assertEqual(fairgo_torch.fairgo_dtype(FakeDType(name)), code)
                self.assertIn(code, _dtypes.SIZES)

    def test_unsupported(self):
        for name in ["torch.bool", "torch.complex64", "torch.float8_e4m3fn", "torch.int16", "float32"]:
            with self.subTest(name=name), self.assertRaises(TypeError) as cm:
                fairgo_torch.fairgo_dtype(FakeDType(name))
            self.assertIn(name, str(cm.exception))
            self.assertIn("torch.bfloat16", str(cm.exception))

    def test_ops(self):
        cases = {"sum": 1, "avg": 2, "mean": 2, "max": 3, "min": 4, "prod": 5, "product": 5, "SUM": 1,
                 "ReduceOp.AVG": 2, "RedOpType.PRODUCT": 5, 3: 3}
        for op, code in cases.items():
            with self.subTest(op=op):
                self.assertEqual(fairgo_torch.fairgo_op(op), code)
        for bad in ["band", "ReduceOp.BXOR"]:
            with self.subTest(op=bad), self.assertRaises(ValueError):
                fairgo_torch.fairgo_op(bad)
        with self.assertRaises(TypeError):
            fairgo_torch.fairgo_op(True)

    def test_op_numbers_pass_through(self):
        # Numbers are the library's to judge (TestLibrary.test_errors).
        for op in [0, 99, -1]:
            with self.subTest(op=op):
                self.assertEqual(fairgo_torch.fairgo_op(op), op)


class TestTorchPort(unittest.TestCase):
    def test_ports(self):
        cases = [
            ({"MASTER_PORT": "29500"}, 29500),  # torchrun
            ({"MASTER_PORT": "41000", "FAIRGO_STORE_ADDR": "127.0.0.1:41000"}, 41001),  # fairrun
            ({"MASTER_PORT": "41000", "FAIRGO_STORE_ADDR": "127.0.0.1:41000", "FAIRGO_TORCH_PORT": "5000"}, 5000),
            ({"MASTER_PORT": "41000", "FAIRGO_STORE_ADDR": "10.0.0.1:7000"}, 41000),
            ({}, 29500),
        ]
        for env, want in cases:
            with self.subTest(env=env):
                self.assertEqual(fairgo_torch.torch_master_port(env), want)


class TestHeader(unittest.TestCase):
    """The Python constants, prototypes and structs follow fairgo.h."""

    @classmethod
    def setUpClass(cls):
        cls.text = HEADER.read_text()

    def test_enums(self):
        enums = {m[0]: int(m[1]) for m in re.findall(r"^\s*(FAIRGO_[A-Z0-9_]+)\s*=\s*(\d+)", self.text, re.M)}
        for name, value in enums.items():
            attr = name[len("FAIRGO_"):]
            with self.subTest(name=name):
                self.assertEqual(getattr(_lib, attr), value)
        results = {v: k for k, v in enums.items() if k == "FAIRGO_OK" or k == "FAIRGO_NOT_READY" or k.startswith("FAIRGO_ERR_")}
        self.assertEqual(_lib.RESULT_NAMES, results)
        self.assertEqual(set(_lib.ERRORS), set(results) - {_lib.OK, _lib.NOT_READY})
        self.assertEqual(_lib.ABI_VERSION, int(re.search(r"#define FAIRGO_ABI_VERSION (\d+)", self.text)[1]))

    def test_algorithm_names(self):
        """_lib.ALGORITHMS, the names init() translates, are fairgo.h's
        enumerators (whose numbers are hier.Algorithm's, a Go test checks)."""
        enums = {m[0]: int(m[1]) for m in re.findall(r"^\s*FAIRGO_ALGORITHM_([A-Z0-9_]+)\s*=\s*(\d+)", self.text, re.M)}
        self.assertEqual(_lib.ALGORITHMS, {name.lower().replace("_", "-"): v for name, v in enums.items()})

    def test_functions(self):
        declared = set(re.findall(r"^(?:int|void|const char\*)\s+(fairgo_[a-z_]+)\(", self.text, re.M))
        self.assertEqual(declared, set(_lib.PROTOTYPES))
        for name, (_, argtypes) in _lib.PROTOTYPES.items():
            decl = re.search(r"^(?:int|void|const char\*)\s+" + name + r"\(([^)]*)\);", self.text, re.M | re.S)[1]
            params = [p for p in decl.split(",") if p.strip() not in ("", "void")]
            with self.subTest(name=name):
                self.assertEqual(len(params), len(argtypes), decl)

    def test_structs(self):
        for cname, cls in [("fairgo_config", _lib.Config), ("fairgo_comm_info", _lib.CommInfo)]:
            body = re.search(r"typedef struct " + cname + r" \{(.*?)\}", self.text, re.S)[1]
            fields = re.findall(r"^\s*(u?int(?:32|64)_t)\s+([a-z_]+);", body, re.M)
            with self.subTest(struct=cname):
                self.assertEqual([f for _, f in fields], [f for f, _ in cls._fields_])
                sizes = {"int32_t": 4, "uint32_t": 4, "int64_t": 8}
                for (ctype, name), (_, pytype) in zip(fields, cls._fields_):
                    self.assertEqual(ctypes.sizeof(pytype), sizes[ctype], name)
        self.assertEqual(ctypes.sizeof(_lib.Config), 48)


class TestLookup(unittest.TestCase):
    def test_env_file(self):
        with mock.patch.dict(os.environ, {"FAIRGO_LIB": "/nonexistent/libfairgo.so"}):
            self.assertEqual(_lib.candidate_paths(), [Path("/nonexistent/libfairgo.so")])
            with self.assertRaises(_lib.LibraryError) as cm:
                _lib.load(_lib.candidate_paths())
        msg = str(cm.exception)
        self.assertIn("/nonexistent/libfairgo.so (no such file)", msg)
        self.assertIn("$FAIRGO_LIB", msg)
        self.assertIn("make libfairgo", msg)
        self.assertIsNone(cm.exception.code)

    def test_env_directory(self):
        with mock.patch.dict(os.environ, {"FAIRGO_LIB": str(REPO)}):
            self.assertEqual(_lib.candidate_paths(), [REPO / "libfairgo.so"])

    def test_default_paths(self):
        env = {k: v for k, v in os.environ.items() if k != "FAIRGO_LIB"}
        with mock.patch.dict(os.environ, env, clear=True):
            paths = _lib.candidate_paths()
        pkg = Path(fairgo_torch.__file__).resolve().parent
        self.assertEqual(paths, [pkg / "libfairgo.so", pkg.parent / "libfairgo.so", REPO / "lib" / "libfairgo.so"])

    def test_every_path_named(self):
        paths = [Path("/a/libfairgo.so"), Path("/b/libfairgo.so")]
        with self.assertRaises(_lib.LibraryError) as cm:
            _lib.load(paths)
        for p in paths:
            self.assertIn(str(p), str(cm.exception))

    def test_not_a_library(self):
        with self.assertRaises(_lib.LibraryError) as cm:
            _lib.Library(HEADER)
        self.assertIn("cannot load", str(cm.exception))

    def test_needed_libraries(self):
        self.assertIsNone(_lib.needed_libraries(HEADER))
        self.assertIsNone(_lib.needed_libraries(Path("/nonexistent")))
        needed = _lib.needed_libraries(Path(sys.executable).resolve())
        self.assertTrue(needed is None or isinstance(needed, list))
        gpu = REPO / "lib" / "libfairgo.so"
        if gpu.is_file():  # the GPU build loads the driver itself, at run time
            self.assertNotIn("libcuda.so.1", _lib.needed_libraries(gpu))
        sim = sim_library_path()
        if sim is not None:
            self.assertNotIn("libcuda.so.1", _lib.needed_libraries(sim))


class TestNoDevice(unittest.TestCase):
    """The GPU build loads on a host without a GPU, and init raises
    NoDeviceError naming the driver library it looked for (in a process of
    its own: one Go runtime per process)."""

    def test_no_gpu(self):
        gpu = REPO / "lib" / "libfairgo.so"
        if not gpu.is_file():
            self.skipTest("lib/libfairgo.so not built (make libfairgo)")
        code = (
            "import fairgo_torch\n"
            "from pathlib import Path\n"
            f"lib = fairgo_torch.load([Path({str(gpu)!r})])\n"
            "print('loaded')\n"
            "try:\n"
            "    fairgo_torch.init_rank(0, 1, 0, 1, None, device=-1, lib=lib).close()\n"
            "    print('gpu')\n"
            "except fairgo_torch.NoDeviceError as e:\n"
            "    print('no device:', e)\n"
        )
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("loaded", out.stdout)
        if "gpu" in out.stdout.split():
            self.skipTest("this host has a GPU")
        self.assertIn("no device:", out.stdout)
        self.assertIn("libcuda.so.1", out.stdout)
        self.assertIn("FAIRGO_ERR_NO_DEVICE", out.stdout)

    def test_missing_driver_named(self):
        gpu = REPO / "lib" / "libfairgo.so"
        if not gpu.is_file():
            self.skipTest("lib/libfairgo.so not built (make libfairgo)")
        code = (
            "import fairgo_torch, os\n"
            "from pathlib import Path\n"
            f"lib = fairgo_torch.load([Path({str(gpu)!r})])\n"
            "os.environ['FAIRGO_CUDA_LIBRARY'] = '/nonexistent/libcuda.so.1'\n"  # set after loading: still seen
            "try:\n"
            "    fairgo_torch.init_rank(0, 1, 0, 1, None, device=-1, lib=lib)\n"
            "except fairgo_torch.NoDeviceError as e:\n"
            "    print('no device:', e)\n"
        )
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("no device:", out.stdout)
        self.assertIn("/nonexistent/libcuda.so.1", out.stdout)


class TestSimLibrary(unittest.TestCase):
    """The C ABI through ctypes, on libfairgo_sim.so (a world of one rank)."""

    @classmethod
    def setUpClass(cls):
        path = sim_library_path()
        if path is None:
            raise unittest.SkipTest("lib/libfairgo_sim.so not built (make libfairgo-sim)")
        cls.lib = _lib.load([path])

    def comm(self, **kw):
        c = fairgo_torch.init_rank(0, 1, 0, 1, None, device=-1, lib=self.lib, **kw)
        self.addCleanup(lambda: c.close() if c._handle else None)
        return c

    def test_version_and_names(self):
        self.assertEqual(self.lib.dll.fairgo_abi_version(), _lib.ABI_VERSION)
        # One version for the library and the package (a Go test ties both to fairgo.Version).
        self.assertEqual(self.lib.dll.fairgo_version().decode(), fairgo_torch.__version__)
        for code, name in _lib.RESULT_NAMES.items():
            self.assertEqual(self.lib.dll.fairgo_result_string(code).decode(), name)
        self.assertEqual(self.lib.dll.fairgo_result_string(12345).decode(), "FAIRGO_UNKNOWN_RESULT")
        with mock.patch.dict(os.environ, {v: "" for v in fairgo_torch.SETTINGS.values()}):
            cfg = self.lib.config()
        self.assertEqual((cfg.struct_size, cfg.device, cfg.init_timeout_ms, cfg.op_timeout_ms, cfg.algorithm), (48, -1, 300000, 0, 0))

    def test_comm(self):
        c = self.comm()
        self.assertEqual((c.rank, c.world_size, c.machines, c.devices_per_machine, c.machine, c.local), (0, 1, 1, 1, 0, 0))
        self.assertIn("rank 0 of 1", repr(c))
        # Zero elements: a valid call that enqueues nothing.
        w = c.allreduce(0, 0, _lib.FLOAT32, "avg", 0)
        w.wait(5.0)  # nothing to reduce, but it still follows the caller's stream
        self.assertTrue(w.test())
        w.free()
        w.free()  # the Python object forgets its handle: no second C free
        self.assertIsNone(c.allreduce(0, 0, _lib.BFLOAT16, "sum", 0, track=True))
        c.synchronize(5.0)
        c.close()
        with self.assertRaises(fairgo_torch.BadHandleError):
            c.allreduce(0, 0, _lib.FLOAT32, "sum", 0)
        c.close()  # idempotent in Python

    def test_tracked_works_freed_in_batches(self):
        # A tracked call frees the completed works only once _REAP_AT are
        # kept: a library call per work, not a few per call.
        c = self.comm()
        kept = []
        for _ in range(3 * _comm._REAP_AT):
            self.assertIsNone(c.allreduce(0, 0, _lib.FLOAT32, "avg", 0, track=True))
            kept.append(len(c._pending))
            c._pending[-1].wait(5.0)  # complete: the call that finds _REAP_AT kept frees them all
        self.assertEqual(kept, list(range(1, _comm._REAP_AT + 1)) * 3)
        c.synchronize(5.0)
        self.assertEqual(len(c._pending), 0)
        c.close()

    def test_algorithm_for(self):
        # One rank: every size is one flat call, by rule (nothing to measure).
        c = self.comm()
        for nbytes in (0, 1000, 64 << 20):
            self.assertEqual(c.algorithm_for(nbytes), ("flat", True), nbytes)
        with self.assertRaises(fairgo_torch.InvalidArgumentError) as cm:
            c.algorithm_for(-1)
        self.assertIn("bytes", str(cm.exception))
        c.close()
        with self.assertRaises(fairgo_torch.BadHandleError):
            c.algorithm_for(1000)

    def test_errors(self):
        c = self.comm()
        cases = [
            (lambda: c.allreduce(0, 0, 99, "sum", 0), fairgo_torch.InvalidArgumentError, "dtype"),
            (lambda: c.allreduce(0, -1, _lib.FLOAT32, "sum", 0), fairgo_torch.InvalidArgumentError, "count"),
            (lambda: c.allreduce(0, 10, _lib.FLOAT32, "sum", 0), fairgo_torch.InvalidArgumentError, "ptr"),
            (lambda: c.allreduce(0, 0, _lib.FLOAT32, "sum", 0x1234), fairgo_torch.InvalidArgumentError, "stream"),
            (lambda: fairgo_torch.init_rank(2, 2, 0, 1, None, device=-1, lib=self.lib), fairgo_torch.InvalidArgumentError, "Rank"),
            (lambda: fairgo_torch.init_rank(1, 2, 0, 1, None, device=-1, lib=self.lib), fairgo_torch.InvalidArgumentError, "store"),
            (lambda: fairgo_torch.init_rank(0, 1, 0, 1, None, device=-1, init_timeout=-1, lib=self.lib), fairgo_torch.InvalidArgumentError, "init_timeout"),
            (lambda: c.allreduce(0, 0, _lib.FLOAT32, 99, 0), fairgo_torch.InvalidArgumentError, "op"),
        ]
        for fn, exc, text in cases:
            with self.subTest(text=text), self.assertRaises(exc) as cm:
                fn()
            self.assertIn(text, str(cm.exception))
            self.assertEqual(cm.exception.code, _lib.ERR_INVALID_ARGUMENT)
            self.assertIn("FAIRGO_ERR_INVALID_ARGUMENT", str(cm.exception))

    def test_settings_judged_by_library(self):
        """Keyword values pass through to the C ABI untouched; fairgo_init_rank
        rejects the invalid ones with an error naming the fairgo_config_t
        field (hier's rules for the settings that are hier options)."""
        cases = [
            (dict(slice_bytes=-1), "config slice_bytes -1"),
            (dict(flat_threshold_bytes=-2), "config flat_threshold_bytes -2"),
            (dict(algorithm=99), "config algorithm 99"),
            (dict(timeout=-1.5), "config op_timeout_ms -1500"),
            (dict(timeout=-0.0001), "config op_timeout_ms -1"),  # stays negative: not 0, off
            (dict(init_timeout=-2), "config init_timeout_ms -2000"),
            (dict(device=-2), "config device -2"),
        ]
        clean = {v: "" for v in fairgo_torch.SETTINGS.values()}
        for kw, text in cases:
            with self.subTest(kw=kw), mock.patch.dict(os.environ, clean):
                kw.setdefault("device", -1)
                cfg = _comm._config(self.lib, **kw)  # translation only: no error yet
                with self.assertRaises(fairgo_torch.InvalidArgumentError) as cm:
                    fairgo_torch.init_rank(0, 1, 0, 1, None, lib=self.lib, **kw)
                self.assertIn(text, str(cm.exception))
                self.assertEqual(cm.exception.code, _lib.ERR_INVALID_ARGUMENT)
                self.assertNotIn("With", str(cm.exception))  # the C field, not hier's option
                field = text.split()[1]
                value = int(text.split()[2])
                self.assertEqual(getattr(cfg, field), value)

    def test_raw_abi(self):
        dll = self.lib.dll
        h = ctypes.c_int64(0)
        # NULL out-pointers and a config of another size.
        self.assertEqual(dll.fairgo_init_rank(0, 1, 0, 1, None, None, None), _lib.ERR_INVALID_ARGUMENT)
        self.assertIn("comm", self.lib.last_error())
        cfg = self.lib.config()
        cfg.struct_size = 8
        self.assertEqual(dll.fairgo_init_rank(0, 1, 0, 1, None, ctypes.byref(cfg), ctypes.byref(h)), _lib.ERR_INVALID_ARGUMENT)
        self.assertIn("struct_size", self.lib.last_error())
        # A NULL config means the defaults.
        self.assertEqual(dll.fairgo_init_rank(0, 1, 0, 1, None, None, ctypes.byref(h)), _lib.OK)
        comm = h.value
        self.assertGreater(comm, 0)
        work = ctypes.c_int64(0)
        self.assertEqual(dll.fairgo_allreduce(comm, None, 0, _lib.FLOAT32, _lib.SUM, None, None), _lib.ERR_INVALID_ARGUMENT)
        self.assertEqual(dll.fairgo_allreduce(comm, None, 0, _lib.FLOAT32, _lib.SUM, None, ctypes.byref(work)), _lib.OK)
        done = ctypes.c_int(-1)
        self.assertEqual(dll.fairgo_work_wait(work, 5000), _lib.OK)
        self.assertEqual(dll.fairgo_work_test(work, ctypes.byref(done)), _lib.OK)
        self.assertEqual(done.value, 1)
        self.assertEqual(dll.fairgo_work_test(work, None), _lib.ERR_INVALID_ARGUMENT)
        self.assertEqual(dll.fairgo_work_wait(work, -1), _lib.ERR_INVALID_ARGUMENT)
        self.assertEqual(dll.fairgo_work_wait(work, 0), _lib.OK)
        self.assertEqual(dll.fairgo_work_free(work), _lib.OK)
        self.assertEqual(dll.fairgo_work_free(work), _lib.ERR_BAD_HANDLE)
        self.assertIn(f"work handle {work.value}", self.lib.last_error())
        self.assertEqual(dll.fairgo_work_wait(comm, 0), _lib.ERR_BAD_HANDLE)  # a comm is not a work
        self.assertEqual(dll.fairgo_comm_info(comm, None), _lib.ERR_INVALID_ARGUMENT)
        self.assertEqual(dll.fairgo_comm_close(comm), _lib.OK)
        self.assertEqual(dll.fairgo_comm_close(comm), _lib.ERR_BAD_HANDLE)
        self.assertEqual(dll.fairgo_comm_close(0), _lib.ERR_BAD_HANDLE)

    def test_last_error_per_thread(self):
        dll = self.lib.dll
        texts = {}
        barrier = threading.Barrier(2)

        def run(name, handle):
            self.assertEqual(dll.fairgo_work_free(handle), _lib.ERR_BAD_HANDLE)
            barrier.wait()  # both failed before either reads
            texts[name] = self.lib.last_error()

        threads = [threading.Thread(target=run, args=("a", 111111)), threading.Thread(target=run, args=("b", 222222))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertIn("111111", texts["a"])
        self.assertNotIn("222222", texts["a"])
        self.assertIn("222222", texts["b"])
        # A success leaves the thread's text alone.
        dll.fairgo_work_free(333333)
        self.assertEqual(dll.fairgo_abi_version(), _lib.ABI_VERSION)
        self.assertIn("333333", self.lib.last_error())

    def test_store(self):
        s = fairgo_torch.serve_store("127.0.0.1:0", self.lib)
        self.assertRegex(s.address, r"^127\.0\.0\.1:\d+$")
        self.assertGreater(s.port, 0)
        s.close()
        s.close()
        h = ctypes.c_int64(0)
        small = ctypes.create_string_buffer(4)
        self.assertEqual(self.lib.dll.fairgo_store_serve(b"127.0.0.1:0", ctypes.byref(h), small, 4), _lib.ERR_INVALID_ARGUMENT)
        self.assertIn("addr_len", self.lib.last_error())
        with self.assertRaises(fairgo_torch.FairgoError) as cm:
            fairgo_torch.serve_store("not an address", self.lib)
        self.assertIn("not an address", str(cm.exception))
        self.assertEqual(self.lib.dll.fairgo_store_close(987654), _lib.ERR_BAD_HANDLE)

    def test_torch_free_paths(self):
        # init() without torch.distributed and without a launch environment.
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "FAIRGO_STORE_ADDR", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")}
        with mock.patch.dict(os.environ, env, clear=True), self.assertRaises(fairgo_torch.InvalidArgumentError) as cm:
            _comm.init_env(device=-1, lib=self.lib)
        self.assertIn("no launch environment", str(cm.exception))
        with self.assertRaises(fairgo_torch.BadHandleError):
            fairgo_torch.shutdown()
            fairgo_torch.default_comm()


class TestSettings(unittest.TestCase):
    """Settings from the environment and from keyword arguments, on the
    simulated library."""

    @classmethod
    def setUpClass(cls):
        path = sim_library_path()
        if path is None:
            raise unittest.SkipTest("lib/libfairgo_sim.so not built (make libfairgo-sim)")
        cls.lib = _lib.load([path])

    def config(self, env, **kw):
        clean = {v: "" for v in fairgo_torch.SETTINGS.values()}
        clean.update(env)
        with mock.patch.dict(os.environ, clean):
            return _comm._config(self.lib, **kw)

    def test_environment_then_keywords(self):
        env = {"FAIRGO_ALGORITHM": "rail-rsag", "FAIRGO_SLICE_BYTES": "2M", "FAIRGO_FLAT_THRESHOLD_BYTES": "-1",
               "FAIRGO_TIMEOUT": "90s", "FAIRGO_INIT_TIMEOUT": "12.5", "FAIRGO_DEVICE": "3"}
        cfg = self.config(env)
        self.assertEqual((cfg.algorithm, cfg.slice_bytes, cfg.flat_threshold_bytes, cfg.op_timeout_ms, cfg.init_timeout_ms, cfg.device),
                         (_lib.ALGORITHM_RAIL_RSAG, 2 << 20, -1, 90000, 12500, 3))
        cfg = self.config(env, algorithm="flat", slice_bytes=4096, flat_threshold_bytes=0, timeout=0, init_timeout=1, device=-1)
        self.assertEqual((cfg.algorithm, cfg.slice_bytes, cfg.flat_threshold_bytes, cfg.op_timeout_ms, cfg.init_timeout_ms, cfg.device),
                         (_lib.ALGORITHM_FLAT, 4096, 0, 0, 1000, -1))

    def test_defaults(self):
        cfg = self.config({})
        self.assertEqual((cfg.algorithm, cfg.slice_bytes, cfg.flat_threshold_bytes, cfg.op_timeout_ms, cfg.init_timeout_ms),
                         (_lib.ALGORITHM_AUTO, 0, 0, 600000, 300000))  # fairgo_torch arms a 600 s watchdog

    def test_former_names(self):
        self.assertEqual(self.config({}, op_timeout=None).op_timeout_ms, 0)  # op_timeout=None meant off
        self.assertEqual(self.config({}, op_timeout=5).op_timeout_ms, 5000)
        self.assertEqual(self.config({}, flat_threshold=-1).flat_threshold_bytes, -1)
        for kw in [dict(op_timeout=1, timeout=2), dict(flat_threshold=1, flat_threshold_bytes=2)]:
            with self.subTest(kw=kw), self.assertRaises(fairgo_torch.InvalidArgumentError):
                self.config({}, **kw)

    def test_bad_values(self):
        for var, value in [("FAIRGO_ALGORITHM", "ring"), ("FAIRGO_SLICE_BYTES", "lots"), ("FAIRGO_TIMEOUT", "-1"), ("FAIRGO_DEVICE", "x"),
                           ("FAIRGO_SLICE_BYTES", "-1"), ("FAIRGO_FLAT_THRESHOLD_BYTES", "-2"), ("FAIRGO_INIT_TIMEOUT", "-5"),
                           ("FAIRGO_DEVICE", "-2")]:
            with self.subTest(var=var), self.assertRaises(fairgo_torch.InvalidArgumentError) as cm:
                self.config({var: value})
            self.assertIn(var, str(cm.exception))
        with self.assertRaises(fairgo_torch.InvalidArgumentError) as cm:
            self.config({}, algorithm="ring")
        self.assertIn("rail-rsag", str(cm.exception))

    def test_keys_agree(self):
        """init()'s keywords, SETTINGS and fairgo.h's table are the same keys."""
        import inspect

        params = inspect.signature(fairgo_torch.init).parameters
        self.assertEqual(set(fairgo_torch.SETTINGS), {p for p in params if p not in ("op_timeout", "flat_threshold")})
        rows = re.findall(r"^ \*   (FAIRGO_[A-Z_]+) +([a-z_]+) +([a-z_]+)$", HEADER.read_text(), re.M)
        self.assertEqual({env: kw for env, kw, _ in rows}, {v: k for k, v in fairgo_torch.SETTINGS.items()})
        for _, _, field in rows:
            self.assertIn(field, [f for f, _ in _lib.Config._fields_])


class FakeFuture:
    """torch.futures.Future as the comm hook uses it."""

    def __init__(self, devices=None):
        self.devices = devices
        self._done = False
        self._value = self._error = None

    def set_result(self, value):
        assert not self._done, "a future completed twice"
        self._done, self._value = True, value

    def set_exception(self, error):
        assert not self._done, "a future completed twice"
        self._done, self._error = True, error

    def done(self):
        return self._done

    def value(self):
        if self._error is not None:
            raise self._error
        return self._value


class FakeTensor:
    """A float32 CUDA tensor as the comm hook reads a bucket's buffer."""

    dtype = FakeDType("torch.float32")

    def __init__(self, ptr, count, device):
        self.ptr, self.count, self.index = ptr, count, device
        self.device = f"cuda:{device}"

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.count

    def is_contiguous(self):
        return True

    def get_device(self):
        return self.index


class FakeBucket:
    """torch.distributed.GradBucket as the comm hook reads it."""

    def __init__(self, tensor, last):
        self._t, self._last = tensor, last

    def buffer(self):
        return self._t

    def is_last(self):
        return self._last


def fake_torch():
    """sys.modules with a torch of what the comm hook touches: its futures
    and the current stream (0, the simulated library's one stream)."""
    torch = type(sys)("torch")
    torch.futures = type(sys)("torch.futures")
    torch.futures.Future = FakeFuture
    torch._C = type(sys)("torch._C")
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    _comm._DTYPE_OF[FakeTensor.dtype] = _lib.FLOAT32
    fairgo_torch._raw_stream = None
    return mock.patch.dict(sys.modules, {"torch": torch})


class TestSimJob(unittest.TestCase):
    """Several ranks of a simulated job in this process (one thread each),
    meeting through a store the library serves; device memory comes from the
    simulated library's test hooks (fairgo_sim_alloc/upload/download)."""

    @classmethod
    def setUpClass(cls):
        path = sim_library_path()
        if path is None:
            raise unittest.SkipTest("lib/libfairgo_sim.so not built (make libfairgo-sim)")
        cls.lib = _lib.load([path])
        d = cls.lib.dll
        d.fairgo_sim_alloc.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_uint64)]
        d.fairgo_sim_upload.argtypes = [ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int64]
        d.fairgo_sim_download.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64]

    def job(self, n=2, **kw):
        store = fairgo_torch.serve_store("127.0.0.1:0", self.lib)
        self.addCleanup(store.close)
        comms, errors = [None] * n, []

        def run(r):
            try:
                comms[r] = fairgo_torch.init_rank(r, n, r, n, store.address, device=-1, lib=self.lib, **kw)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        for c in comms:
            self.addCleanup(c.close)
        return comms

    def buffer(self, comm, values):
        arr = (ctypes.c_float * len(values))(*values)
        ptr = ctypes.c_uint64(0)
        self.lib.call("fairgo_sim_alloc", comm.handle, ctypes.sizeof(arr), ctypes.byref(ptr))
        self.lib.call("fairgo_sim_upload", comm.handle, ptr.value, arr, ctypes.sizeof(arr))
        return ptr.value

    def read(self, comm, ptr, n):
        arr = (ctypes.c_float * n)()
        self.lib.call("fairgo_sim_download", comm.handle, arr, ptr, ctypes.sizeof(arr))
        return list(arr)

    def test_allreduce_values(self):
        comms = self.job(3)
        self.assertEqual([c.rank for c in comms], [0, 1, 2])
        for op, want in [("sum", [6.0, 12.0, 18.0]), ("avg", [2.0, 4.0, 6.0]), ("max", [3.0, 6.0, 9.0])]:
            ptrs = [self.buffer(c, [1.0 * (r + 1), 2.0 * (r + 1), 3.0 * (r + 1)]) for r, c in enumerate(comms)]
            works = [c.allreduce(p, 3, _lib.FLOAT32, op, 0) for c, p in zip(comms, ptrs)]
            for w in works:
                w.wait(10)
                w.free()
            for c, p in zip(comms, ptrs):
                with self.subTest(op=op, rank=c.rank):
                    self.assertEqual(self.read(c, p, 3), want)

    def test_hook_buckets(self):
        """allreduce_hook over a backward pass of three buckets on two ranks:
        the first two are reduced without their futures completing or the
        stream waiting; the last completes every future with its own
        buffer, and the buffers hold the averages."""
        comms = self.job(2)
        n, seen, errors = 16, [None] * 2, []

        def backward(r):
            try:
                c = comms[r]
                ptrs = [self.buffer(c, [float((r + 1) * (i + 1))] * n) for i in range(3)]
                tensors = [FakeTensor(p, n, c.device) for p in ptrs]
                futs = [fairgo_torch.allreduce_hook(c, FakeBucket(t, last=False)) for t in tensors[:2]]
                before = ([f.done() for f in futs], len(c._hook_pending), len(c._pending))
                futs.append(fairgo_torch.allreduce_hook(c, FakeBucket(tensors[2], last=True)))
                after = ([f.done() for f in futs], [f.value() is t for f, t in zip(futs, tensors)],
                         [f.devices for f in futs], len(c._hook_pending), len(c._pending))
                c.synchronize(20)
                seen[r] = (before, after, [self.read(c, p, n) for p in ptrs])
            except Exception as e:  # reported below
                errors.append(e)

        waits = []
        stream_wait = _comm.Work.stream_wait

        def recorded(work, stream=0):
            waits.append(stream)
            stream_wait(work, stream)

        with fake_torch(), mock.patch.object(_comm.Work, "stream_wait", recorded):
            threads = [threading.Thread(target=backward, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(waits, [0] * 4, "the current stream waits for each rank's two earlier buckets")
        for r, (before, after, values) in enumerate(seen):
            with self.subTest(rank=r):
                self.assertEqual(before, ([False, False], 2, 0), "before the last bucket: pending, untracked")
                dev = [f"cuda:{comms[r].device}"]
                self.assertEqual(after, ([True] * 3, [True] * 3, [dev] * 3, 0, 3), "after it: complete, tracked")
                self.assertEqual(values, [[1.5 * (i + 1)] * n for i in range(3)])

    def test_hook_failed_stream_wait(self):
        """An earlier bucket whose stream wait fails gets the error in its
        future, and the last bucket's hook raises it after completing every
        future: nothing is left pending."""
        (c,) = self.job(1)
        ptrs = [self.buffer(c, [1.0] * 4) for _ in range(3)]
        with fake_torch():
            f0 = fairgo_torch.allreduce_hook(c, FakeBucket(FakeTensor(ptrs[0], 4, c.device), last=False))
            f1 = fairgo_torch.allreduce_hook(c, FakeBucket(FakeTensor(ptrs[1], 4, c.device), last=False))
            c._hook_pending[0][0].free()  # its handle gone: the stream wait fails
            with self.assertRaises(fairgo_torch.BadHandleError):
                fairgo_torch.allreduce_hook(c, FakeBucket(FakeTensor(ptrs[2], 4, c.device), last=True))
        self.assertTrue(f0.done() and f1.done())
        with self.assertRaises(fairgo_torch.BadHandleError):
            f0.value()
        self.assertEqual(f1.value().ptr, ptrs[1])
        self.assertEqual(c._hook_pending, [])
        c.synchronize(10)

    def test_register_hook(self):
        """register_hook: the C++ hook where its extension builds (given the
        library's functions and fairgo.h's numbers), else the Python one
        (auto warns; cpp raises); a bad choice is refused."""
        (c,) = self.job(1)

        class DDP:
            reducer = object()

            def __init__(self):
                self.hooks = []
                self.logger = type("Logger", (), {"_set_comm_hook_name": lambda _, n: self.hooks.append(("name", n))})()

            def register_comm_hook(self, state, hook):
                self.hooks.append((state, hook))

        class Extension:
            def __init__(self):
                self.calls = []

            def register(self, *args):
                self.calls.append(args)

        def build_fails():
            raise RuntimeError("no compiler")

        ext = Extension()
        for impl, builds, want, env in [("cpp", True, "cpp", ""), (None, True, "cpp", ""), ("auto", False, "python", ""),
                                        (None, False, "python", "python"), ("python", True, "python", "cpp")]:
            with self.subTest(impl=impl, builds=builds, env=env), \
                    mock.patch.dict(os.environ, {"FAIRGO_TORCH_HOOK": env}), \
                    mock.patch.object(fairgo_torch, "_hook_extension", (lambda: ext) if builds else build_fails), \
                    warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always")
                ddp, before = DDP(), len(ext.calls)
                self.assertEqual(fairgo_torch.register_hook(ddp, c, impl=impl), want)
                if want == "cpp":
                    reducer, handle, functions, numbers = ext.calls[-1]
                    self.assertIs(reducer, DDP.reducer)
                    self.assertEqual(handle, c.handle)
                    self.assertEqual(len(functions), 6)
                    self.assertTrue(all(isinstance(f, int) and f > 0 for f in functions))
                    self.assertEqual(numbers, [_lib.AVG, _lib.FLOAT16, _lib.BFLOAT16, _lib.FLOAT32, _lib.FLOAT64])
                    self.assertEqual(ddp.hooks, [("name", "fairgo_torch.allreduce_hook (C++)")])
                else:
                    self.assertEqual(len(ext.calls), before)
                    self.assertEqual(ddp.hooks, [(c, fairgo_torch.allreduce_hook)])
                self.assertEqual(len(warned), 1 if (want == "python" and impl != "python" and env != "python") else 0)
        with mock.patch.object(fairgo_torch, "_hook_extension", build_fails), self.assertRaises(fairgo_torch.LibraryError) as cm:
            fairgo_torch.register_hook(DDP(), c, impl="cpp")
        self.assertIn("no compiler", str(cm.exception))
        with self.assertRaises(fairgo_torch.InvalidArgumentError):
            fairgo_torch.register_hook(DDP(), c, impl="cuda")
        # The functions' addresses are the library's own.
        self.assertEqual(fairgo_torch._hook_functions(c._lib)[1],
                         ctypes.cast(c._lib.dll.fairgo_allreduce_async, ctypes.c_void_p).value)

    def test_not_ready_then_done(self):
        a, b = self.job()
        pa, pb = self.buffer(a, [1.0] * 64), self.buffer(b, [2.0] * 64)
        w = a.allreduce(pa, 64, _lib.FLOAT32, "sum", 0)  # rank 1 has not called yet
        self.assertIsNone(a.allreduce(pa, 64, _lib.FLOAT32, "sum", 0, track=True))
        self.assertFalse(w.test())
        with self.assertRaises(fairgo_torch.NotReadyError):
            w.wait(0.05)
        with self.assertRaises(fairgo_torch.NotReadyError):
            a.synchronize(0.05)
        self.assertEqual(len(a._pending), 1, "a pending work stays tracked")
        wb = b.allreduce(pb, 64, _lib.FLOAT32, "sum", 0)
        b.allreduce(pb, 64, _lib.FLOAT32, "sum", 0, track=True)
        w.wait(10)
        wb.wait(10)
        a.synchronize(10)
        b.synchronize(10)
        self.assertEqual(len(a._pending), 0)
        self.assertEqual(self.read(a, pa, 2), [6.0, 6.0])  # (1 + 2), twice summed: 3 + 3

    def test_mismatch(self):
        a, b = self.job()
        pa, pb = self.buffer(a, [1.0] * 8), self.buffer(b, [1.0] * 8)
        # Raised by the call when the work failed before it returned (the
        # second rank's may), else by the wait.
        calls = [self.call(a, pa, "sum"), self.call(b, pb, "max")]
        for w, err in calls:
            if err is None:
                with self.assertRaises(fairgo_torch.MismatchError) as cm:
                    w.wait(20)
                err = cm.exception
            self.assertIsInstance(err, fairgo_torch.MismatchError)
            self.assertIn("mismatch", str(err))
            self.assertEqual(err.code, _lib.ERR_MISMATCH)

    def test_refused_on_one_rank(self):
        """A call one rank refuses (the library's judgement or this
        package's) fails on its peer at once with a MismatchError naming the
        rank, the call and, through the job's store, the reason."""
        for name, refuse, reason in [
            ("unknown dtype", lambda c, p: c.allreduce(p, 8, 99, "sum", 0), "unknown element type"),
            ("unknown op number", lambda c, p: c.allreduce(p, 8, _lib.FLOAT32, 99, 0), "unknown reduction operator"),
            ("unknown op name", lambda c, p: c.allreduce(p, 8, _lib.FLOAT32, "median", 0), "unknown reduction operator"),
            ("unknown stream", lambda c, p: c.allreduce(p, 8, _lib.FLOAT32, "sum", 0x1234), "stream 0x1234"),
        ]:
            with self.subTest(name):
                a, b = self.job()
                pa, pb = self.buffer(a, [1.0] * 8), self.buffer(b, [1.0] * 8)
                start = time.monotonic()
                w, err = self.call(a, pa, "sum")
                with self.assertRaises(fairgo_torch.InvalidArgumentError) as cm:
                    refuse(b, pb)
                self.assertEqual(cm.exception.code, _lib.ERR_INVALID_ARGUMENT)
                if err is None:
                    with self.assertRaises(fairgo_torch.MismatchError) as mm:
                        w.wait(20)
                    err = mm.exception
                self.assertIsInstance(err, fairgo_torch.MismatchError)
                self.assertIn("rank 1 refused call 1 (allreduce of 8", str(err))
                self.assertIn(reason, str(err))
                self.assertLess(time.monotonic() - start, 10)
                a.close()
                b.close()

    def test_close_after_calls_every_rank_refused(self):
        """Calls every rank refused leave Close nothing to wait for."""
        slowest = 0.0
        for _ in range(8):
            comms = self.job()
            for c in comms:
                with self.assertRaises(fairgo_torch.InvalidArgumentError):
                    c.allreduce(self.buffer(c, [1.0] * 4), 4, 99, "sum", 0)
            start = time.monotonic()
            threads = [threading.Thread(target=c.close) for c in comms]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            slowest = max(slowest, time.monotonic() - start)
        self.assertLess(slowest, 1.0)

    def call(self, comm, ptr, op, **kw):
        try:
            return comm.allreduce(ptr, 8, _lib.FLOAT32, op, 0, **kw), None
        except fairgo_torch.FairgoError as e:
            return None, e

    def test_tracked_error_raised_later(self):
        a, b = self.job()
        pa, pb = self.buffer(a, [1.0] * 8), self.buffer(b, [1.0] * 8)
        _, err_a = self.call(a, pa, "sum", track=True)
        _, err_b = self.call(b, pb, "min", track=True)
        self.assertIsNone(err_a)
        if err_b is None:  # b's call returned before the failure: a later call raises it
            with self.assertRaises(fairgo_torch.MismatchError):
                b.synchronize(20)
        # a's first call fails once the check sees the mismatch; how soon
        # depends on the host's load, so a later call is retried until a
        # deadline rather than a fixed number of times.
        deadline = time.monotonic() + 20
        with self.assertRaises(fairgo_torch.FairgoError):  # the failure, or the aborted communicator
            while time.monotonic() < deadline:
                a.allreduce(pa, 8, _lib.FLOAT32, "sum", 0, track=True)
                time.sleep(0.01)

    def test_watchdog_timeout(self):
        a, b = self.job(op_timeout=0.3)
        pa = self.buffer(a, [1.0] * 8)
        w = a.allreduce(pa, 8, _lib.FLOAT32, "sum", 0)  # rank 1 never calls
        with self.assertRaises(fairgo_torch.FairgoTimeoutError) as cm:
            w.wait(20)
        self.assertEqual(cm.exception.code, _lib.ERR_TIMEOUT)
        with self.assertRaises(fairgo_torch.ClosedError) as cm:  # the communicators are aborted
            a.allreduce(pa, 8, _lib.FLOAT32, "sum", 0)
        self.assertIn("timed out", str(cm.exception))
        del b

    def test_close_with_work_pending(self):
        a, b = self.job()
        pa = self.buffer(a, [1.0] * 8)
        w = a.allreduce(pa, 8, _lib.FLOAT32, "sum", 0)
        try:
            a.close()
        except fairgo_torch.FairgoError:
            pass  # the close may report the abort of the pending work
        with self.assertRaises(fairgo_torch.ClosedError):
            w.wait(20)
        w.free()
        with self.assertRaises(fairgo_torch.BadHandleError):
            a.allreduce(pa, 8, _lib.FLOAT32, "sum", 0)
        del b


if __name__ == "__main__":
    unittest.main()
