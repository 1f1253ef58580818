package nccl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unsafe"
)

// ncclConfigC is ncclConfig_t as nccl.h 2.28 declares it (the fields the
// package sets, in order), for the layout check when no nccl.h is installed.
const ncclConfigC = `
#include <stddef.h>
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char* netName;
	int splitShare;
	int trafficClass;
	const char* commName;
	int collnetEnable;
	int CTAPolicy;
	int shrinkShare;
	int nvlsCTAs;
	int nChannelsPerNetPeer;
	int nvlinkCentricSched;
} ncclConfig_t;
typedef struct { char internal[128]; } ncclUniqueId;
`

// TestConfigLayout checks the Go ncclConfig against a C compiler's layout
// of ncclConfig_t: of nccl.h when an NCCL 2.28 or newer header is installed
// (NCCL_HOME, CUDA_HOME, /usr/local/cuda or /usr/include), else of the
// declaration above; and ncclUniqueId's size.
func TestConfigLayout(t *testing.T) {
	// The layout on LP64 hosts, checked without a compiler.
	want := map[string]uintptr{
		"size": 0, "magic": 8, "version": 12, "blocking": 16, "cgaClusterSize": 20, "minCTAs": 24, "maxCTAs": 28,
		"netName": 32, "splitShare": 40, "trafficClass": 44, "commName": 48, "collnetEnable": 56, "CTAPolicy": 60,
		"shrinkShare": 64, "nvlsCTAs": 68, "nChannelsPerNetPeer": 72, "nvlinkCentricSched": 76,
	}
	ty := reflect.TypeFor[ncclConfig]()
	var fields []reflect.StructField
	for i := range ty.NumField() {
		if f := ty.Field(i); f.Name != "_" {
			fields = append(fields, f)
			if w, ok := want[f.Name]; !ok || w != f.Offset {
				t.Errorf("ncclConfig.%s at offset %d, want %d", f.Name, f.Offset, w)
			}
		}
	}
	if unsafe.Sizeof(ncclConfig{}) != 80 || len(fields) != len(want) || unsafe.Sizeof(UniqueID{}) != 128 {
		t.Fatalf("sizeof(ncclConfig) = %d with %d fields, sizeof(UniqueID) = %d; want 80, %d, 128",
			unsafe.Sizeof(ncclConfig{}), len(fields), unsafe.Sizeof(UniqueID{}), len(want))
	}

	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler for the C side of the check")
	}
	header := ncclConfigC
	for _, dir := range []string{os.Getenv("NCCL_HOME"), os.Getenv("CUDA_HOME"), "/usr/local/cuda", "/usr"} {
		if dir == "" {
			continue
		}
		h, err := os.ReadFile(filepath.Join(dir, "include", "nccl.h"))
		if err != nil {
			continue
		}
		m := regexp.MustCompile(`(?m)^#define NCCL_VERSION_CODE (\d+)`).FindSubmatch(h)
		if m != nil && len(m[1]) == 5 && string(m[1]) >= "22800" {
			header = "#include <" + filepath.Join(dir, "include", "nccl.h") + ">\n#include <stddef.h>\n"
			t.Logf("checking against %s/include/nccl.h", dir)
		}
		break
	}
	var src strings.Builder
	src.WriteString(header + "\n_Static_assert(sizeof(ncclUniqueId) == 128, \"ncclUniqueId\");\n")
	for _, f := range fields {
		fmt.Fprintf(&src, "_Static_assert(offsetof(ncclConfig_t, %s) == %d, \"%s\");\n", f.Name, f.Offset, f.Name)
	}
	dir := t.TempDir()
	c := filepath.Join(dir, "layout.c")
	if err := os.WriteFile(c, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// nccl.h includes CUDA's runtime headers, which a host with NCCL's
	// package but not CUDA's toolkit lacks (the GPU machines): stand-ins
	// after the system's include directories, used only where CUDA's own
	// are missing, declare the one type nccl.h needs from them.
	stubs := filepath.Join(dir, "stubs")
	for name, body := range map[string]string{
		"cuda_runtime.h": "#include <stddef.h>\ntypedef struct CUstream_st *cudaStream_t;\n",
		"cuda_fp16.h":    "",
		"cuda_bf16.h":    "",
	} {
		if err := os.MkdirAll(stubs, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(cc, "-std=c11", "-idirafter", stubs, "-c", "-o", filepath.Join(dir, "layout.o"), c).CombinedOutput(); err != nil {
		t.Fatalf("ncclConfig differs from the C layout: %v\n%s", err, out)
	}
}
