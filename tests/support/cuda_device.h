// tests/support/cuda_device.h: what a test that needs a CUDA device calls before anything else.
//
//   // At namespace scope in the test's .cc, so that it runs before Catch2 starts: without a usable
//   // device the whole executable is skipped (exit 77, meson's "skipped") with CUDA's reason.
//   const int kDevices = weft::test::cuda_devices_or_skip("nccl_stream_test");
//
// Devices are found through libweft's CUDA runtime loader (runtime/cuda_runtime.h), so a test
// links no CUDA library and the reason is CUDA's own ("no usable CUDA device: cudaGetDeviceCount
// failed with error 35 (CUDA driver version is insufficient ...)"). Tests that need a device are
// registered in meson's 'gpu' suite (benchmarks/gpu/check runs it), besides 'all'.
//
// Thread safety: call from one thread (static initialisation or the test's main thread).
#pragma once

#include <string_view>

namespace weft::test {

// The number of usable CUDA devices (at least 1). Where there is none, prints
// "skipped: WHAT needs a CUDA device: REASON" on stdout and ends the process at once with status
// 77 (std::_Exit: no destructors, no Catch2 summary).
int cuda_devices_or_skip(std::string_view what);

// The device a process with this local rank uses, as nccl-tests picks one with one GPU per
// process: local_rank % the device count. Made the calling thread's current device.
// REQUIRES: a usable device (cuda_devices_or_skip returned).
int use_cuda_device_for(int local_rank);

}  // namespace weft::test
