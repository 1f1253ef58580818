package cuda

import (
	"fmt"

	"github.com/fairgo/fairgo"
)

// Special stream handles of the CUDA driver and runtime APIs.
const (
	// StreamLegacy is CU_STREAM_LEGACY (cudaStreamLegacy): the legacy
	// default stream, which synchronises with the other blocking streams of
	// its context. Handle 0 means the same unless code is compiled for
	// per-thread default streams.
	StreamLegacy uintptr = 0x1
	// StreamPerThread is CU_STREAM_PER_THREAD (cudaStreamPerThread).
	StreamPerThread uintptr = 0x2
)

// ForeignStream wraps a CUstream (= cudaStream_t) that someone else created
// and owns, such as PyTorch's torch.cuda.current_stream().cuda_stream, so
// that it can be passed to hier.After and Work.StreamWait. 0,
// StreamLegacy and StreamPerThread name this device's default streams.
//
// The stream must belong to the device's primary context (the context of
// the CUDA runtime, and so of PyTorch); ForeignStream asks the driver
// (cuStreamGetCtx) and returns an *fairgo.ArgError when it belongs to
// another context, for example to another GPU. It cannot detect a handle
// that is not a stream at all, or one already destroyed (the driver's
// behaviour is undefined then): the caller keeps the stream alive while
// work it was passed to is pending.
//
// The wrapper never destroys the stream: Close only marks the wrapper
// closed. Wrapping is cheap (one driver call); wrap per call rather than
// caching a handle that its owner may destroy and reuse.
func (d *Device) ForeignStream(handle uintptr) (*Stream, error) {
	if err := d.alive(); err != nil {
		return nil, err
	}
	ctx, err := streamCtx(d.ctx, cStreamFromHandle(handle))
	if err != nil {
		return nil, fmt.Errorf("cuda: foreign stream %#x on %v: %w", handle, d, err)
	}
	if ctx != d.ctx {
		return nil, &fairgo.ArgError{Arg: "stream", Value: fmt.Sprintf("%#x", handle),
			Reason: fmt.Sprintf(
				"belongs to another CUDA context than %v's (another GPU, or a context the caller created)",
				d,
			)}
	}
	return d.WrapStream(handle), nil
}
