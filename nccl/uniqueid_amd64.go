package nccl

import (
	"unsafe"

	"github.com/ebitengine/purego"
)

// callWithUniqueID calls ncclCommInitRank(comm*, nranks, id, rank) or, with
// config, ncclCommInitRankConfig(comm*, nranks, id, rank, config*), whose
// ncclUniqueId (struct { char internal[128]; }) is passed by value.
//
// System V AMD64: a struct larger than 16 bytes is of class MEMORY and is
// passed in the argument area on the stack, in order, taking no register;
// the integer arguments around it take the registers in order. So comm*,
// nranks, rank and config* go in DI, SI, DX and CX, and the id's 16
// eight-byte words are the stack arguments, at 0(SP) to 120(SP) at the
// call. purego.SyscallN passes its arguments 1 to 6 in those registers and
// 7 onward on the stack from 0(SP), so the id's words follow six register
// words. (purego.RegisterFunc could pass a Go struct by value too, through
// reflection; this is the same layout spelled out, and the fake library of
// nccl_test.go, compiled with the system's C compiler, checks it.)
func callWithUniqueID(fn, comm uintptr, nranks int, id *UniqueID, rank int, config uintptr, withConfig bool) Result {
	var w [16]uintptr
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), len(id)), id[:])
	if !withConfig {
		config = 0 // CX, unused by ncclCommInitRank
	}
	r, _, _ := purego.SyscallN(fn, comm, uintptr(nranks), uintptr(rank), config, 0, 0,
		w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9], w[10], w[11], w[12], w[13], w[14], w[15])
	return Result(int32(r))
}
