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
//
// A Tensor made by Slice outside its parent's memory carries the error:
// Validate, and so every collective, refuses it with an *ArgError naming
// the bounds.
type Tensor struct {
	Ptr   uintptr
	Bytes int64
	Count int64
	DType DType

	invalid *ArgError // why Slice refused this tensor; nil for any other
}

// ByteLen is Count × DType.Size(), the bytes the elements occupy.
func (t Tensor) ByteLen() int64 { return t.Count * int64(t.DType.Size()) }

// Validate checks the type, the count and the length, without touching
// memory. It returns an *ArgError.
func (t Tensor) Validate() error {
	if t.invalid != nil {
		return t.invalid
	}
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
	if t.Count > 0 && int64(t.Ptr)%size != 0 {
		// A GPU kernel that loads such an element faults, and the fault
		// ends the process's whole CUDA context, not just the call.
		return &ArgError{Arg: "ptr", Value: fmt.Sprintf("%#x", t.Ptr),
			Reason: fmt.Sprintf("not a multiple of its %d-byte elements", size)}
	}
	if uint64(t.Ptr) > math.MaxUint64-uint64(t.Bytes) {
		return &ArgError{Arg: "ptr", Value: t.Ptr, Reason: "address range wraps around"}
	}
	return nil
}

// Slice returns elements [from, from+n) as a tensor of its own. The slice
// must lie within the memory t owns (its Bytes, as a Go slice expression
// may reach up to the capacity); from and n must not be negative.
//
// A slice outside those bounds does not panic (fairgo reports misuse as
// errors): it returns a tensor that holds no memory (Bytes 0, at t's Ptr,
// never before or after it) and that Validate, and so every collective
// and Upload, Write and Download, refuses with an *ArgError (Arg "slice")
// naming the bounds. A slice of a tensor Validate refuses carries its
// parent's error.
func (t Tensor) Slice(from, n int64) Tensor {
	if err := t.Validate(); err != nil {
		ae, ok := err.(*ArgError)
		if !ok {
			ae = &ArgError{Arg: "tensor", Value: t.Ptr, Reason: err.Error()}
		}
		return Tensor{Ptr: t.Ptr, Count: max(n, 0), DType: t.DType, invalid: ae}
	}
	size := int64(t.DType.Size())
	elems := t.Bytes / size // the elements t's memory holds
	if from < 0 || n < 0 || from > elems || n > elems-from {
		end := fmt.Sprint(from + n)
		if n > 0 && from > math.MaxInt64-n {
			end = fmt.Sprintf("%d+%d", from, n)
		}
		return Tensor{Ptr: t.Ptr, Count: max(n, 0), DType: t.DType, invalid: &ArgError{
			Arg:   "slice",
			Value: fmt.Sprintf("[%d, %s)", from, end),
			Reason: fmt.Sprintf("outside the tensor's elements [0, %d) (%d bytes of %s)",
				elems, t.Bytes, t.DType),
		}}
	}
	return Tensor{Ptr: t.Ptr + uintptr(from*size), Bytes: n * size, Count: n, DType: t.DType}
}
