// Package dl holds fg_dl.h, the C helpers of dlopen, dlsym and dladdr that
// the cgo code of packages cuda and nccl includes. It has no Go code: cuda
// and nccl import it blank so that `go mod vendor` copies the header with
// them.
package dl
