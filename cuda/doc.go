// Package cuda is fairgo's GPU backend: it runs the engine of package hier
// on NVIDIA GPUs, driving each GPU through its primary context (so buffers
// and streams interoperate with the CUDA runtime and PyTorch) and the
// collectives through NCCL, which is loaded at run time with dlopen. Its
// Backend builds the devices and communicators of a job for setup.New, and
// ForeignStream lets a caller's own stream (PyTorch's current stream) order
// fairgo's work.
//
// The package needs the build tag `cuda`: without it only this comment is
// compiled, and `GOFLAGS=-tags=cuda go doc ./cuda` shows the API. Building
// needs the CUDA headers and the driver stub (make cuda-deps; link with
// CGO_LDFLAGS=-L/usr/lib/x86_64-linux-gnu/stubs); NCCL is not needed to
// build. Running needs a GPU driver (libcuda.so.1): gorgonia.org/cu, which
// the package builds on, calls cuInit in its init function and exits the
// process when that fails, so a cuda-tagged binary (or libfairgo.so) stops at
// start-up on a host without a driver, before main runs.
//
// The main types:
//
//   - Device: one GPU (Open(ordinal)), its memory, streams, events and the
//     reduce kernels from embedded PTX; it implements hier.Device.
//   - Stream: a CUDA stream of a Device (CreateStream), or a wrapper of
//     someone else's stream (ForeignStream, WrapStream) that is never
//     destroyed by fairgo.
//   - Event: a CUDA event of a Device (CreateEvent), the hand-over between
//     the pipeline's stages.
//   - Comm: an NCCL communicator on a Device; it implements hier.Comm.
//   - Backend: the setup.Backend of GPUs, for setup.New(ctx, nil,
//     cuda.Backend{}).
package cuda
