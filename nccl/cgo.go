package nccl

// This file holds the package's C code: the few NCCL declarations fairgo
// needs (so that no nccl.h is required to build), dlopen/dlsym (through the
// helpers of internal/dl/fg_dl.h, shared with package cuda), and one small
// shim per NCCL function that calls through the resolved pointer.
// Device pointers and streams cross as uintptr_t.

/*
#cgo CFLAGS: -I${SRCDIR}/../internal/dl
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fg_dl.h"

typedef struct fg_ncclComm* ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;   // enum: int-sized on every ABI NCCL supports
typedef int ncclDataType_t; // enum
typedef int ncclRedOp_t;    // enum
typedef struct CUstream_st* cudaStream_t;

// ncclConfig_t as of NCCL 2.28 (versioned, append-only: NCCL copies
// min(size, its own size) bytes and fills the rest with its defaults).
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
} fg_ncclConfig;

static void fg_config_init(fg_ncclConfig* c) {
	memset(c, 0, sizeof(*c));
	c->size = sizeof(*c);
	c->magic = 0xcafebeef;
	c->version = 22800;
	c->blocking = INT_MIN;
	c->cgaClusterSize = INT_MIN;
	c->minCTAs = INT_MIN;
	c->maxCTAs = INT_MIN;
	c->netName = NULL;
	c->splitShare = INT_MIN;
	c->trafficClass = INT_MIN;
	c->commName = NULL;
	c->collnetEnable = INT_MIN;
	c->CTAPolicy = INT_MIN;
	c->shrinkShare = INT_MIN;
	c->nvlsCTAs = INT_MIN;
	c->nChannelsPerNetPeer = INT_MIN;
	c->nvlinkCentricSched = INT_MIN;
}

enum {
	FG_GetVersion, FG_GetUniqueId, FG_CommInitRank, FG_CommInitRankConfig, FG_CommSplit,
	FG_CommDestroy, FG_CommAbort, FG_CommGetAsyncError, FG_CommCount, FG_CommUserRank,
	FG_AllReduce, FG_ReduceScatter, FG_AllGather, FG_Broadcast, FG_Send, FG_Recv,
	FG_GroupStart, FG_GroupEnd, FG_GetErrorString, FG_GetLastError,
	FG_NSYM
};

static const char* fg_names[FG_NSYM] = {
	"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit",
	"ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError", "ncclCommCount", "ncclCommUserRank",
	"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "ncclSend", "ncclRecv",
	"ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString", "ncclGetLastError",
};

static int fg_nsym(void) { return FG_NSYM; }
static const char* fg_name(int i) { return fg_names[i]; }

typedef ncclResult_t (*fg_GetVersion_t)(int*);
typedef ncclResult_t (*fg_GetUniqueId_t)(ncclUniqueId*);
typedef ncclResult_t (*fg_CommInitRank_t)(ncclComm_t*, int, ncclUniqueId, int);
typedef ncclResult_t (*fg_CommInitRankConfig_t)(ncclComm_t*, int, ncclUniqueId, int, fg_ncclConfig*);
typedef ncclResult_t (*fg_CommSplit_t)(ncclComm_t, int, int, ncclComm_t*, fg_ncclConfig*);
typedef ncclResult_t (*fg_Comm_t)(ncclComm_t);
typedef ncclResult_t (*fg_CommGetAsyncError_t)(ncclComm_t, ncclResult_t*);
typedef ncclResult_t (*fg_CommInt_t)(const ncclComm_t, int*);
typedef ncclResult_t (*fg_Reduce_t)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*fg_AllGather_t)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*fg_Broadcast_t)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*fg_Send_t)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*fg_Recv_t)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*fg_Void_t)(void);
typedef const char* (*fg_GetErrorString_t)(ncclResult_t);
typedef const char* (*fg_GetLastError_t)(ncclComm_t);

static ncclResult_t fg_GetVersion(void** s, int* v) { return ((fg_GetVersion_t)s[FG_GetVersion])(v); }
static ncclResult_t fg_GetUniqueId(void** s, ncclUniqueId* id) { return ((fg_GetUniqueId_t)s[FG_GetUniqueId])(id); }
static ncclResult_t fg_CommInitRank(void** s, ncclComm_t* c, int n, const void* id, int r) {
	ncclUniqueId u; memcpy(&u, id, sizeof u);
	return ((fg_CommInitRank_t)s[FG_CommInitRank])(c, n, u, r);
}
static ncclResult_t fg_CommInitRankConfig(void** s, ncclComm_t* c, int n, const void* id, int r, fg_ncclConfig* cfg) {
	ncclUniqueId u; memcpy(&u, id, sizeof u);
	return ((fg_CommInitRankConfig_t)s[FG_CommInitRankConfig])(c, n, u, r, cfg);
}
static ncclResult_t fg_CommSplit(void** s, ncclComm_t c, int color, int key, ncclComm_t* out, fg_ncclConfig* cfg) {
	return ((fg_CommSplit_t)s[FG_CommSplit])(c, color, key, out, cfg);
}
static ncclResult_t fg_CommDestroy(void** s, ncclComm_t c) { return ((fg_Comm_t)s[FG_CommDestroy])(c); }
static ncclResult_t fg_CommAbort(void** s, ncclComm_t c) { return ((fg_Comm_t)s[FG_CommAbort])(c); }
static ncclResult_t fg_CommGetAsyncError(void** s, ncclComm_t c, ncclResult_t* r) {
	return ((fg_CommGetAsyncError_t)s[FG_CommGetAsyncError])(c, r);
}
static ncclResult_t fg_CommCount(void** s, ncclComm_t c, int* n) { return ((fg_CommInt_t)s[FG_CommCount])(c, n); }
static ncclResult_t fg_CommUserRank(void** s, ncclComm_t c, int* r) { return ((fg_CommInt_t)s[FG_CommUserRank])(c, r); }
// f is FG_AllReduce or FG_ReduceScatter: the two have one prototype.
static ncclResult_t fg_Reduce(void** s, int f, uintptr_t send, uintptr_t recv, size_t n, int dt, int op,
                              ncclComm_t c, uintptr_t st) {
	return ((fg_Reduce_t)s[f])((const void*)send, (void*)recv, n, dt, op, c, (cudaStream_t)st);
}
static ncclResult_t fg_AllGather(void** s, uintptr_t send, uintptr_t recv, size_t n, int dt,
                                 ncclComm_t c, uintptr_t st) {
	return ((fg_AllGather_t)s[FG_AllGather])((const void*)send, (void*)recv, n, dt, c, (cudaStream_t)st);
}
static ncclResult_t fg_Broadcast(void** s, uintptr_t send, uintptr_t recv, size_t n, int dt, int root,
                                 ncclComm_t c, uintptr_t st) {
	return ((fg_Broadcast_t)s[FG_Broadcast])((const void*)send, (void*)recv, n, dt, root, c, (cudaStream_t)st);
}
static ncclResult_t fg_Send(void** s, uintptr_t buf, size_t n, int dt, int peer, ncclComm_t c, uintptr_t st) {
	return ((fg_Send_t)s[FG_Send])((const void*)buf, n, dt, peer, c, (cudaStream_t)st);
}
static ncclResult_t fg_Recv(void** s, uintptr_t buf, size_t n, int dt, int peer, ncclComm_t c, uintptr_t st) {
	return ((fg_Recv_t)s[FG_Recv])((void*)buf, n, dt, peer, c, (cudaStream_t)st);
}
static ncclResult_t fg_GroupStart(void** s) { return ((fg_Void_t)s[FG_GroupStart])(); }
static ncclResult_t fg_GroupEnd(void** s) { return ((fg_Void_t)s[FG_GroupEnd])(); }
static const char* fg_GetErrorString(void** s, int r) { return ((fg_GetErrorString_t)s[FG_GetErrorString])(r); }
static const char* fg_GetLastError(void** s, ncclComm_t c) { return ((fg_GetLastError_t)s[FG_GetLastError])(c); }
*/
import "C"

import (
	"unsafe"

	_ "github.com/fairgo/fairgo/internal/dl" // the header the preamble includes, for go mod vendor
)

// sym indexes the resolved-symbol table; the order matches the C enum.
type sym int

const (
	symGetVersion sym = iota
	symGetUniqueId
	symCommInitRank
	symCommInitRankConfig
	symCommSplit
	symCommDestroy
	symCommAbort
	symCommGetAsyncError
	symCommCount
	symCommUserRank
	symAllReduce
	symReduceScatter
	symAllGather
	symBroadcast
	symSend
	symRecv
	symGroupStart
	symGroupEnd
	symGetErrorString
	symGetLastError
	numSyms
)

const errBufLen = 1024

func symName(s sym) string { return C.GoString(C.fg_name(C.int(s))) }

func numSymsC() int { return int(C.fg_nsym()) }

// cHandle is a dlopen handle and its table of resolved symbols, both C memory.
type cHandle struct {
	dl   unsafe.Pointer
	syms *unsafe.Pointer // C array of numSyms entries
}

// dlopen opens the library at path, or returns the loader's text.
func dlopen(path string) (unsafe.Pointer, string) {
	var buf [errBufLen]C.char
	if h := C.fg_dlopen(path, &buf[0], errBufLen); h != nil {
		return h, ""
	}
	return nil, C.GoString(&buf[0])
}

func dlclose(h unsafe.Pointer) { C.fg_dlclose(h) }

// resolve looks up every symbol; missing ones stay nil and are reported by
// name with the loader's text.
func resolve(h unsafe.Pointer) (*unsafe.Pointer, map[sym]string) {
	table := (*unsafe.Pointer)(C.calloc(C.size_t(numSyms), C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))
	missing := map[sym]string{}
	slots := unsafe.Slice(table, int(numSyms))
	for i := sym(0); i < numSyms; i++ {
		var buf [errBufLen]C.char
		p := C.fg_dl_sym(h, C.fg_name(C.int(i)), &buf[0], errBufLen)
		if p == nil {
			missing[i] = C.GoString(&buf[0])
			continue
		}
		slots[i] = p
	}
	return table, missing
}

func freeTable(t *unsafe.Pointer) { C.free(unsafe.Pointer(t)) }

// origin returns the file a resolved symbol was loaded from, or "".
func origin(t *unsafe.Pointer, s sym) string {
	p := unsafe.Slice(t, int(numSyms))[s]
	if p == nil {
		return ""
	}
	var buf [4096]C.char
	if C.fg_origin(p, &buf[0], C.size_t(len(buf))) != 0 {
		return ""
	}
	return C.GoString(&buf[0])
}

// The c* functions call NCCL through the table. Each returns the raw
// ncclResult_t.

func cGetVersion(t *unsafe.Pointer) (int, Result) {
	var v C.int
	r := C.fg_GetVersion(t, &v)
	return int(v), Result(r)
}

func cGetUniqueId(t *unsafe.Pointer) (UniqueID, Result) {
	var id C.ncclUniqueId
	r := C.fg_GetUniqueId(t, &id)
	var out UniqueID
	copy(out[:], unsafe.Slice((*byte)(unsafe.Pointer(&id)), len(out)))
	return out, Result(r)
}

// commSlot is C memory for the ncclComm_t a creating call writes. Inside
// an NCCL group the library writes it only at ncclGroupEnd, after the call
// has returned, so it must never be Go memory. A slot still empty after the
// call is leaked on purpose (8 bytes): NCCL may write it later.
type commSlot struct{ p *C.ncclComm_t }

func newCommSlot() commSlot {
	p := (*C.ncclComm_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.ncclComm_t(nil)))))
	return commSlot{p: p}
}

// take returns the handle and frees the slot, or nil (keeping the slot)
// when NCCL has not written it yet.
func (s commSlot) take() C.ncclComm_t {
	c := *s.p
	if c != nil {
		C.free(unsafe.Pointer(s.p))
	}
	return c
}

func cCommInitRank(t *unsafe.Pointer, nranks int, id *UniqueID, rank int) (C.ncclComm_t, Result) {
	slot := newCommSlot()
	cid := C.CBytes(id[:])
	defer C.free(cid)
	r := C.fg_CommInitRank(t, slot.p, C.int(nranks), cid, C.int(rank))
	return slot.take(), Result(r)
}

// cConfig is a C-allocated ncclConfig_t with its strings.
type cConfig struct {
	p       *C.fg_ncclConfig
	strings []unsafe.Pointer
}

func newCConfig(cfg *Config, blocking int) *cConfig {
	p := (*C.fg_ncclConfig)(C.malloc(C.size_t(unsafe.Sizeof(C.fg_ncclConfig{}))))
	C.fg_config_init(p)
	cc := &cConfig{p: p}
	if blocking >= 0 {
		p.blocking = C.int(blocking)
	}
	if cfg != nil {
		if cfg.CGAClusterSize > 0 {
			p.cgaClusterSize = C.int(cfg.CGAClusterSize)
		}
		if cfg.MinCTAs > 0 {
			p.minCTAs = C.int(cfg.MinCTAs)
		}
		if cfg.MaxCTAs > 0 {
			p.maxCTAs = C.int(cfg.MaxCTAs)
		}
		if cfg.SplitShare {
			p.splitShare = 1
		}
		if cfg.NetName != "" {
			s := C.CString(cfg.NetName)
			cc.strings = append(cc.strings, unsafe.Pointer(s))
			p.netName = s
		}
		if cfg.CommName != "" {
			s := C.CString(cfg.CommName)
			cc.strings = append(cc.strings, unsafe.Pointer(s))
			p.commName = s
		}
	}
	return cc
}

// free releases the config. NCCL copies what it keeps (names included)
// during the call, so this runs right after it.
func (c *cConfig) free() {
	for _, s := range c.strings {
		C.free(s)
	}
	C.free(unsafe.Pointer(c.p))
}

func cCommInitRankConfig(t *unsafe.Pointer, nranks int, id *UniqueID, rank int, cfg *cConfig) (C.ncclComm_t, Result) {
	slot := newCommSlot()
	cid := C.CBytes(id[:])
	defer C.free(cid)
	r := C.fg_CommInitRankConfig(t, slot.p, C.int(nranks), cid, C.int(rank), cfg.p)
	return slot.take(), Result(r)
}

func cCommSplit(t *unsafe.Pointer, c C.ncclComm_t, color, key int, cfg *cConfig) (C.ncclComm_t, Result) {
	slot := newCommSlot()
	var p *C.fg_ncclConfig
	if cfg != nil {
		p = cfg.p
	}
	r := C.fg_CommSplit(t, c, C.int(color), C.int(key), slot.p, p)
	return slot.take(), Result(r)
}

func cCommDestroy(t *unsafe.Pointer, c C.ncclComm_t) Result { return Result(C.fg_CommDestroy(t, c)) }
func cCommAbort(t *unsafe.Pointer, c C.ncclComm_t) Result   { return Result(C.fg_CommAbort(t, c)) }

func cCommGetAsyncError(t *unsafe.Pointer, c C.ncclComm_t) (Result, Result) {
	var st C.ncclResult_t
	r := C.fg_CommGetAsyncError(t, c, &st)
	return Result(st), Result(r)
}

func cCommCount(t *unsafe.Pointer, c C.ncclComm_t) (int, Result) {
	var n C.int
	r := C.fg_CommCount(t, c, &n)
	return int(n), Result(r)
}

func cCommUserRank(t *unsafe.Pointer, c C.ncclComm_t) (int, Result) {
	var n C.int
	r := C.fg_CommUserRank(t, c, &n)
	return int(n), Result(r)
}

// cReduce calls f, symAllReduce or symReduceScatter (one prototype).
func cReduce(t *unsafe.Pointer, f sym, send, recv uintptr, n int64, dt DataType, op RedOp, c C.ncclComm_t,
	s uintptr) Result {
	snd, rcv, st := C.uintptr_t(send), C.uintptr_t(recv), C.uintptr_t(s)
	return Result(C.fg_Reduce(t, C.int(f), snd, rcv, C.size_t(n), C.int(dt), C.int(op), c, st))
}

func cAllGather(t *unsafe.Pointer, send, recv uintptr, n int64, dt DataType, c C.ncclComm_t, s uintptr) Result {
	return Result(C.fg_AllGather(t, C.uintptr_t(send), C.uintptr_t(recv), C.size_t(n), C.int(dt), c, C.uintptr_t(s)))
}

func cBroadcast(t *unsafe.Pointer, send, recv uintptr, n int64, dt DataType, root int, c C.ncclComm_t,
	s uintptr) Result {
	snd, rcv, st := C.uintptr_t(send), C.uintptr_t(recv), C.uintptr_t(s)
	return Result(C.fg_Broadcast(t, snd, rcv, C.size_t(n), C.int(dt), C.int(root), c, st))
}

func cSend(t *unsafe.Pointer, buf uintptr, n int64, dt DataType, peer int, c C.ncclComm_t, s uintptr) Result {
	return Result(C.fg_Send(t, C.uintptr_t(buf), C.size_t(n), C.int(dt), C.int(peer), c, C.uintptr_t(s)))
}

func cRecv(t *unsafe.Pointer, buf uintptr, n int64, dt DataType, peer int, c C.ncclComm_t, s uintptr) Result {
	return Result(C.fg_Recv(t, C.uintptr_t(buf), C.size_t(n), C.int(dt), C.int(peer), c, C.uintptr_t(s)))
}

func cGroupStart(t *unsafe.Pointer) Result { return Result(C.fg_GroupStart(t)) }
func cGroupEnd(t *unsafe.Pointer) Result   { return Result(C.fg_GroupEnd(t)) }

func cGetErrorString(t *unsafe.Pointer, r Result) string {
	p := C.fg_GetErrorString(t, C.int(r))
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

func cGetLastError(t *unsafe.Pointer, c C.ncclComm_t) string {
	p := C.fg_GetLastError(t, c)
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// commHandle is the C communicator handle as the rest of the package keeps it.
type commHandle = C.ncclComm_t
