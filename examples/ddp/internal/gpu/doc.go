// Package gpu is the GPU half of examples/ddp: the training kernels of
// train.cu (an MLP's matrix products, activations, loss, SGD and a
// synthetic data generator), loaded from their embedded PTX through the
// library's module loader (cuda.Device.LoadModule) and launched on the
// trainer's streams. The library's cuda package carries only the kernels
// the engine needs; a trainer keeps its own, as this example does.
package gpu
