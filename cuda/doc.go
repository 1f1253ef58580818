// Package cuda is fairgo's GPU backend: it runs the engine of package hier
// on NVIDIA GPUs, driving each GPU through its primary context (so buffers
// and streams interoperate with the CUDA runtime and PyTorch) and the
// collectives through NCCL. Its Backend builds the devices and
// communicators of a job for setup.New, and ForeignStream lets a caller's
// own stream (PyTorch's current stream) order fairgo's work.
//
// The package builds everywhere, with no build tag, no CUDA headers and no
// GPU: it declares the few driver functions it uses itself and loads the
// CUDA driver (libcuda.so.1, or $FAIRGO_CUDA_LIBRARY) with dlopen on first
// use (Load, Count, Open), as package nccl loads NCCL. Nothing happens when
// the package is imported. Without a driver or a GPU, Load and everything
// that needs the driver return a *LoadError that names every path tried and
// what failed, and matches fairgo.ErrNoDevice; a program can then fall
// back to the simulated backend or stop with that one line. The driver
// must support CUDA 11.8 (MinDriverVersion: NVIDIA's 520 drivers or newer),
// as the reduce kernels are embedded as PTX ISA 7.8 that the driver
// compiles for the GPU at Open.
//
// The main types:
//
//   - Device: one GPU (Open(ordinal)), its memory, streams, events and the
//     reduce kernels from embedded PTX; it implements backend.Device.
//   - Stream: a CUDA stream of a Device (CreateStream), or a wrapper of
//     someone else's stream (ForeignStream, WrapStream) that is never
//     destroyed by fairgo.
//   - Event: a CUDA event of a Device (CreateEvent), the hand-over between
//     the pipeline's stages.
//   - Module and Function: a trainer's own kernels, loaded from PTX or a
//     cubin (Device.LoadModule) and launched on a Stream.
//   - Comm: an NCCL communicator on a Device; it implements backend.Comm.
//   - Backend: the backend.Backend of GPUs, for setup.New(ctx, nil,
//     cuda.Backend{}).
package cuda
