#include "backends/nccl/cuda_util.h"

#include <cstdlib>

#include <fmt/format.h>

namespace weft::nccl {
namespace {

// The device count, or Error(Unsupported) saying why there is none. Asked at each use: it is
// cheap once the runtime is initialised, and a failure must name CUDA's own reason.
int device_count(const ErrorContext& context) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::Unsupported, context,
                fmt::format("backend \"nccl\" has no usable CUDA device: cudaGetDeviceCount "
                            "failed with error {} ({}: {})",
                            static_cast<int>(status), cudaGetErrorName(status),
                            cudaGetErrorString(status)));
  }
  if (count == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw Error(ErrorCode::Unsupported, context,
                fmt::format("backend \"nccl\" has no usable CUDA device: none is visible to this "
                            "process (CUDA_VISIBLE_DEVICES=\"{}\")",
                            visible ? visible : ""));
  }
  return count;
}

}  // namespace

void check_cuda(cudaError_t status, std::string_view what, const ErrorContext& context) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw Error(ErrorCode::Internal, context,
              fmt::format("{}: cuda error {} ({}: {})", what, static_cast<int>(status),
                          cudaGetErrorName(status), cudaGetErrorString(status)));
}

void use_device(int device, const ErrorContext& context) {
  const int count = device_count(context);
  if (device < 0 || device >= count) {
    throw Error(ErrorCode::InvalidArgument, context,
                fmt::format("the tensors are on cuda:{}, but this process sees {} CUDA "
                            "device{} (cuda:0..cuda:{})",
                            device, count, count == 1 ? "" : "s", count - 1));
  }
  check_cuda(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device), context);
}

int current_device(const ErrorContext& context) {
  device_count(context);
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice", context);
  return device;
}

DeviceGuard::DeviceGuard(int device, const ErrorContext& context) {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    cudaGetLastError();
    previous = -1;
  }
  use_device(device, context);
  previous_ = previous == device ? -1 : previous;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace weft::nccl
