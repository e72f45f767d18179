/* CPU emulation of the subset of the CUDA runtime API that src/backend/cuda uses
 * (C-compatible part). Development tool, not part of the library: see run.sh.
 *
 * Semantics: one device; device memory and pinned memory are host memory;
 * every stream operation runs synchronously when it is issued (a legal CUDA
 * schedule), so streams and events are trivially ordered; kernel launches run
 * their blocks one after another on the calling thread with one fiber per
 * CUDA thread (emu_device.hpp). Errors set the runtime's last error like CUDA. */
#ifndef ZOFF_EMU_RUNTIME_H
#define ZOFF_EMU_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDART_CB

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef void (*cudaHostFn_t)(void *userData);

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
};

#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02

typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
/* Emulated timing: an event's time is the host's monotonic clock when it was recorded (the
 * emulator runs stream work when it is issued); NotReady while its queued work is pending. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg);

/* emulator internals shared with emu_device.hpp */
void emu_set_error(cudaError_t e);
/* Number of live device allocations (leak check in run.sh). */
size_t emu_live_allocations(void);
/* Does [p, p + bytes) lie inside one live cudaMalloc/cudaMallocAsync allocation? */
int emu_device_range(const void *p, size_t bytes);

#ifdef __cplusplus
}
#include <functional>
/* Queue fn on stream s: it runs on the stream's worker thread after the work and
 * the waits issued on s so far, and later operations on s wait for it (emu.cpp,
 * "asynchronous work"). Used by the NCCL stand-in (nccl_emu.cpp). */
void emu_stream_enqueue(cudaStream_t s, std::function<void()> fn);
#endif
#endif
