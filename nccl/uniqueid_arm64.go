package nccl

import (
	"unsafe"

	"github.com/fairgo/fairgo/internal/dl"
)

// callWithUniqueID calls ncclCommInitRank(comm*, nranks, id, rank) or, with
// config, ncclCommInitRankConfig(comm*, nranks, id, rank, config*), whose
// ncclUniqueId (struct { char internal[128]; }) is passed by value.
//
// AAPCS64 (rule B.4): a composite type larger than 16 bytes is copied by
// the caller to memory it owns and replaced by a pointer to the copy, which
// takes the next integer register. So the arguments are comm*, nranks,
// &copy, rank and config* in X0 to X4. The copy is C memory, as the callee
// may write to it.
func callWithUniqueID(fn, comm uintptr, nranks int, id *UniqueID, rank int, config uintptr, withConfig bool) Result {
	cp := dl.Calloc(uintptr(len(id)))
	defer dl.Free(cp)
	copy(unsafe.Slice((*byte)(cp), len(id)), id[:])
	if !withConfig {
		config = 0
	}
	return Result(dl.Call(fn, comm, uintptr(nranks), uintptr(cp), uintptr(rank), config, 0, 0))
}
