package fairgo

import (
	"fmt"
	"math"
)

// Tensor is a span of device memory holding Count elements of DType starting
// at Ptr. Bytes is how many bytes from Ptr the caller owns (at least
// Count × DType.Size()); it lets fairgo reject a buffer that is too short
// before anything is enqueued. Ptr is a device address: a CUDA device pointer
// on the GPU backend, an address in a simulated device's memory on sim.
type Tensor struct {
	Ptr   uintptr
	Bytes int64
	Count int64
	DType DType
}

// ByteLen is Count × DType.Size(), the bytes the elements occupy.
func (t Tensor) ByteLen() int64 { return t.Count * int64(t.DType.Size()) }

// Validate checks the type, the count and the length, without touching
// memory. It returns an *ArgError.
func (t Tensor) Validate() error {
	if !t.DType.Valid() {
		return &ArgError{Arg: "dtype", Value: t.DType, Reason: "unknown element type", Err: ErrUnknownDType}
	}
	if t.Count < 0 {
		return &ArgError{Arg: "count", Value: t.Count, Reason: "negative"}
	}
	size := int64(t.DType.Size())
	if t.Count > math.MaxInt64/size {
		return &ArgError{Arg: "count", Value: t.Count, Reason: fmt.Sprintf("count × %d bytes overflows int64", size)}
	}
	if t.Bytes < 0 {
		return &ArgError{Arg: "bytes", Value: t.Bytes, Reason: "negative"}
	}
	if need := t.Count * size; need > t.Bytes {
		return &ArgError{
			Arg:    "buffer",
			Value:  t.Bytes,
			Reason: fmt.Sprintf("%d bytes is shorter than count %d × %d bytes = %d", t.Bytes, t.Count, size, need),
		}
	}
	if t.Count > 0 && t.Ptr == 0 {
		return &ArgError{Arg: "ptr", Value: "0", Reason: "null device address"}
	}
	if uint64(t.Ptr) > math.MaxUint64-uint64(t.Bytes) {
		return &ArgError{Arg: "ptr", Value: t.Ptr, Reason: "address range wraps around"}
	}
	return nil
}

// Slice returns elements [from, from+n) as a tensor of its own.
func (t Tensor) Slice(from, n int64) Tensor {
	size := int64(t.DType.Size())
	return Tensor{Ptr: t.Ptr + uintptr(from*size), Bytes: n * size, Count: n, DType: t.DType}
}
