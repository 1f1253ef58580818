package fairgo

import (
	"encoding/binary"
	"fmt"
)

// HostCopier is a device that copies between host memory and its own,
// waiting for the copy: *sim.Device and *cuda.Device are. Upload and
// Download use it to move typed slices.
type HostCopier interface {
	AllocTensor(count int64, dt DType) (Tensor, error)
	Upload(dst uintptr, src []byte) error
	Download(dst []byte, src uintptr) error
}

// Element is a Go type with a fairgo element type. 16-bit floats have none:
// Upload16 and Download16 move their bits as uint16, and Float32sToBFloat16,
// Float32sToFloat16 and their inverses convert them.
type Element interface {
	float32 | float64 | int8 | uint8 | int32 | uint32 | int64 | uint64
}

// DTypeOf is the element type of T.
func DTypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case int8:
		return Int8
	case uint8:
		return Uint8
	case int32:
		return Int32
	case uint32:
		return Uint32
	case int64:
		return Int64
	default: // uint64: the constraint allows nothing else
		return Uint64
	}
}

// Upload allocates a tensor of len(vals) elements on dev and copies vals
// into it (little-endian, as GPUs and the simulated device store them). The
// device owns the memory: dev.Free(t.Ptr), or the device's Close, frees it.
func Upload[T Element](dev HostCopier, vals []T) (Tensor, error) {
	t, err := dev.AllocTensor(int64(len(vals)), DTypeOf[T]())
	if err != nil {
		return Tensor{}, err
	}
	if err := Write(dev, t, vals); err != nil {
		return Tensor{}, err
	}
	return t, nil
}

// Write copies vals into the first len(vals) elements of t, a tensor of
// dev whose element type is T's.
func Write[T Element](dev HostCopier, t Tensor, vals []T) error {
	if err := check[T](t, int64(len(vals))); err != nil {
		return err
	}
	if len(vals) == 0 {
		return nil
	}
	b, err := binary.Append(make([]byte, 0, len(vals)*DTypeOf[T]().Size()), binary.LittleEndian, vals)
	if err != nil {
		return fmt.Errorf("fairgo: encoding %d %v: %w", len(vals), t.DType, err)
	}
	return dev.Upload(t.Ptr, b)
}

// Download copies the elements of t, a tensor of dev whose element type is
// T's, into a new slice, with the device's Download: on a GPU it waits for
// all of the device's work first; the simulated device does not wait for
// its streams, so wait for the Work that writes t before.
func Download[T Element](dev HostCopier, t Tensor) ([]T, error) {
	if err := check[T](t, t.Count); err != nil {
		return nil, err
	}
	out := make([]T, t.Count)
	if t.Count == 0 {
		return out, nil
	}
	b := make([]byte, t.ByteLen())
	if err := dev.Download(b, t.Ptr); err != nil {
		return nil, err
	}
	if _, err := binary.Decode(b, binary.LittleEndian, out); err != nil {
		return nil, fmt.Errorf("fairgo: decoding %d %v: %w", t.Count, t.DType, err)
	}
	return out, nil
}

// check validates t and that it holds at least n elements of T.
func check[T Element](t Tensor, n int64) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if want := DTypeOf[T](); t.DType != want {
		return &ArgError{Arg: "tensor", Value: t.DType, Reason: fmt.Sprintf("holds %v, not %v", t.DType, want)}
	}
	if n > t.Count {
		return &ArgError{Arg: "values", Value: n, Reason: fmt.Sprintf("more than the tensor's %d elements", t.Count)}
	}
	return nil
}
