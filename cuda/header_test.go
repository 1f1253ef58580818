package cuda

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// headerCheck is compiled against a real cuda.h together with fg_cuda.h.
// Compiling it (-Werror) checks the constants, the layout of the copy
// struct and every prototype; running it checks that the header maps each
// plain name to the symbol the package resolves.
const headerCheck = `
#include <cuda.h>
#define FG_CUDA_H_TYPES 1
#include "fg_cuda.h"
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define SAME(a, b) _Static_assert((a) == (b), #a " != " #b);
SAME(FG_CUDA_SUCCESS, CUDA_SUCCESS)
SAME(FG_CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE)
SAME(FG_CUDA_ERROR_STUB_LIBRARY, CUDA_ERROR_STUB_LIBRARY)
SAME(FG_CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE)
SAME(FG_CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY)
SAME(FG_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING)
SAME(FG_CU_EVENT_DEFAULT, CU_EVENT_DEFAULT)
SAME(FG_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING)
SAME(FG_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE)
SAME(FG_CU_DEVICE_ATTRIBUTE_MAX_PITCH, CU_DEVICE_ATTRIBUTE_MAX_PITCH)
SAME(FG_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
SAME(FG_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
SAME(FG_CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT)
SAME(FG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
SAME(FG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
SAME(FG_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
SAME(FG_CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE)
SAME(FG_CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER)
SAME(FG_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)

/* The package passes these enums as int. */
SAME(sizeof(CUresult), sizeof(int))
SAME(sizeof(CUdevice_attribute), sizeof(int))
SAME(sizeof(CUpointer_attribute), sizeof(int))
SAME(sizeof(CUjit_option), sizeof(int))
SAME(sizeof(CUmemorytype), sizeof(int))
SAME(sizeof(CUdevice), sizeof(fg_CUdevice))
SAME(sizeof(CUdeviceptr), sizeof(fg_CUdeviceptr))

/* struct fg_memcpy2d is CUDA_MEMCPY2D. */
#define FIELD(f) SAME(offsetof(struct fg_memcpy2d, f), offsetof(CUDA_MEMCPY2D, f))
FIELD(srcXInBytes) FIELD(srcY) FIELD(srcMemoryType) FIELD(srcHost) FIELD(srcDevice) FIELD(srcArray)
FIELD(srcPitch) FIELD(dstXInBytes) FIELD(dstY) FIELD(dstMemoryType) FIELD(dstHost) FIELD(dstDevice)
FIELD(dstArray) FIELD(dstPitch) FIELD(WidthInBytes) FIELD(Height)
SAME(sizeof(struct fg_memcpy2d), sizeof(CUDA_MEMCPY2D))

#ifdef CHECK_PROTOTYPES
/* Each resolved symbol, assigned to a pointer of the package's type. */
#define PROTO(id, sym, plain, ret, params) fg_pfn_##id fg_check_##id = sym;
FG_CU_SYMBOLS(PROTO)
#else
#define STR(x) #x
#define XSTR(x) STR(x)
int main(void) {
	int bad = 0;
#define NAME(id, sym, plain, ret, params) \
	if (strcmp(#sym, XSTR(plain)) != 0) { printf("%s: cuda.h maps %s to %s\n", #sym, #plain, XSTR(plain)); bad = 1; }
	FG_CU_SYMBOLS(NAME)
	return bad;
}
#endif
`

// fgCudaH is the package's header, embedded so that the test binary runs
// from any directory.
//
//go:embed fg_cuda.h
var fgCudaH []byte

// TestDeclarationsMatchCUDAHeader checks fg_cuda.h against the cuda.h of
// CUDA 11.8 (the API the package targets: newer headers map some plain
// names to newer versions, which drivers export beside the old ones), from
// CUDA_HOME, /usr/local/cuda or /usr/include, when there is one and a C
// compiler.
func TestDeclarationsMatchCUDAHeader(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	var inc string
	for _, dir := range []string{filepath.Join(os.Getenv("CUDA_HOME"), "include"), "/usr/local/cuda/include",
		"/usr/include"} {
		if _, err := os.Stat(filepath.Join(dir, "cuda.h")); err == nil && dir != "include" {
			inc = dir
			break
		}
	}
	if inc == "" {
		t.Skip("no cuda.h installed (make cuda-deps installs Debian's)")
	}
	h, err := os.ReadFile(filepath.Join(inc, "cuda.h"))
	require.NoError(t, err)
	if m := regexp.MustCompile(`(?m)^#define CUDA_VERSION (\d+)`).FindSubmatch(h); m == nil || string(m[1]) != "11080" {
		t.Skipf("%s/cuda.h is not CUDA 11.8's (make cuda-deps installs it; CUDA_HOME names another)", inc)
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fg_cuda.h"), fgCudaH, 0o644))
	src := filepath.Join(dir, "check.c")
	require.NoError(t, os.WriteFile(src, []byte(headerCheck), 0o644))
	flags := []string{"-std=c11", "-Wall", "-Werror", "-Wno-unused-variable", "-I" + inc, "-I" + dir}

	out, err := exec.Command(cc, append(flags, "-DCHECK_PROTOTYPES", "-c", "-o", filepath.Join(dir, "check.o"), src)...).
		CombinedOutput()
	require.NoError(t, err, "fg_cuda.h disagrees with %s/cuda.h:\n%s", inc, out)

	bin := filepath.Join(dir, "names")
	out, err = exec.Command(cc, append(flags, "-o", bin, src)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command(bin).CombinedOutput()
	require.NoError(t, err, "symbol names differ from %s/cuda.h's mapping:\n%s", inc, out)
	require.Empty(t, strings.TrimSpace(string(out)))
	t.Logf("fg_cuda.h matches %s/cuda.h", inc)
}
