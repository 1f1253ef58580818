// fg_ctx.h: shared by the cgo preambles of package cuda.
#ifndef FG_CTX_H
#define FG_CTX_H
#include <cuda.h>

// FG_IN_CTX makes ctx current for one driver call, returns the call's
// result, and restores the previous context (so the calling thread may be
// any goroutine's; it cannot change threads during one cgo call).
#define FG_IN_CTX(ctx, call)                                    \
	CUcontext fg_prev = NULL;                                   \
	CUresult fg_r = cuCtxGetCurrent(&fg_prev);                  \
	if (fg_r != CUDA_SUCCESS) return fg_r;                      \
	if (fg_prev != (ctx)) {                                     \
		fg_r = cuCtxSetCurrent(ctx);                            \
		if (fg_r != CUDA_SUCCESS) return fg_r;                  \
	}                                                           \
	fg_r = (call);                                              \
	if (fg_prev != (ctx)) cuCtxSetCurrent(fg_prev);             \
	return fg_r;

#endif
