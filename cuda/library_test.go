package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/rendezvous"
)

// The exported names of the driver functions, as the CUDA 11.8 header maps
// the plain names (cuMemAlloc is cuMemAlloc_v2, ...).
var wantSymbols = []string{
	"cuInit", "cuDriverGetVersion", "cuGetErrorName", "cuGetErrorString", "cuDeviceGetCount", "cuDeviceGet",
	"cuDeviceGetName", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
	"cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxSynchronize", "cuCtxGetStreamPriorityRange",
	"cuCtxCreate_v2", "cuCtxDestroy_v2", "cuCtxPopCurrent_v2",
	"cuStreamCreateWithPriority", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamWaitEvent", "cuStreamGetCtx",
	"cuEventCreate", "cuEventDestroy_v2", "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuEventElapsedTime",
	"cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemGetInfo_v2",
	"cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemsetD8_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
	"cuMemcpyDtoDAsync_v2", "cuMemcpy2DAsync_v2", "cuPointerGetAttributes",
	"cuModuleLoadDataEx", "cuModuleUnload", "cuModuleGetFunction", "cuModuleGetGlobal_v2", "cuLaunchKernel",
}

func TestSymbolTable(t *testing.T) {
	require.Equal(t, len(wantSymbols), numSyms())
	for i, w := range wantSymbols {
		require.Equal(t, w, symName(sym(i)), "symbol %d", i)
	}
}

// fakeDriver builds a stand-in libcuda exporting every function of the
// table except those in omit: cuDriverGetVersion reports version, cuInit
// returns initResult, and the rest return CUDA_SUCCESS. It skips the test
// without a C compiler.
func fakeDriver(t *testing.T, version, initResult int, omit ...string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build a fake libcuda")
	}
	var src strings.Builder
	src.WriteString(`typedef int R;
static const char* name(R r) {
	return r == 100 ? "CUDA_ERROR_NO_DEVICE" : r == 999 ? "CUDA_ERROR_UNKNOWN" : "CUDA_FAKE";
}
`)
	skip := map[string]bool{}
	for _, o := range omit {
		skip[o] = true
	}
	for i := range numSyms() {
		n := symName(sym(i))
		if skip[n] {
			continue
		}
		switch n {
		case "cuInit":
			fmt.Fprintf(&src, "R cuInit(unsigned f) { (void)f; return %d; }\n", initResult)
		case "cuDriverGetVersion":
			fmt.Fprintf(&src, "R cuDriverGetVersion(int* v) { *v = %d; return 0; }\n", version)
		case "cuGetErrorName":
			src.WriteString("R cuGetErrorName(R r, const char** s) { *s = name(r); return 0; }\n")
		case "cuGetErrorString":
			src.WriteString(
				"R cuGetErrorString(R r, const char** s) { " +
					"*s = r == 100 ? \"no CUDA-capable device is detected\" : \"fake\"; return 0; }\n",
			)
		default:
			fmt.Fprintf(&src, "R %s(void) { return 0; }\n", n)
		}
	}
	if skip["cuMemAlloc_v2"] { // the unversioned function a driver also exports
		src.WriteString("R cuMemAlloc(void) { return 0; }\n")
	}
	dir := t.TempDir()
	c := filepath.Join(dir, "fake.c")
	require.NoError(t, os.WriteFile(c, []byte(src.String()), 0o644))
	out := filepath.Join(dir, "libcuda-fake.so.1")
	b, err := exec.Command(cc, "-shared", "-fPIC", "-o", out, c).CombinedOutput()
	require.NoError(t, err, "building the fake driver:\n%s", b)
	return out
}

// TestLoadFailures: every way the driver can be unusable gives a
// *LoadError naming the path and what failed, and only "not there" and "no
// device" match fairgo.ErrNoDevice.
func TestLoadFailures(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda-missing.so.1")
	cases := []struct {
		name     string
		path     func(t *testing.T) string
		noDevice bool
		check    func(t *testing.T, a LoadAttempt)
		text     []string
	}{
		{"missing file", func(*testing.T) string { return missing }, true, func(t *testing.T, a LoadAttempt) {
			var de *DLError
			require.ErrorAs(t, a.Err, &de)
			require.True(t, de.NotFound)
			require.Empty(t, de.Symbol)
		}, []string{missing, "no GPU or no NVIDIA driver", EnvLibrary}},
		{"not a driver", func(*testing.T) string { return "libc.so.6" }, false, func(t *testing.T, a LoadAttempt) {
			var de *DLError
			require.ErrorAs(t, a.Err, &de)
			require.Equal(t, "cuInit", de.Symbol)
		}, []string{`"libc.so.6"`, "missing symbol cuInit", "cannot use the CUDA driver"}},
		{
			"versioned symbol missing",
			func(t *testing.T) string { return fakeDriver(t, 12020, 0, "cuMemAlloc_v2") },
			false,
			func(t *testing.T, a LoadAttempt) {
				var de *DLError
				require.ErrorAs(t, a.Err, &de)
				require.Equal(t, "cuMemAlloc_v2", de.Symbol)
			},
			[]string{"missing symbol cuMemAlloc_v2"},
		},
		{
			"too old",
			func(t *testing.T) string { return fakeDriver(t, 11040, 0) },
			false,
			func(t *testing.T, a LoadAttempt) {
				var ve *VersionError
				require.ErrorAs(t, a.Err, &ve)
				require.Equal(t, VersionError{Have: 11040, Need: MinDriverVersion}, *ve)
			},
			[]string{"CUDA 11.4", "CUDA 11.8"},
		},
		{
			"no device",
			func(t *testing.T) string { return fakeDriver(t, 12020, 100) },
			true,
			func(t *testing.T, a LoadAttempt) {
				var ce *Error
				require.ErrorAs(t, a.Err, &ce)
				require.Equal(t, "cuInit", ce.Op)
			},
			[]string{"cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"},
		},
		{
			"broken driver",
			func(t *testing.T) string { return fakeDriver(t, 12020, 999) },
			false,
			func(t *testing.T, a LoadAttempt) {
				require.ErrorIs(t, a.Err, ErrCUDA)
			},
			[]string{"cuInit: CUDA_ERROR_UNKNOWN"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path(t)
			t.Setenv(EnvLibrary, path)
			d, err := open(libraryPaths())
			if d != nil {
				d.discard()
			}
			var le *LoadError
			require.ErrorAs(t, err, &le)
			require.Len(t, le.Attempts, 1, "only $%s is tried", EnvLibrary)
			require.Equal(t, path, le.Attempts[0].Path)
			tc.check(t, le.Attempts[0])
			require.Equal(t, tc.noDevice, errors.Is(err, fairgo.ErrNoDevice), "%v", err)
			require.Equal(t, tc.noDevice, le.NoDevice())
			for _, s := range tc.text {
				require.Contains(t, err.Error(), s)
			}
			require.NotContains(t, err.Error(), "\n")
		})
	}
}

// TestLoadStopsAtTheFirstLibrary: a name the loader does not find is
// skipped; the first library that loads decides.
func TestLoadStopsAtTheFirstLibrary(t *testing.T) {
	fake := fakeDriver(t, 12020, 100)
	_, err := open([]string{"libfairgo-no-such-library.so.1", fake, "libc.so.6"})
	var le *LoadError
	require.ErrorAs(t, err, &le)
	require.Len(t, le.Attempts, 2)
	require.Equal(
		t,
		[]string{"libfairgo-no-such-library.so.1", fake},
		[]string{le.Attempts[0].Path, le.Attempts[1].Path},
	)
	require.ErrorIs(t, err, fairgo.ErrNoDevice)
}

// TestLoadFake: a fake driver that initialises loads, with its version and
// file.
func TestLoadFake(t *testing.T) {
	fake := fakeDriver(t, 12080, 0)
	d, err := open([]string{fake})
	require.NoError(t, err)
	defer d.discard()
	require.Equal(t, 12080, d.Version())
	require.Equal(t, fake, d.Path())
	require.Equal(t, fake, d.File())
	require.Equal(t, fmt.Sprintf("CUDA driver 12.8 (%s)", fake), d.String())
}

// TestLoadStub: the toolkit's stub libcuda (built to link against, not to
// run) counts as no driver.
func TestLoadStub(t *testing.T) {
	const stub = "/usr/lib/x86_64-linux-gnu/stubs/libcuda.so"
	if _, err := os.Stat(stub); err != nil {
		t.Skip("no CUDA stub library here")
	}
	d, err := open([]string{stub})
	if d != nil {
		d.discard()
	}
	require.ErrorIs(t, err, fairgo.ErrNoDevice)
	require.Contains(t, err.Error(), "CUDA_ERROR_STUB_LIBRARY")
}

// TestLoadDefault loads this host's driver: on a host without a GPU it is a
// *LoadError matching fairgo.ErrNoDevice, naming the default libraries
// tried; a driver that is there but unusable fails the test.
func TestLoadDefault(t *testing.T) {
	t.Setenv(EnvLibrary, "")
	d, err := Load()
	if err != nil {
		var le *LoadError
		require.ErrorAs(t, err, &le)
		for i, a := range le.Attempts {
			require.Equal(t, DefaultLibraries[i], a.Path)
		}
		require.ErrorIs(t, err, fairgo.ErrNoDevice, "a driver is there but unusable")
		t.Skip(err.Error())
	}
	again, err := Load()
	require.NoError(t, err)
	require.Same(t, d, again)
	require.GreaterOrEqual(t, d.Version(), MinDriverVersion)
	t.Logf("loaded %v", d)
}

// envNoDeviceChild marks the process TestNoDeviceThroughSetup starts.
const envNoDeviceChild = "FAIRGO_TEST_NO_DEVICE_CHILD"

// TestNoDeviceThroughSetup: asking for the GPU backend on a host without
// one fails with one line naming what is missing. Where an earlier test of
// this process loaded a driver (a host with a GPU), Load does not consult
// the environment again: the test then runs in a fresh process of the test
// binary whose driver library is missing.
func TestNoDeviceThroughSetup(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	t.Setenv(EnvLibrary, missing)
	if _, err := Load(); err == nil {
		require.Empty(t, os.Getenv(envNoDeviceChild), "the fresh process loaded a driver from %s", missing)
		cmd := exec.Command(os.Args[0], "-test.run=^TestNoDeviceThroughSetup$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), envNoDeviceChild+"=1") // with EnvLibrary as set above
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "the test in a fresh process:\n%s", out)
		require.Regexp(
			t,
			`(?m)^--- PASS: TestNoDeviceThroughSetup `,
			string(out),
			"the test in a fresh process ran and passed:\n%s",
			out,
		)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := setup.New(ctx, rendezvous.NewMemoryStore(), Backend{},
		setup.WithLaunch(rendezvous.Launch{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1}))
	if r != nil {
		r.Close()
	}
	require.ErrorIs(t, err, fairgo.ErrNoDevice)
	var le *LoadError
	require.ErrorAs(t, err, &le)
	require.Contains(t, err.Error(), "libcuda.so.1")
	require.NotContains(t, err.Error(), "\n")
}

func TestKernelArgs(t *testing.T) {
	ok := []struct {
		arg  any
		slot uint64
	}{
		{int8(-1), 0xff}, {uint8(7), 7}, {int16(-2), 0xfffe}, {uint16(9), 9},
		{int32(-1), 0xffffffff}, {uint32(1 << 31), 1 << 31}, {int64(-1), 1<<64 - 1}, {uint64(42), 42},
		{float32(1), 0x3f800000}, {float64(-2), 0xc000000000000000}, {uintptr(0xdead), 0xdead},
		{true, 1}, {false, 0}, {fairgo.Tensor{Ptr: 0xbeef, Count: 1, Bytes: 4, DType: fairgo.Float32}, 0xbeef},
	}
	for _, c := range ok {
		slots, err := kernelArgs([]any{c.arg})
		require.NoError(t, err, "%T", c.arg)
		require.Equal(t, []uint64{c.slot}, slots, "%T %v", c.arg, c.arg)
	}
	bad := []struct {
		args []any
		text string
	}{
		{
			[]any{int32(1), 3},
			"invalid kernel argument 1 int: a Go int has no fixed size: pass int32 (a C int) or int64",
		},
		{[]any{uint(3)}, "uint32 or uint64"},
		{[]any{"x"}, "unsupported type"},
		{[]any{&struct{}{}}, "unsupported type"},
		{make([]any, maxKernelArgs+1), fmt.Sprintf("at most %d", maxKernelArgs)},
	}
	for _, c := range bad {
		_, err := kernelArgs(c.args)
		require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
		require.ErrorContains(t, err, c.text)
	}
}

func TestDim3(t *testing.T) {
	for _, c := range []struct {
		in   Dim3
		want [3]uint32
		ok   bool
	}{
		{Dim3{}, [3]uint32{1, 1, 1}, true},
		{Dim3{X: 7}, [3]uint32{7, 1, 1}, true},
		{Dim3{2, 3, 4}, [3]uint32{2, 3, 4}, true},
		{Dim3{X: -1}, [3]uint32{}, false},
		{Dim3{Y: 1 << 32}, [3]uint32{}, false},
	} {
		got, err := c.in.dims()
		if !c.ok {
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument, "%+v", c.in)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, c.want, got)
	}
}
