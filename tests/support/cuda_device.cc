// tests/support/cuda_device.h's skip-without-a-device, through libweft's CUDA runtime loader.
#include "tests/support/cuda_device.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "runtime/cuda_runtime.h"

namespace weft::test {

int cuda_devices_or_skip(std::string_view what) {
  std::string reason;
  try {
    const int count = cuda_runtime().device_count();
    if (count > 0) return count;
    reason = "none visible";
  } catch (const std::exception& e) {
    reason = e.what();
  }
  std::printf("skipped: %.*s needs a CUDA device: %s\n", static_cast<int>(what.size()), what.data(),
              reason.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

int use_cuda_device_for(int local_rank) {
  CudaRuntime& cuda = cuda_runtime();
  const int device = local_rank % cuda.device_count();
  cuda.set_device(device);
  return device;
}

}  // namespace weft::test
