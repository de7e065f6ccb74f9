// runtime/cuda_runtime.h: the few CUDA runtime calls weft's core makes for CUDA tensors on host
// backends (staging through pinned buffers) and for tools (weft-perf -d cuda), without linking
// CUDA: libweft loads libcudart when a CUDA tensor first needs it (dlopen, never at start-up),
// so everything else runs on machines with no CUDA at all.
//
//   CudaRuntime& cuda = cuda_runtime();      // Error(Unsupported) naming what is missing
//   void* device = cuda.device_alloc(0, bytes);
//
// The library is found as `libcudart.so.13` (then .12, then libcudart.so) through the loader's
// path, then in $WEFT_CUDA_HOME, $CUDA_HOME and /usr/local/cuda (lib64, lib). Tests may put an
// implementation of their own in its place (set_cuda_runtime_for_testing): the staging logic is
// then tested on machines without a GPU, against memory the test itself calls "device" memory.
//
// Thread safety: every method may be called from any thread (the CUDA runtime is thread-safe;
// the current device is per thread, and each method that takes a device sets it first).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "weft/cuda.h"
#include "weft/error.h"

namespace weft {

// An opaque cudaEvent_t.
using CudaEvent = void*;

class CudaRuntime {
 public:
  virtual ~CudaRuntime() = default;

  // Where the runtime came from ("libcudart.so.13 (CUDA 13.0)", "test runtime"): for messages.
  virtual std::string describe() const = 0;

  // Devices visible to this process. Throws Error(Unsupported) naming CUDA's reason when there is
  // no usable device (no driver: "CUDA driver version is insufficient...", no GPU).
  virtual int device_count() = 0;
  // Makes `device` the calling thread's current device.
  virtual void set_device(int device) = 0;
  // The device `pointer` lies on, or -1 when it is host memory (pageable or pinned).
  virtual int device_of(const void* pointer) = 0;

  // Page-locked host memory (cudaHostAlloc, portable). Freed by host_free.
  virtual void* host_alloc(size_t bytes) = 0;
  virtual void host_free(void* pointer) = 0;
  // Device memory on `device` (cudaMalloc). Freed by device_free.
  virtual void* device_alloc(int device, size_t bytes) = 0;
  virtual void device_free(void* pointer) = 0;

  // Copies `bytes` (either direction, cudaMemcpyDefault) in `stream`'s order; returns at once.
  virtual void copy_async(void* dst, const void* src, size_t bytes, CudaStream stream) = 0;
  // Copies on the legacy default stream and waits for the copy.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Fills `bytes` of device memory with `value` and waits.
  virtual void fill(void* dst, int value, size_t bytes) = 0;

  // A non-blocking stream on `device` (cudaStreamNonBlocking), destroyed by destroy_stream.
  virtual CudaStream create_stream(int device) = 0;
  virtual void destroy_stream(CudaStream stream) = 0;
  // Waits until everything queued on `stream` has run.
  virtual void synchronize_stream(CudaStream stream) = 0;

  // An event without timing on `device`, destroyed by destroy_event.
  virtual CudaEvent create_event(int device) = 0;
  virtual void destroy_event(CudaEvent event) = 0;
  virtual void record_event(CudaEvent event, CudaStream stream) = 0;
  // Whether the work before the event's record has run. Throws Error(Internal) on a device error.
  virtual bool event_done(CudaEvent event) = 0;
  // Makes `stream` wait for `event` (no host block).
  virtual void stream_wait_event(CudaStream stream, CudaEvent event) = 0;
};

// The process's runtime: loaded on first use, kept for the process's life. Throws
// Error(Unsupported) saying which files were tried and why each was refused.
CudaRuntime& cuda_runtime();

// Replaces the runtime cuda_runtime() returns (nullptr: back to the real one) and returns the
// previous replacement. For tests; not thread-safe against concurrent cuda_runtime() users.
CudaRuntime* set_cuda_runtime_for_testing(CudaRuntime* runtime);

}  // namespace weft
