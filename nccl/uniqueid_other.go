//go:build !amd64 && !arm64

package nccl

// callWithUniqueID would pass ncclUniqueId by value; only the amd64 and
// arm64 calling conventions are spelled out (uniqueid_amd64.go,
// uniqueid_arm64.go), the platforms NCCL ships for.
func callWithUniqueID(fn, comm uintptr, nranks int, id *UniqueID, rank int, config uintptr, withConfig bool) Result {
	return InternalError
}
