// Package fairgo holds the vocabulary shared by every layer of the fairgo
// two-level allreduce: element types, reduction operators, device tensors and
// the error values callers test with errors.Is and errors.As.
//
// The collectives themselves live in package hier; the GPU backend in cuda
// (loaded at run time: see its Load) and the in-process simulated cluster
// in sim.
package fairgo
