package nccl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairgo/fairgo"
)

func TestMain(m *testing.M) {
	// NVLink multicast must stay off on the shared GPU hosts.
	if os.Getenv("NCCL_NVLS_ENABLE") == "" {
		os.Setenv("NCCL_NVLS_ENABLE", "0")
	}
	os.Exit(m.Run())
}

// noLibLoaded fails the test when an earlier test leaked a reference: the
// load tests need a fresh Load.
func noLibLoaded(t *testing.T) {
	t.Helper()
	global.mu.Lock()
	defer global.mu.Unlock()
	if global.lib != nil {
		t.Fatalf("a previous test left NCCL loaded (%d references)", global.refs)
	}
}

func TestSymbolTable(t *testing.T) {
	want := []string{"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit",
		"ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError", "ncclCommCount", "ncclCommUserRank",
		"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "ncclSend", "ncclRecv",
		"ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString", "ncclGetLastError"}
	for i, w := range want {
		if got := symName(sym(i)); got != w {
			t.Errorf("symbol %d = %s, want %s", i, got, w)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	noLibLoaded(t)
	path := filepath.Join(t.TempDir(), "libnccl-missing.so.2")
	t.Setenv(EnvLibrary, path)
	lib, err := Load()
	if err == nil {
		lib.Close()
		t.Fatal("Load succeeded on a missing file")
	}
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("error %T %v is not a *LoadError", err, err)
	}
	if len(le.Attempts) != 1 || le.Attempts[0].Path != path {
		t.Fatalf("attempts = %+v, want only %s", le.Attempts, path)
	}
	var de *DLError
	if !errors.As(le.Attempts[0].Err, &de) || de.Text == "" || de.Symbol != "" {
		t.Fatalf("attempt error %v, want a dlopen error with text", le.Attempts[0].Err)
	}
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotSupported) {
		t.Errorf(
			"errors.Is: NotFound=%v NotSupported=%v, want true, false",
			errors.Is(err, ErrNotFound),
			errors.Is(err, ErrNotSupported),
		)
	}
	for _, s := range []string{path, de.Text, EnvLibrary} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q lacks %q", err, s)
		}
	}
}

func TestLoadNotNCCL(t *testing.T) {
	noLibLoaded(t)
	t.Setenv(EnvLibrary, "libc.so.6")
	lib, err := Load()
	if err == nil {
		lib.Close()
		t.Fatal("Load accepted libc as NCCL")
	}
	var le *LoadError
	if !errors.As(err, &le) || len(le.Attempts) != 1 {
		t.Fatalf("error %v, want a *LoadError with one attempt", err)
	}
	var de *DLError
	if !errors.As(le.Attempts[0].Err, &de) || de.Symbol != "ncclGetVersion" || de.Text == "" {
		t.Fatalf("attempt error %#v, want a missing ncclGetVersion with dlerror text", le.Attempts[0].Err)
	}
	if !strings.Contains(err.Error(), "libc.so.6") || !strings.Contains(err.Error(), "ncclGetVersion") {
		t.Errorf("message %q lacks the path or the symbol", err)
	}
}

func TestLoadDefault(t *testing.T) {
	noLibLoaded(t)
	t.Setenv(EnvLibrary, "")
	lib, err := Load()
	if err != nil {
		var le *LoadError
		if !errors.As(err, &le) {
			t.Fatalf("error %T %v is not a *LoadError", err, err)
		}
		if len(le.Attempts) != len(DefaultLibraries) {
			t.Fatalf("tried %d paths, want %v", len(le.Attempts), DefaultLibraries)
		}
		for i, a := range le.Attempts {
			if a.Path != DefaultLibraries[i] || a.Err == nil {
				t.Errorf("attempt %d = %+v", i, a)
			}
		}
		t.Skipf("NCCL not installed here: %v", err)
	}
	defer lib.Close()
	if lib.Version() < MinVersion {
		t.Fatalf("loaded version %d below the minimum", lib.Version())
	}
	v, err := lib.GetVersion()
	if err != nil || v != lib.Version() {
		t.Fatalf("GetVersion = %d, %v; want %d", v, err, lib.Version())
	}
	t.Logf("loaded %v", lib)
	again, err := Load()
	if err != nil || again.dso != lib.dso {
		t.Fatalf("second Load = %p, %v; want the same library", again, err)
	}
	again.Close()
}

func TestMappings(t *testing.T) {
	wantDT := map[fairgo.DType]DataType{
		fairgo.Int8: 0, fairgo.Uint8: 1, fairgo.Int32: 2, fairgo.Uint32: 3, fairgo.Int64: 4,
		fairgo.Uint64: 5, fairgo.Float16: 6, fairgo.Float32: 7, fairgo.Float64: 8, fairgo.BFloat16: 9,
	}
	if len(wantDT) != len(fairgo.DTypes) {
		t.Fatalf("table covers %d of %d dtypes", len(wantDT), len(fairgo.DTypes))
	}
	for _, dt := range fairgo.DTypes {
		got, need, err := DataTypeOf(dt)
		if err != nil || got != wantDT[dt] {
			t.Errorf("DataTypeOf(%v) = %d, %v; want %d", dt, got, err, wantDT[dt])
		}
		if (dt == fairgo.BFloat16) != (need == VersionCode(2, 10, 0)) || (dt != fairgo.BFloat16 && need != 0) {
			t.Errorf("DataTypeOf(%v) needs version %d", dt, need)
		}
	}
	wantOp := map[fairgo.Op]RedOp{fairgo.Sum: 0, fairgo.Prod: 1, fairgo.Max: 2, fairgo.Min: 3, fairgo.Avg: 4}
	for _, op := range fairgo.Ops {
		got, need, err := RedOpOf(op)
		if err != nil || got != wantOp[op] {
			t.Errorf("RedOpOf(%v) = %d, %v; want %d", op, got, err, wantOp[op])
		}
		if (op == fairgo.Avg) != (need == VersionCode(2, 10, 0)) {
			t.Errorf("RedOpOf(%v) needs version %d", op, need)
		}
	}
	if _, _, err := DataTypeOf(fairgo.DType(0)); !errors.Is(err, fairgo.ErrUnknownDType) ||
		!errors.Is(err, fairgo.ErrInvalidArgument) {
		t.Errorf("DataTypeOf(0) error = %v", err)
	}
	if _, _, err := RedOpOf(fairgo.Op(99)); !errors.Is(err, fairgo.ErrUnknownOp) {
		t.Errorf("RedOpOf(99) error = %v", err)
	}
	if VersionCode(2, 28, 3) != 22803 {
		t.Errorf("VersionCode(2,28,3) = %d", VersionCode(2, 28, 3))
	}
	for code, want := range map[int][3]int{22803: {2, 28, 3}, 21200: {2, 12, 0}, 2708: {2, 7, 8}} {
		if M, m, p := SplitVersion(code); [3]int{M, m, p} != want {
			t.Errorf("SplitVersion(%d) = %d.%d.%d, want %v", code, M, m, p, want)
		}
	}
	if InvalidArgument.String() != "ncclInvalidArgument" || Result(42).String() != "ncclResult(42)" {
		t.Errorf("Result names: %v %v", InvalidArgument, Result(42))
	}
}

func TestUniqueIDRoundTrip(t *testing.T) {
	var id UniqueID
	for i := range id {
		id[i] = byte(i*7 + 3)
	}
	b := id.Bytes()
	b2 := id.Bytes()
	b2[0] ^= 0xff // Bytes returns a copy
	got, err := UniqueIDFromBytes(b)
	if err != nil || got != id {
		t.Fatalf("round trip: %v, %v", got == id, err)
	}
	if _, err := UniqueIDFromBytes(b[:127]); !errors.Is(err, fairgo.ErrInvalidArgument) {
		t.Errorf("short id: error %v", err)
	}
	if _, err := UniqueIDFromBytes(append(b, 0)); !errors.Is(err, fairgo.ErrInvalidArgument) {
		t.Errorf("long id: error %v", err)
	}
	if !bytes.Equal(b, id[:]) {
		t.Error("Bytes changed")
	}
}

func TestErrorType(t *testing.T) {
	for code, sentinel := range resultSentinels {
		e := &Error{Code: code, Op: "ncclX", Text: "why"}
		if !errors.Is(e, sentinel) {
			t.Errorf("%v does not match its sentinel", code)
		}
		if !strings.Contains(e.Error(), "ncclX") || !strings.Contains(e.Error(), "why") {
			t.Errorf("message %q", e)
		}
	}
	if !errors.Is(&Error{Code: InvalidUsage}, fairgo.ErrInvalidArgument) {
		t.Error("invalid usage does not match fairgo.ErrInvalidArgument")
	}
	if !errors.Is(ErrAborted, fairgo.ErrAborted) || !errors.Is(&Error{Code: Timeout}, fairgo.ErrTimeout) {
		t.Error("aborted/timeout do not match fairgo's sentinels")
	}
}

// fakeNCCL is a stand-in libnccl for the load, version and error paths.
const fakeNCCL = `
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <time.h>
typedef int R;
typedef struct { char internal[128]; } ncclUniqueId;
static char last[256];
static int polls;
static int stuck(void) { const char* s = getenv("FAKE_NCCL_STUCK"); return s && s[0] == '1'; }
static int slow(void) { const char* s = getenv("FAKE_NCCL_SLOW"); return s && s[0] == '1'; }
static int inside; /* calls inside ncclCommGetAsyncError now: an abort meanwhile would free what they read */
R ncclGetVersion(int* v) { *v = FAKE_VERSION; return 0; }
R ncclGetUniqueId(ncclUniqueId* id) { for (int i = 0; i < 128; i++) id->internal[i] = 7 + i % 3; return 0; }
R ncclCommInitRank(void** c, int n, ncclUniqueId id, int r) {
	for (int i = 0; i < 128; i++) if (id.internal[i] != 7 + i % 3) { strcpy(last, "fake: bad unique id"); return 4; }
	int* p = malloc(3 * sizeof(int)); p[0] = n; p[1] = r; p[2] = 0; *c = p; return 0;
}
static void** pendingOut; /* a non-blocking split's child, written when its job ends */
static void* pendingChild;
#ifdef WITH_CONFIG
R ncclCommInitRankConfig(void** c, int n, ncclUniqueId id, int r, void* cfg) {
	char* b = cfg;
	if (*(size_t*)b < 72 || *(unsigned*)(b + 8) != 0xcafebeefu || *(int*)(b + 16) != 0) {
		strcpy(last, "fake: bad config"); return 4;
	}
	polls = 0;
	R res = ncclCommInitRank(c, n, id, r);
	if (!res) ((int*)*c)[2] = 1;
	return res ? res : 7;
}
R ncclCommSplit(void* c, int color, int key, void** out, void* cfg) {
	int* p = NULL;
	if (color >= 0) { p = malloc(3 * sizeof(int)); p[0] = 1; p[1] = 0; p[2] = ((int*)c)[2]; }
	if (((int*)c)[2]) { *out = NULL; pendingOut = out; pendingChild = p; polls = 0; return 0; } /* NCCL 2.28: success, the child later */
	*out = p; return 0;
}
#endif
R ncclCommDestroy(void* c) { free(c); return 0; }
R ncclCommAbort(void* c) {
	if (__atomic_load_n(&inside, __ATOMIC_SEQ_CST) > 0) { strcpy(last, "fake: aborted while a call was inside"); return 3; }
	free(c); return 0;
}
R ncclCommGetAsyncError(void* c, R* st) {
	__atomic_add_fetch(&inside, 1, __ATOMIC_SEQ_CST);
	if (slow()) { struct timespec ts = {0, 2000000}; nanosleep(&ts, NULL); }
	int busy = stuck() || polls++ < 3;
	if (!busy && pendingOut) { *pendingOut = pendingChild; pendingOut = NULL; }
	*st = busy ? 7 : 0;
	__atomic_sub_fetch(&inside, 1, __ATOMIC_SEQ_CST);
	return 0;
}
R ncclCommCount(void* c, int* n) { *n = ((int*)c)[0]; return 0; }
R ncclCommUserRank(void* c, int* r) { *r = ((int*)c)[1]; return 0; }
R ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, void* c, void* st) {
	if (dt > 9) { snprintf(last, sizeof last, "fake: invalid datatype in allreduce of %zu, op %d", n, op); return 4; }
	return 0;
}
R ncclReduceScatter(const void* s, void* r, size_t n, int dt, int op, void* c, void* st) {
	if (dt > 9) { snprintf(last, sizeof last, "fake: invalid datatype in reduce-scatter of %zu, op %d", n, op); return 4; }
	return 0;
}
R ncclAllGather(const void* s, void* r, size_t n, int dt, void* c, void* st) { return 0; }
R ncclBroadcast(const void* s, void* r, size_t n, int dt, int root, void* c, void* st) { return 0; }
R ncclSend(const void* s, size_t n, int dt, int peer, void* c, void* st) { return 0; }
R ncclRecv(void* r, size_t n, int dt, int peer, void* c, void* st) { return 0; }
R ncclGroupStart(void) { return 0; }
R ncclGroupEnd(void) { return 0; }
const char* ncclGetErrorString(R r) { return r == 4 ? "invalid argument (fake)" : "fake result"; }
const char* ncclGetLastError(void* c) { return last; }
`

// loadFake loads a fake libnccl built as buildFake builds it, with no
// library loaded before; the test closes it.
func loadFake(t *testing.T, name string, version int, withConfig bool) *Library {
	t.Helper()
	noLibLoaded(t)
	t.Setenv(EnvLibrary, buildFake(t, name, version, withConfig))
	lib, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// buildFake compiles the fake library, or skips when there is no C compiler.
func buildFake(t *testing.T, name string, version int, withConfig bool) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build a fake libnccl")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fake.c")
	if err := os.WriteFile(src, []byte(fakeNCCL), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	args := []string{"-shared", "-fPIC", "-o", out, src, "-DFAKE_VERSION=" + itoa(version)}
	if withConfig {
		args = append(args, "-DWITH_CONFIG")
	}
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("building the fake library: %v\n%s", err, b)
	}
	return out
}

func itoa(v int) string {
	s := ""
	for {
		s = string(rune('0'+v%10)) + s
		v /= 10
		if v == 0 {
			return s
		}
	}
}

func TestFakeTooOld(t *testing.T) {
	noLibLoaded(t)
	t.Setenv(EnvLibrary, buildFake(t, "libfake211.so", VersionCode(2, 11, 4), false))
	lib, err := Load()
	if err == nil {
		lib.Close()
		t.Fatal("Load accepted NCCL 2.11")
	}
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Have != 21104 || ve.Need != MinVersion {
		t.Fatalf("error %v, want a *VersionError 2.11.4 < 2.12.0", err)
	}
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "2.11.4") {
		t.Errorf("error %v should match ErrNotSupported and name the version", err)
	}
}

func TestFakeMissingOptional(t *testing.T) {
	lib := loadFake(t, "libfake212.so", VersionCode(2, 12, 0), false)
	defer lib.Close()
	if lib.Supports("ncclCommSplit") || lib.Supports("ncclCommInitRankConfig") || !lib.Supports("ncclAllReduce") {
		t.Error("Supports disagrees with the fake's symbols")
	}
	id, err := lib.GetUniqueId()
	if err != nil {
		t.Fatal(err)
	}
	comm, err := lib.CommInitRank(4, id, 2)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := comm.Count(); n != 4 || err != nil {
		t.Errorf("Count = %d, %v", n, err)
	}
	if r, err := comm.UserRank(); r != 2 || err != nil {
		t.Errorf("UserRank = %d, %v", r, err)
	}
	_, err = comm.Split(0, 0, nil)
	var me *MissingSymbolError
	if !errors.As(err, &me) || me.Symbol != "ncclCommSplit" || !errors.Is(err, ErrNotSupported) {
		t.Errorf("Split error = %v, want a missing ncclCommSplit", err)
	}
	if _, err := lib.CommInitRankConfig(context.Background(), 1, id, 0, nil); !errors.Is(err, ErrNotSupported) {
		t.Errorf("CommInitRankConfig error = %v, want ErrNotSupported", err)
	}
	// An NCCL failure carries the code, the function, and both texts.
	err = comm.AllReduce(0, 0, 1, DataType(99), Sum, 0)
	var ne *Error
	if !errors.As(err, &ne) || ne.Code != InvalidArgument || ne.Op != "ncclAllReduce" {
		t.Fatalf("AllReduce error = %v", err)
	}
	if !strings.Contains(ne.Text, "invalid argument (fake)") || !strings.Contains(ne.Text, "fake: invalid datatype") {
		t.Errorf("error text %q lacks ncclGetErrorString or ncclGetLastError", ne.Text)
	}
	if !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, fairgo.ErrInvalidArgument) {
		t.Errorf("%v does not match the invalid-argument sentinels", err)
	}
	// AllReduce and ReduceScatter share a shim: each reaches its own
	// symbol with its arguments.
	if !strings.Contains(ne.Text, "allreduce of 1, op 0") {
		t.Errorf("AllReduce reached %q", ne.Text)
	}
	err = comm.ReduceScatter(0, 0, 5, DataType(99), Max, 0)
	if !errors.As(err, &ne) || ne.Op != "ncclReduceScatter" ||
		!strings.Contains(ne.Text, fmt.Sprintf("reduce-scatter of 5, op %d", Max)) {
		t.Errorf("ReduceScatter error = %v", err)
	}
	if err := comm.AllReduce(0, 0, -1, Float32, Sum, 0); !errors.Is(err, fairgo.ErrInvalidArgument) {
		t.Errorf("negative count: %v", err)
	}
	if err := comm.Broadcast(0, 0, 1, Float32, 4, 0); !errors.Is(err, fairgo.ErrInvalidArgument) {
		t.Errorf("root out of range: %v", err)
	}
	if _, err := lib.CommInitRank(2, id, 2); !errors.Is(err, fairgo.ErrInvalidArgument) {
		t.Errorf("rank out of range: %v", err)
	}

	// The communicator keeps the library loaded after the caller's Close.
	if err := comm.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := comm.AllReduce(0, 0, 1, Float32, Sum, 0); !errors.Is(err, ErrAborted) ||
		!errors.Is(err, fairgo.ErrAborted) {
		t.Errorf("call after Abort: %v", err)
	}
	if err := comm.Abort(); err != nil {
		t.Errorf("second Abort: %v", err)
	}
	if err := comm.Destroy(); err != nil {
		t.Errorf("Destroy after Abort: %v", err)
	}
}

func TestFakeRefcount(t *testing.T) {
	lib := loadFake(t, "libfake212b.so", VersionCode(2, 12, 1), false)
	id, _ := lib.GetUniqueId()
	comm, err := lib.CommInitRank(1, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lib.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v, want ErrClosed", err)
	}
	// Still loaded for the communicator.
	if n, err := comm.Count(); n != 1 || err != nil {
		t.Fatalf("Count after Close = %d, %v", n, err)
	}
	if err := comm.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := comm.AllReduce(0, 0, 1, Float32, Sum, 0); !errors.Is(err, ErrDestroyed) {
		t.Errorf("call after Destroy: %v", err)
	}
	if _, err := lib.GetUniqueId(); !errors.Is(err, ErrClosed) {
		t.Errorf("call on an unloaded library: %v", err)
	}
	noLibLoaded(t)
}

func TestFakeNonBlockingInit(t *testing.T) {
	lib := loadFake(t, "libfake228.so", VersionCode(2, 28, 3), true)
	defer lib.Close()
	id, _ := lib.GetUniqueId()
	comm, err := lib.CommInitRankConfig(context.Background(), 3, id, 1, &Config{CommName: "fake", MaxCTAs: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !comm.NonBlocking() {
		t.Error("communicator should be non-blocking")
	}
	child, err := comm.Split(0, 0, nil)
	if err != nil || child == nil {
		t.Fatalf("Split = %v, %v", child, err)
	}
	if none, err := comm.Split(NoColor, 0, nil); none != nil || err != nil {
		t.Errorf("Split(NoColor) = %v, %v; want nil, nil", none, err)
	}
	child.Destroy()
	comm.Destroy()

	// A peer that never shows up: ctx ends the wait and the comm is aborted.
	t.Setenv("FAKE_NCCL_STUCK", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = lib.CommInitRankConfig(ctx, 2, id, 0, nil)
	if err != context.DeadlineExceeded {
		t.Fatalf("stuck init = %v, want context.DeadlineExceeded unchanged", err)
	}
}

// TestFakeAbortWaitsForCallsInside aborts a non-blocking communicator
// while a goroutine polls it in WaitReady (a peer that never connects), each
// poll 2 ms inside NCCL: Abort waits for the poll inside to leave before
// ncclCommAbort frees the communicator (the fake fails an abort that
// overlaps a call), and the poller ends with ErrAborted. A Hold keeps Abort
// waiting until its Release, and abortDrain at most.
func TestFakeAbortWaitsForCallsInside(t *testing.T) {
	lib := loadFake(t, "libfake228b.so", VersionCode(2, 28, 3), true)
	defer lib.Close()
	id, _ := lib.GetUniqueId()
	open := func() *Comm {
		t.Helper()
		t.Setenv("FAKE_NCCL_STUCK", "0")
		c, err := lib.CommInitRankConfig(context.Background(), 2, id, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	comm := open()
	t.Setenv("FAKE_NCCL_STUCK", "1")
	t.Setenv("FAKE_NCCL_SLOW", "1")
	polled := make(chan error, 1)
	go func() { polled <- comm.WaitReady(context.Background()) }()
	time.Sleep(3 * time.Millisecond) // most likely within a poll: each spends 2 ms inside, then naps 100 µs at most
	if err := comm.Abort(); err != nil {
		t.Fatalf("Abort overlapped a call inside NCCL: %v", err)
	}
	select {
	case err := <-polled:
		if !errors.Is(err, ErrAborted) {
			t.Errorf("WaitReady after Abort = %v, want ErrAborted", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitReady went on polling an aborted communicator")
	}

	t.Setenv("FAKE_NCCL_SLOW", "0")
	comm = open()
	if err := comm.Hold(); err != nil {
		t.Fatal(err)
	}
	aborted := make(chan error, 1)
	go func() { aborted <- comm.Abort() }()
	select {
	case err := <-aborted:
		t.Fatalf("Abort = %v before the Hold was released", err)
	case <-time.After(50 * time.Millisecond):
	}
	comm.Release()
	if err := <-aborted; err != nil {
		t.Fatal(err)
	}
	if err := comm.Hold(); !errors.Is(err, ErrAborted) {
		t.Errorf("Hold after Abort = %v, want ErrAborted", err)
	}

	comm = open()
	if err := comm.Hold(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := comm.Abort(); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < abortDrain || waited > abortDrain+time.Second {
		t.Errorf("Abort with a Hold never released took %v, want about %v", waited, abortDrain)
	}
}

// TestRealSingleRank runs on a machine with NCCL and a GPU: a one-rank
// communicator exercises init, split, queries and NCCL's own error text
// without needing CUDA memory (the collective tests live in package cuda).
func TestRealSingleRank(t *testing.T) {
	noLibLoaded(t)
	t.Setenv(EnvLibrary, "")
	lib, err := Load()
	if err != nil {
		t.Skipf("NCCL not installed here: %v", err)
	}
	defer lib.Close()
	if _, err := os.Stat("/dev/nvidia0"); err != nil {
		t.Skip("no GPU (/dev/nvidia0) for a communicator")
	}
	id, err := lib.GetUniqueId()
	if err != nil {
		t.Fatal(err)
	}
	id2, _ := lib.GetUniqueId()
	if id == id2 || id == (UniqueID{}) {
		t.Error("unique ids are not unique")
	}
	comm, err := lib.CommInitRank(1, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer comm.Destroy()
	if n, err := comm.Count(); n != 1 || err != nil {
		t.Errorf("Count = %d, %v", n, err)
	}
	if r, err := comm.UserRank(); r != 0 || err != nil {
		t.Errorf("UserRank = %d, %v", r, err)
	}
	if st, err := comm.GetAsyncError(); st != Success || err != nil {
		t.Errorf("GetAsyncError = %v, %v", st, err)
	}
	err = comm.AllReduce(0, 0, 1, DataType(99), Sum, 0)
	var ne *Error
	if !errors.As(err, &ne) || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("AllReduce with a bad datatype = %v, want an ncclInvalidArgument *Error", err)
	}
	t.Logf("NCCL's error: %v", err)

	if lib.Supports("ncclCommInitRankConfig") {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		nb, err := lib.CommInitRankConfig(ctx, 1, id2, 0, &Config{CommName: "fairgo-test"})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := nb.Count(); n != 1 || err != nil {
			t.Errorf("non-blocking Count = %d, %v", n, err)
		}
		nb.Destroy()
	}
	if lib.Supports("ncclCommSplit") {
		child, err := comm.Split(0, 0, nil)
		if err != nil || child == nil {
			t.Fatalf("Split = %v, %v", child, err)
		}
		if n, _ := child.Count(); n != 1 {
			t.Errorf("child Count = %d", n)
		}
		child.Destroy()
	}
}

func TestVersionConstants(t *testing.T) {
	if MinVersion != VersionCode(2, 12, 0) || ConfigMinVersion != VersionCode(2, 14, 0) ||
		SplitMinVersion != VersionCode(2, 18, 0) {
		t.Error("version constants disagree with VersionCode")
	}
}

// GetVersion calls ncclGetVersion.
func (l *Library) GetVersion() (int, error) {
	if err := l.check(symGetVersion); err != nil {
		return 0, err
	}
	v, r := cGetVersion(l.table)
	return v, l.err("ncclGetVersion", r, 0)
}
