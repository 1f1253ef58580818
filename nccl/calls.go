package nccl

// This file calls NCCL without cgo: dlopen and dlsym through package
// internal/dl, and each function through its resolved pointer with
// dl.Call (one C call each, at cgo's cost on amd64). Arguments cross as
// uintptr words: device pointers and streams are uintptr already, int
// arguments are widened and int results read from the low 32 bits.
// ncclUniqueId is passed by value (uniqueid_*.go); ncclConfig_t and the
// ncclComm_t slot a creating call writes are C memory (dl.Calloc).

import (
	"structs"
	"unsafe"

	"github.com/fairgo/fairgo/internal/dl"
)

// sym indexes the resolved-symbol table.
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

var symNames = [numSyms]string{
	"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit",
	"ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError", "ncclCommCount", "ncclCommUserRank",
	"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "ncclSend", "ncclRecv",
	"ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString", "ncclGetLastError",
}

func symName(s sym) string { return symNames[s] }

// symTable holds the resolved functions, 0 for a missing one.
type symTable [numSyms]uintptr

// commHandle is an ncclComm_t.
type commHandle = uintptr

// dlopen opens the library at path, or returns the loader's text.
func dlopen(path string) (uintptr, string) { return dl.Open(path) }

func dlclose(h uintptr) { dl.Close(h) }

// resolve looks up every symbol; missing ones stay 0 and are reported by
// name with the loader's text.
func resolve(h uintptr) (*symTable, map[sym]string) {
	t := new(symTable)
	missing := map[sym]string{}
	for i := range numSyms {
		p, text := dl.Sym(h, symName(i))
		if p == 0 {
			missing[i] = text
			continue
		}
		t[i] = p
	}
	return t, missing
}

// origin returns the file a resolved symbol was loaded from, or "".
func origin(t *symTable, s sym) string { return dl.Origin(t[s]) }

// The c* functions call NCCL through the table. Each returns the raw
// ncclResult_t.

func cGetVersion(t *symTable) (int, Result) {
	var v int32
	r := dl.Call(t[symGetVersion], uintptr(unsafe.Pointer(&v)), 0, 0, 0, 0, 0, 0)
	return int(v), Result(r)
}

func cGetUniqueId(t *symTable) (UniqueID, Result) {
	var id UniqueID // 128 bytes, as ncclUniqueId
	r := dl.Call(t[symGetUniqueId], uintptr(unsafe.Pointer(&id)), 0, 0, 0, 0, 0, 0)
	return id, Result(r)
}

// commSlot is C memory for the ncclComm_t a creating call writes. Inside
// an NCCL group the library writes it only at ncclGroupEnd, after the call
// has returned, so it must never be Go memory. A slot still empty after the
// call is leaked on purpose (8 bytes): NCCL may write it later.
type commSlot struct{ p *uintptr }

func newCommSlot() commSlot { return commSlot{p: (*uintptr)(dl.Calloc(unsafe.Sizeof(uintptr(0))))} }

func (s commSlot) addr() uintptr { return uintptr(unsafe.Pointer(s.p)) }

// take returns the handle and frees the slot, or 0 (keeping the slot)
// when NCCL has not written it yet.
func (s commSlot) take() commHandle {
	c := *s.p
	if c != 0 {
		dl.Free(unsafe.Pointer(s.p))
	}
	return c
}

func cCommInitRank(t *symTable, nranks int, id *UniqueID, rank int) (commHandle, Result) {
	slot := newCommSlot()
	r := callWithUniqueID(t[symCommInitRank], slot.addr(), nranks, id, rank, 0, false)
	return slot.take(), r
}

// ncclConfig is ncclConfig_t as of NCCL 2.28 (versioned, append-only: NCCL
// copies min(size, its own size) bytes and fills the rest with its
// defaults). TestConfigLayout checks the offsets against nccl.h's.
type ncclConfig struct {
	_                   structs.HostLayout
	size                uintptr // size_t
	magic               uint32
	version             uint32
	blocking            int32
	cgaClusterSize      int32
	minCTAs             int32
	maxCTAs             int32
	netName             uintptr // const char*
	splitShare          int32
	trafficClass        int32
	commName            uintptr // const char*
	collnetEnable       int32
	CTAPolicy           int32
	shrinkShare         int32
	nvlsCTAs            int32
	nChannelsPerNetPeer int32
	nvlinkCentricSched  int32
}

// ncclConfigUndefined is NCCL_CONFIG_UNDEF_INT (INT_MIN): "use the default".
const ncclConfigUndefined = -1 << 31

// cConfig is a C-allocated ncclConfig_t with its strings (C memory: the
// struct holds pointers, which Go memory passed to C must not).
type cConfig struct {
	p       *ncclConfig
	strings []unsafe.Pointer
}

func newCConfig(cfg *Config, blocking int) *cConfig {
	p := (*ncclConfig)(dl.Calloc(unsafe.Sizeof(ncclConfig{})))
	*p = ncclConfig{
		size:                unsafe.Sizeof(ncclConfig{}),
		magic:               0xcafebeef,
		version:             22800,
		blocking:            ncclConfigUndefined,
		cgaClusterSize:      ncclConfigUndefined,
		minCTAs:             ncclConfigUndefined,
		maxCTAs:             ncclConfigUndefined,
		splitShare:          ncclConfigUndefined,
		trafficClass:        ncclConfigUndefined,
		collnetEnable:       ncclConfigUndefined,
		CTAPolicy:           ncclConfigUndefined,
		shrinkShare:         ncclConfigUndefined,
		nvlsCTAs:            ncclConfigUndefined,
		nChannelsPerNetPeer: ncclConfigUndefined,
		nvlinkCentricSched:  ncclConfigUndefined,
	}
	cc := &cConfig{p: p}
	if blocking >= 0 {
		p.blocking = int32(blocking)
	}
	if cfg != nil {
		if cfg.CGAClusterSize > 0 {
			p.cgaClusterSize = int32(cfg.CGAClusterSize)
		}
		if cfg.MinCTAs > 0 {
			p.minCTAs = int32(cfg.MinCTAs)
		}
		if cfg.MaxCTAs > 0 {
			p.maxCTAs = int32(cfg.MaxCTAs)
		}
		if cfg.SplitShare {
			p.splitShare = 1
		}
		if cfg.NetName != "" {
			s := dl.CString(cfg.NetName)
			cc.strings = append(cc.strings, s)
			p.netName = uintptr(s)
		}
		if cfg.CommName != "" {
			s := dl.CString(cfg.CommName)
			cc.strings = append(cc.strings, s)
			p.commName = uintptr(s)
		}
	}
	return cc
}

func (c *cConfig) addr() uintptr {
	if c == nil {
		return 0
	}
	return uintptr(unsafe.Pointer(c.p))
}

// free releases the config. NCCL copies what it keeps (names included)
// during the call, so this runs right after it.
func (c *cConfig) free() {
	for _, s := range c.strings {
		dl.Free(s)
	}
	dl.Free(unsafe.Pointer(c.p))
}

func cCommInitRankConfig(t *symTable, nranks int, id *UniqueID, rank int, cfg *cConfig) (commHandle, Result) {
	slot := newCommSlot()
	r := callWithUniqueID(t[symCommInitRankConfig], slot.addr(), nranks, id, rank, cfg.addr(), true)
	return slot.take(), r
}

// cCommSplit returns the slot NCCL writes the child in: at once, or, on a
// non-blocking parent whose split is in progress, when the split's job
// ends (the parent's state says when).
func cCommSplit(t *symTable, c commHandle, color, key int, cfg *cConfig) (commSlot, Result) {
	slot := newCommSlot()
	r := dl.Call(t[symCommSplit], c, uintptr(color), uintptr(key), slot.addr(), cfg.addr(), 0, 0)
	return slot, Result(r)
}

func cCommDestroy(t *symTable, c commHandle) Result {
	return Result(dl.Call(t[symCommDestroy], c, 0, 0, 0, 0, 0, 0))
}

func cCommAbort(t *symTable, c commHandle) Result {
	return Result(dl.Call(t[symCommAbort], c, 0, 0, 0, 0, 0, 0))
}

func cCommGetAsyncError(t *symTable, c commHandle) (Result, Result) {
	var st int32
	r := dl.Call(t[symCommGetAsyncError], c, uintptr(unsafe.Pointer(&st)), 0, 0, 0, 0, 0)
	return Result(st), Result(r)
}

func cCommCount(t *symTable, c commHandle) (int, Result) {
	var n int32
	r := dl.Call(t[symCommCount], c, uintptr(unsafe.Pointer(&n)), 0, 0, 0, 0, 0)
	return int(n), Result(r)
}

func cCommUserRank(t *symTable, c commHandle) (int, Result) {
	var n int32
	r := dl.Call(t[symCommUserRank], c, uintptr(unsafe.Pointer(&n)), 0, 0, 0, 0, 0)
	return int(n), Result(r)
}

// cReduce calls f, symAllReduce or symReduceScatter (one prototype).
func cReduce(t *symTable, f sym, send, recv uintptr, n int64, dt DataType, op RedOp, c commHandle,
	s uintptr) Result {
	return Result(dl.Call(t[f], send, recv, uintptr(n), uintptr(dt), uintptr(op), c, s))
}

func cAllGather(t *symTable, send, recv uintptr, n int64, dt DataType, c commHandle, s uintptr) Result {
	return Result(dl.Call(t[symAllGather], send, recv, uintptr(n), uintptr(dt), c, s, 0))
}

func cBroadcast(t *symTable, send, recv uintptr, n int64, dt DataType, root int, c commHandle,
	s uintptr) Result {
	return Result(dl.Call(t[symBroadcast], send, recv, uintptr(n), uintptr(dt), uintptr(root), c, s))
}

func cSend(t *symTable, buf uintptr, n int64, dt DataType, peer int, c commHandle, s uintptr) Result {
	return Result(dl.Call(t[symSend], buf, uintptr(n), uintptr(dt), uintptr(peer), c, s, 0))
}

func cRecv(t *symTable, buf uintptr, n int64, dt DataType, peer int, c commHandle, s uintptr) Result {
	return Result(dl.Call(t[symRecv], buf, uintptr(n), uintptr(dt), uintptr(peer), c, s, 0))
}

func cGroupStart(t *symTable) Result { return Result(dl.Call(t[symGroupStart], 0, 0, 0, 0, 0, 0, 0)) }
func cGroupEnd(t *symTable) Result   { return Result(dl.Call(t[symGroupEnd], 0, 0, 0, 0, 0, 0, 0)) }

// cGetErrorString and cGetLastError copy the library's C string (static,
// or the library's own buffer) into a Go string.
func cGetErrorString(t *symTable, r Result) string {
	return dl.GoString(dl.CallPtr(t[symGetErrorString], uintptr(r), 0, 0))
}

func cGetLastError(t *symTable, c commHandle) string {
	return dl.GoString(dl.CallPtr(t[symGetLastError], c, 0, 0))
}
