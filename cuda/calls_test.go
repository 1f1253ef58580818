package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGoMatchesHeader checks calls.go against fg_cuda.h, which
// TestDeclarationsMatchCUDAHeader checks against cuda.h: the symbols and
// their order, the constants, and (with a C compiler) the layout of
// memcpy2D against struct fg_memcpy2d.
func TestGoMatchesHeader(t *testing.T) {
	h := string(fgCudaH)
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s*X\((\w+),\s*(\w+),`).FindAllStringSubmatch(h, -1) {
		names = append(names, m[2])
	}
	require.Equal(t, symNames[:], names, "FG_CU_SYMBOLS and symNames differ")

	defines := map[string]int64{}
	for _, m := range regexp.MustCompile(`(?m)^#define (FG_\w+) (0x[0-9a-fA-F]+|\d+)$`).FindAllStringSubmatch(h, -1) {
		v, err := strconv.ParseInt(m[2], 0, 64)
		require.NoError(t, err)
		defines[m[1]] = v
	}
	want := map[string]int64{
		"FG_CUDA_SUCCESS": cudaSuccess, "FG_CUDA_ERROR_INVALID_VALUE": cudaInvalidValue,
		"FG_CUDA_ERROR_STUB_LIBRARY": cudaStubLibrary, "FG_CUDA_ERROR_NO_DEVICE": cudaNoDevice,
		"FG_CUDA_ERROR_NOT_READY": cudaNotReady, "FG_CU_STREAM_NON_BLOCKING": cuStreamNonBlocking,
		"FG_CU_EVENT_DEFAULT": cuEventDefault, "FG_CU_EVENT_DISABLE_TIMING": cuEventDisableTiming,
		"FG_CU_MEMORYTYPE_DEVICE": memoryTypeDevice, "FG_CU_DEVICE_ATTRIBUTE_MAX_PITCH": cuDeviceAttrMaxPitch,
		"FG_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": cuDeviceAttrMultiprocessorCount,
		"FG_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING":   cuDeviceAttrUnifiedAddressing,
		"FG_CU_POINTER_ATTRIBUTE_CONTEXT":             cuPointerAttrContext,
		"FG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE":         cuPointerAttrMemoryType,
		"FG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL":      cuPointerAttrDeviceOrdinal,
		"FG_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR":    cuPointerAttrRangeStartAddr,
		"FG_CU_POINTER_ATTRIBUTE_RANGE_SIZE":          cuPointerAttrRangeSize,
		"FG_CU_JIT_ERROR_LOG_BUFFER":                  cuJitErrorLogBuffer,
		"FG_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES":       cuJitErrorLogBufferSizeBytes,
	}
	require.Equal(t, want, defines, "fg_cuda.h's constants and calls.go's differ")

	// The layout of memcpy2D, on LP64 hosts, without a compiler.
	ty := reflect.TypeFor[memcpy2D]()
	var fields []reflect.StructField
	for i := range ty.NumField() {
		if f := ty.Field(i); f.Name != "_" {
			fields = append(fields, f)
		}
	}
	require.Len(t, fields, 16)
	require.EqualValues(t, 128, ty.Size())
	require.EqualValues(t, 24, fields[3].Offset, "srcHost")

	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler for the C side of the layout check")
	}
	var src strings.Builder
	src.WriteString("#include \"fg_cuda.h\"\n#include <stddef.h>\n")
	fmt.Fprintf(&src, "_Static_assert(sizeof(struct fg_memcpy2d) == %d, \"size\");\n", ty.Size())
	for _, f := range fields {
		fmt.Fprintf(&src, "_Static_assert(offsetof(struct fg_memcpy2d, %s) == %d, \"%s\");\n", f.Name, f.Offset, f.Name)
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fg_cuda.h"), fgCudaH, 0o644))
	c := filepath.Join(dir, "layout.c")
	require.NoError(t, os.WriteFile(c, []byte(src.String()), 0o644))
	out, err := exec.Command(cc, "-std=c11", "-I"+dir, "-c", "-o", filepath.Join(dir, "layout.o"), c).CombinedOutput()
	require.NoError(t, err, "memcpy2D differs from struct fg_memcpy2d:\n%s", out)
}
