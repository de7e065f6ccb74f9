// backends/nccl/cuda_util.h: CUDA runtime calls of the nccl backend, failing as weft::Error.
//
// The module links libcudart (never the driver, libcuda: the runtime loads it, and on a machine
// without a driver every call fails cleanly with cudaErrorInsufficientDriver instead of the
// module failing to load).
//
// Thread safety: plain functions; the current device is per thread, as in CUDA.
#pragma once

#include <string_view>

#include <cuda_runtime_api.h>

#include "weft/error.h"

namespace weft::nccl {

// Throws Error(Internal, context, "<what>: cuda error N (<name>: <string>)") unless `status` is
// cudaSuccess, and clears CUDA's last (non-sticky) error so that the next call is not blamed.
void check_cuda(cudaError_t status, std::string_view what, const ErrorContext& context);

// Makes `device` the calling thread's current device, after checking that it exists: throws
// Error(Unsupported) naming cudaGetDeviceCount's error when no device is usable (no driver, no
// GPU), and Error(InvalidArgument) when `device` is not below the count.
void use_device(int device, const ErrorContext& context);

// The calling thread's current device (cudaGetDevice), with use_device()'s errors.
int current_device(const ErrorContext& context);

// use_device(device) for a scope, then the thread's previous device again: a collective posted on
// cuda:1 from a thread whose current device is cuda:0 leaves it at cuda:0, as c10d's device guard
// does. Throws as use_device().
class DeviceGuard {
 public:
  DeviceGuard(int device, const ErrorContext& context);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace weft::nccl
