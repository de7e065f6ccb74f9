// backends/cuda_abi_check.cc: runtime/cuda_runtime.cc calls libcudart through dlopen with
// constants and a struct layout written by hand (libweft has no CUDA headers). This file, compiled
// wherever CUDA's headers are found, fails the build if any of them differs from the real ones.
// It holds no code: the static_asserts are the check.
#include <cstddef>

#include <cuda_runtime_api.h>

static_assert(cudaSuccess == 0, "cuda_runtime.cc: kCudaSuccess");
static_assert(cudaErrorNotReady == 600, "cuda_runtime.cc: kCudaErrorNotReady");
static_assert(cudaMemcpyDefault == 4, "cuda_runtime.cc: kMemcpyDefault");
static_assert(cudaHostAllocPortable == 1, "cuda_runtime.cc: kHostAllocPortable");
static_assert(cudaStreamNonBlocking == 1, "cuda_runtime.cc: kStreamNonBlocking");
static_assert(cudaEventDisableTiming == 2, "cuda_runtime.cc: kEventDisableTiming");
static_assert(cudaMemoryTypeDevice == 2, "cuda_runtime.cc: kMemoryTypeDevice");
static_assert(cudaMemoryTypeManaged == 3, "cuda_runtime.cc: kMemoryTypeManaged");
// cuda_runtime.cc's PointerAttributes: int type, int device, then the two pointers.
static_assert(offsetof(cudaPointerAttributes, type) == 0, "cudaPointerAttributes::type");
static_assert(offsetof(cudaPointerAttributes, device) == sizeof(int),
              "cudaPointerAttributes::device");
static_assert(offsetof(cudaPointerAttributes, devicePointer) == 2 * sizeof(int),
              "cudaPointerAttributes::devicePointer");
static_assert(offsetof(cudaPointerAttributes, hostPointer) == 2 * sizeof(int) + sizeof(void*),
              "cudaPointerAttributes::hostPointer");
static_assert(sizeof(cudaError_t) == sizeof(int), "cudaError_t is passed as int");
