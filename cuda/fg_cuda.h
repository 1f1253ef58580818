/*
 * fg_cuda.h: the few CUDA driver API declarations package cuda uses. The
 * package has no C code: it loads the driver (libcuda.so.1) with dlopen at
 * run time, resolves every function below by its exported name and calls
 * it from Go (calls.go). This header is the C statement of what calls.go
 * assumes, for the tests: TestGoMatchesHeader checks calls.go against it
 * (symbol order and names, constants, the copy struct's layout) and
 * TestDeclarationsMatchCUDAHeader checks it against a real cuda.h.
 *
 * FG_CU_SYMBOLS lists the functions: X(id, exported symbol, the name cuda.h
 * declares it under, return type, parameters). The exported symbol is what
 * the CUDA 11.8 header maps the plain name to (cuMemAlloc is #defined to
 * cuMemAlloc_v2, and so on), for code built without per-thread default
 * streams. TestDeclarationsMatchCUDAHeader compiles these declarations
 * against a real cuda.h, when one is installed, and checks every constant,
 * the struct layout, each prototype and each mapping.
 *
 * Declarations only.
 */
#ifndef FG_CUDA_H
#define FG_CUDA_H

#include <stddef.h>

#ifdef FG_CUDA_H_TYPES
/* The header check: cuda.h's own types, so that the prototypes compare exactly. */
typedef CUresult fg_CUresult;
typedef CUdevice_attribute fg_CUdevice_attribute;
typedef CUpointer_attribute fg_CUpointer_attribute;
typedef CUjit_option fg_CUjit_option;
typedef CUDA_MEMCPY2D fg_CUDA_MEMCPY2D;
#else
typedef int fg_CUresult;            /* enum cudaError_enum */
typedef int fg_CUdevice_attribute;  /* enum CUdevice_attribute_enum */
typedef int fg_CUpointer_attribute; /* enum CUpointer_attribute_enum */
typedef int fg_CUjit_option;        /* enum CUjit_option_enum */
typedef struct fg_memcpy2d fg_CUDA_MEMCPY2D;
#endif

typedef int fg_CUdevice;
typedef unsigned long long fg_CUdeviceptr; /* CUdeviceptr_v2 on 64-bit hosts */
typedef struct CUctx_st* fg_CUcontext;
typedef struct CUstream_st* fg_CUstream;
typedef struct CUevent_st* fg_CUevent;
typedef struct CUmod_st* fg_CUmodule;
typedef struct CUfunc_st* fg_CUfunction;
typedef struct CUarray_st* fg_CUarray;

/* CUDA_MEMCPY2D (CUDA_MEMCPY2D_v2). */
struct fg_memcpy2d {
	size_t srcXInBytes;
	size_t srcY;
	int srcMemoryType; /* CUmemorytype */
	const void* srcHost;
	fg_CUdeviceptr srcDevice;
	fg_CUarray srcArray;
	size_t srcPitch;
	size_t dstXInBytes;
	size_t dstY;
	int dstMemoryType;
	void* dstHost;
	fg_CUdeviceptr dstDevice;
	fg_CUarray dstArray;
	size_t dstPitch;
	size_t WidthInBytes;
	size_t Height;
};

/* The constants used, with cuda.h's values. */
#define FG_CUDA_SUCCESS 0
#define FG_CUDA_ERROR_INVALID_VALUE 1
#define FG_CUDA_ERROR_STUB_LIBRARY 34
#define FG_CUDA_ERROR_NO_DEVICE 100
#define FG_CUDA_ERROR_NOT_READY 600
#define FG_CU_STREAM_NON_BLOCKING 0x1
#define FG_CU_EVENT_DEFAULT 0x0
#define FG_CU_EVENT_DISABLE_TIMING 0x2
#define FG_CU_MEMORYTYPE_DEVICE 0x2
#define FG_CU_DEVICE_ATTRIBUTE_MAX_PITCH 11
#define FG_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define FG_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define FG_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define FG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define FG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define FG_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define FG_CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define FG_CU_JIT_ERROR_LOG_BUFFER 5
#define FG_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6

/* clang-format off */
#define FG_CU_SYMBOLS(X) \
	X(Init,                      cuInit,                       cuInit,                       fg_CUresult, (unsigned int flags)) \
	X(DriverGetVersion,          cuDriverGetVersion,           cuDriverGetVersion,           fg_CUresult, (int* version)) \
	X(GetErrorName,              cuGetErrorName,               cuGetErrorName,               fg_CUresult, (fg_CUresult error, const char** str)) \
	X(GetErrorString,            cuGetErrorString,             cuGetErrorString,             fg_CUresult, (fg_CUresult error, const char** str)) \
	X(DeviceGetCount,            cuDeviceGetCount,             cuDeviceGetCount,             fg_CUresult, (int* count)) \
	X(DeviceGet,                 cuDeviceGet,                  cuDeviceGet,                  fg_CUresult, (fg_CUdevice* device, int ordinal)) \
	X(DeviceGetName,             cuDeviceGetName,              cuDeviceGetName,              fg_CUresult, (char* name, int len, fg_CUdevice dev)) \
	X(DeviceGetAttribute,        cuDeviceGetAttribute,         cuDeviceGetAttribute,         fg_CUresult, (int* pi, fg_CUdevice_attribute attrib, fg_CUdevice dev)) \
	X(DevicePrimaryCtxRetain,    cuDevicePrimaryCtxRetain,     cuDevicePrimaryCtxRetain,     fg_CUresult, (fg_CUcontext* pctx, fg_CUdevice dev)) \
	X(DevicePrimaryCtxRelease,   cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease,    fg_CUresult, (fg_CUdevice dev)) \
	X(CtxGetCurrent,             cuCtxGetCurrent,              cuCtxGetCurrent,              fg_CUresult, (fg_CUcontext* pctx)) \
	X(CtxSetCurrent,             cuCtxSetCurrent,              cuCtxSetCurrent,              fg_CUresult, (fg_CUcontext ctx)) \
	X(CtxSynchronize,            cuCtxSynchronize,             cuCtxSynchronize,             fg_CUresult, (void)) \
	X(CtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange,  cuCtxGetStreamPriorityRange,  fg_CUresult, (int* leastPriority, int* greatestPriority)) \
	X(CtxCreate,                 cuCtxCreate_v2,               cuCtxCreate,                  fg_CUresult, (fg_CUcontext* pctx, unsigned int flags, fg_CUdevice dev)) \
	X(CtxDestroy,                cuCtxDestroy_v2,              cuCtxDestroy,                 fg_CUresult, (fg_CUcontext ctx)) \
	X(CtxPopCurrent,             cuCtxPopCurrent_v2,           cuCtxPopCurrent,              fg_CUresult, (fg_CUcontext* pctx)) \
	X(StreamCreateWithPriority,  cuStreamCreateWithPriority,   cuStreamCreateWithPriority,   fg_CUresult, (fg_CUstream* phStream, unsigned int flags, int priority)) \
	X(StreamDestroy,             cuStreamDestroy_v2,           cuStreamDestroy,              fg_CUresult, (fg_CUstream hStream)) \
	X(StreamSynchronize,         cuStreamSynchronize,          cuStreamSynchronize,          fg_CUresult, (fg_CUstream hStream)) \
	X(StreamWaitEvent,           cuStreamWaitEvent,            cuStreamWaitEvent,            fg_CUresult, (fg_CUstream hStream, fg_CUevent hEvent, unsigned int flags)) \
	X(StreamGetCtx,              cuStreamGetCtx,               cuStreamGetCtx,               fg_CUresult, (fg_CUstream hStream, fg_CUcontext* pctx)) \
	X(EventCreate,               cuEventCreate,                cuEventCreate,                fg_CUresult, (fg_CUevent* phEvent, unsigned int flags)) \
	X(EventDestroy,              cuEventDestroy_v2,            cuEventDestroy,               fg_CUresult, (fg_CUevent hEvent)) \
	X(EventRecord,               cuEventRecord,                cuEventRecord,                fg_CUresult, (fg_CUevent hEvent, fg_CUstream hStream)) \
	X(EventQuery,                cuEventQuery,                 cuEventQuery,                 fg_CUresult, (fg_CUevent hEvent)) \
	X(EventSynchronize,          cuEventSynchronize,           cuEventSynchronize,           fg_CUresult, (fg_CUevent hEvent)) \
	X(EventElapsedTime,          cuEventElapsedTime,           cuEventElapsedTime,           fg_CUresult, (float* pMilliseconds, fg_CUevent hStart, fg_CUevent hEnd)) \
	X(MemAlloc,                  cuMemAlloc_v2,                cuMemAlloc,                   fg_CUresult, (fg_CUdeviceptr* dptr, size_t bytesize)) \
	X(MemFree,                   cuMemFree_v2,                 cuMemFree,                    fg_CUresult, (fg_CUdeviceptr dptr)) \
	X(MemAllocHost,              cuMemAllocHost_v2,            cuMemAllocHost,               fg_CUresult, (void** pp, size_t bytesize)) \
	X(MemFreeHost,               cuMemFreeHost,                cuMemFreeHost,                fg_CUresult, (void* p)) \
	X(MemGetInfo,                cuMemGetInfo_v2,              cuMemGetInfo,                 fg_CUresult, (size_t* freeBytes, size_t* totalBytes)) \
	X(MemcpyHtoD,                cuMemcpyHtoD_v2,              cuMemcpyHtoD,                 fg_CUresult, (fg_CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount)) \
	X(MemcpyDtoH,                cuMemcpyDtoH_v2,              cuMemcpyDtoH,                 fg_CUresult, (void* dstHost, fg_CUdeviceptr srcDevice, size_t ByteCount)) \
	X(MemsetD8,                  cuMemsetD8_v2,                cuMemsetD8,                   fg_CUresult, (fg_CUdeviceptr dstDevice, unsigned char uc, size_t N)) \
	X(MemcpyHtoDAsync,           cuMemcpyHtoDAsync_v2,         cuMemcpyHtoDAsync,            fg_CUresult, (fg_CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, fg_CUstream hStream)) \
	X(MemcpyDtoHAsync,           cuMemcpyDtoHAsync_v2,         cuMemcpyDtoHAsync,            fg_CUresult, (void* dstHost, fg_CUdeviceptr srcDevice, size_t ByteCount, fg_CUstream hStream)) \
	X(MemcpyDtoDAsync,           cuMemcpyDtoDAsync_v2,         cuMemcpyDtoDAsync,            fg_CUresult, (fg_CUdeviceptr dstDevice, fg_CUdeviceptr srcDevice, size_t ByteCount, fg_CUstream hStream)) \
	X(Memcpy2DAsync,             cuMemcpy2DAsync_v2,           cuMemcpy2DAsync,              fg_CUresult, (const fg_CUDA_MEMCPY2D* pCopy, fg_CUstream hStream)) \
	X(PointerGetAttributes,      cuPointerGetAttributes,       cuPointerGetAttributes,       fg_CUresult, (unsigned int numAttributes, fg_CUpointer_attribute* attributes, void** data, fg_CUdeviceptr ptr)) \
	X(ModuleLoadDataEx,          cuModuleLoadDataEx,           cuModuleLoadDataEx,           fg_CUresult, (fg_CUmodule* module, const void* image, unsigned int numOptions, fg_CUjit_option* options, void** optionValues)) \
	X(ModuleUnload,              cuModuleUnload,               cuModuleUnload,               fg_CUresult, (fg_CUmodule hmod)) \
	X(ModuleGetFunction,         cuModuleGetFunction,          cuModuleGetFunction,          fg_CUresult, (fg_CUfunction* hfunc, fg_CUmodule hmod, const char* name)) \
	X(ModuleGetGlobal,           cuModuleGetGlobal_v2,         cuModuleGetGlobal,            fg_CUresult, (fg_CUdeviceptr* dptr, size_t* bytes, fg_CUmodule hmod, const char* name)) \
	X(LaunchKernel,              cuLaunchKernel,               cuLaunchKernel,               fg_CUresult, (fg_CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, fg_CUstream hStream, void** kernelParams, void** extra))
/* clang-format on */

#define FG_CU_ENUM(id, sym, plain, ret, params) FG_CU_##id,
enum { FG_CU_SYMBOLS(FG_CU_ENUM) FG_CU_NSYM };
#undef FG_CU_ENUM

#define FG_CU_PFN(id, sym, plain, ret, params) typedef ret(*fg_pfn_##id) params;
FG_CU_SYMBOLS(FG_CU_PFN)
#undef FG_CU_PFN

#endif
