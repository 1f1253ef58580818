//go:build !fairgo_dl_generic

#include "textflag.h"
#include "go_asm.h"

// The trampoline of call_amd64.go: a function of the System V AMD64 calling
// convention, called by runtime.cgocall on the system stack with a *frame in
// DI. It copies the frame to its own stack, makes the frame's context
// current when asked, calls the frame's function with a[0:6] in DI SI DX CX
// R8 R9 and a[6:11] on the stack, restores the previous context and returns
// the call's result in AX.
//
// Its own frame (hardware SP; 704 plus the saved BP keeps the 16-byte
// alignment the caller had, as each CALL needs):
//	0(SP) to 40(SP)	stack arguments a[6:11]
//	40(SP)	the caller's BX
//	48(SP)	the thread's previous context
//	56(SP) to 192(SP)	the copy of the frame
//	192(SP) to 704(SP)	the kernel parameter addresses (MaxKernelParams)

#define SAVEDBX 40
#define PREV 48
#define FRAME 56
#define PARAMS 192

GLOBL ·trampolineABI0(SB), NOPTR|RODATA, $8
DATA ·trampolineABI0(SB)/8, $fairgo_dl_trampoline(SB)

TEXT fairgo_dl_trampoline(SB), NOSPLIT, $704
	MOVQ BX, SAVEDBX(SP)

	// Copy the frame (136 bytes: 8 times 16 and 8).
	LEAQ FRAME(SP), BX // the copy, in a register that C functions preserve
	MOVOU 0(DI), X0
	MOVOU 16(DI), X1
	MOVOU 32(DI), X2
	MOVOU 48(DI), X3
	MOVOU 64(DI), X4
	MOVOU 80(DI), X5
	MOVOU 96(DI), X6
	MOVOU 112(DI), X7
	MOVQ  128(DI), AX
	MOVOU X0, 0(BX)
	MOVOU X1, 16(BX)
	MOVOU X2, 32(BX)
	MOVOU X3, 48(BX)
	MOVOU X4, 64(BX)
	MOVOU X5, 80(BX)
	MOVOU X6, 96(BX)
	MOVOU X7, 112(BX)
	MOVQ  AX, 128(BX)

	// Launch: a[9] = the addresses of the nvals slots at vals.
	MOVQ frame_nvals(BX), CX
	TESTQ CX, CX
	JZ   ctxswitch
	MOVQ frame_vals(BX), SI
	LEAQ PARAMS(SP), DX
	MOVQ DX, (frame_a+72)(BX)

params:
	MOVQ SI, 0(DX)
	ADDQ $8, SI
	ADDQ $8, DX
	DECQ CX
	JNZ  params

ctxswitch:
	MOVQ $0, PREV(SP)
	MOVQ frame_get(BX), R10
	TESTQ R10, R10
	JZ   call
	LEAQ PREV(SP), DI
	XORL AX, AX
	CALL R10 // cuCtxGetCurrent(&prev)
	TESTL AX, AX
	JNZ  done
	MOVQ frame_ctx(BX), DI
	CMPQ DI, PREV(SP)
	JEQ  call
	MOVQ frame_set(BX), R10
	XORL AX, AX
	CALL R10 // cuCtxSetCurrent(ctx)
	TESTL AX, AX
	JNZ  done

call:
	MOVQ (frame_a+48)(BX), AX
	MOVQ AX, 0(SP)
	MOVQ (frame_a+56)(BX), AX
	MOVQ AX, 8(SP)
	MOVQ (frame_a+64)(BX), AX
	MOVQ AX, 16(SP)
	MOVQ (frame_a+72)(BX), AX
	MOVQ AX, 24(SP)
	MOVQ (frame_a+80)(BX), AX
	MOVQ AX, 32(SP)
	MOVQ (frame_a+0)(BX), DI
	MOVQ (frame_a+8)(BX), SI
	MOVQ (frame_a+16)(BX), DX
	MOVQ (frame_a+24)(BX), CX
	MOVQ (frame_a+32)(BX), R8
	MOVQ (frame_a+40)(BX), R9
	MOVQ frame_fn(BX), R10
	XORL AX, AX
	CALL R10

	// Restore the previous context; the call's own result stands.
	MOVQ frame_get(BX), R10
	TESTQ R10, R10
	JZ   done
	MOVQ PREV(SP), DI
	CMPQ DI, frame_ctx(BX)
	JEQ  done
	MOVQ AX, (frame_a+0)(BX) // keep the result
	MOVQ frame_set(BX), R10
	XORL AX, AX
	CALL R10 // cuCtxSetCurrent(prev)
	MOVQ (frame_a+0)(BX), AX

done:
	MOVQ SAVEDBX(SP), BX
	RET
