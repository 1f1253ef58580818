package hier

// SetTopClass makes bytes the start of r's last, open-ended size class
// (instead of 64 MiB), so that a test on the simulator can measure every
// class of Auto at small sizes. Call it before r's first call, on every
// rank alike.
func SetTopClass(r *Reducer, bytes int64) { r.router.top = bytes }

// WorldVariants is how many world variants (FlatRing, FlatTree) r holds
// open now.
func WorldVariants(r *Reducer) int { return len(r.router.worldComms()) }

// Algorithms is every Algorithm but Auto.
func Algorithms() []Algorithm {
	var out []Algorithm
	for a := Auto + 1; a < numAlgorithms; a++ {
		out = append(out, a)
	}
	return out
}

// SetHalvingChunk makes r's halving-doubling run calls in pieces of at
// most bytes (instead of 16 MiB). Call it before r's first call.
func SetHalvingChunk(r *Reducer, bytes int64) { r.exec.hd.chunk = bytes }
