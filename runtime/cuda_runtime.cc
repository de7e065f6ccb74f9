// The CUDA runtime, loaded on demand (runtime/cuda_runtime.h). libweft has no CUDA headers: the
// few entry points it calls are declared here with the runtime's C ABI (cudaError_t is an int
// enum, handles are pointers), and backends/cuda_abi_check.cc checks these constants against the
// real headers wherever CUDA is installed.
#include "runtime/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace weft {
namespace {

using cudaError = int;
constexpr cudaError kCudaSuccess = 0;
constexpr cudaError kCudaErrorNotReady = 600;
constexpr int kMemcpyDefault = 4;            // cudaMemcpyDefault
constexpr unsigned kHostAllocPortable = 1;   // cudaHostAllocPortable
constexpr unsigned kStreamNonBlocking = 1;   // cudaStreamNonBlocking
constexpr unsigned kEventDisableTiming = 2;  // cudaEventDisableTiming
constexpr int kMemoryTypeDevice = 2;         // cudaMemoryTypeDevice
constexpr int kMemoryTypeManaged = 3;        // cudaMemoryTypeManaged

// cudaPointerAttributes since CUDA 11: the type first, then the device.
struct PointerAttributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
};

struct Symbols {
  cudaError (*get_device_count)(int*);
  cudaError (*set_device)(int);
  cudaError (*pointer_attributes)(PointerAttributes*, const void*);
  cudaError (*host_alloc)(void**, size_t, unsigned);
  cudaError (*free_host)(void*);
  cudaError (*malloc)(void**, size_t);
  cudaError (*free)(void*);
  cudaError (*memcpy_async)(void*, const void*, size_t, int, CudaStream);
  cudaError (*memcpy)(void*, const void*, size_t, int);
  cudaError (*memset)(void*, int, size_t);
  cudaError (*stream_create)(CudaStream*, unsigned);
  cudaError (*stream_destroy)(CudaStream);
  cudaError (*stream_synchronize)(CudaStream);
  cudaError (*event_create)(CudaEvent*, unsigned);
  cudaError (*event_destroy)(CudaEvent);
  cudaError (*event_record)(CudaEvent, CudaStream);
  cudaError (*event_query)(CudaEvent);
  cudaError (*stream_wait_event)(CudaStream, CudaEvent, unsigned);
  cudaError (*runtime_version)(int*);
  cudaError (*get_last_error)();
  const char* (*error_string)(cudaError);
};

class DynamicCudaRuntime final : public CudaRuntime {
 public:
  DynamicCudaRuntime(void* handle, std::string file) : handle_(handle), file_(std::move(file)) {
    auto need = [&](auto& slot, const char* name) {
      void* symbol = dlsym(handle_, name);
      if (symbol == nullptr) {
        throw_error(ErrorCode::Unsupported, "cuda",
                    fmt::format("{} has no {} (not a CUDA runtime weft can use)", file_, name));
      }
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
    };
    need(s_.get_device_count, "cudaGetDeviceCount");
    need(s_.set_device, "cudaSetDevice");
    need(s_.pointer_attributes, "cudaPointerGetAttributes");
    need(s_.host_alloc, "cudaHostAlloc");
    need(s_.free_host, "cudaFreeHost");
    need(s_.malloc, "cudaMalloc");
    need(s_.free, "cudaFree");
    need(s_.memcpy_async, "cudaMemcpyAsync");
    need(s_.memcpy, "cudaMemcpy");
    need(s_.memset, "cudaMemset");
    need(s_.stream_create, "cudaStreamCreateWithFlags");
    need(s_.stream_destroy, "cudaStreamDestroy");
    need(s_.stream_synchronize, "cudaStreamSynchronize");
    need(s_.event_create, "cudaEventCreateWithFlags");
    need(s_.event_destroy, "cudaEventDestroy");
    need(s_.event_record, "cudaEventRecord");
    need(s_.event_query, "cudaEventQuery");
    need(s_.stream_wait_event, "cudaStreamWaitEvent");
    need(s_.runtime_version, "cudaRuntimeGetVersion");
    need(s_.get_last_error, "cudaGetLastError");
    need(s_.error_string, "cudaGetErrorString");
    int version = 0;
    if (s_.runtime_version(&version) == kCudaSuccess) {
      version_ = fmt::format("CUDA runtime {}.{}", version / 1000, (version % 1000) / 10);
    }
  }

  std::string describe() const override {
    return version_.empty() ? file_ : fmt::format("{} ({})", file_, version_);
  }

  int device_count() override {
    int count = 0;
    cudaError status = s_.get_device_count(&count);
    if (status != kCudaSuccess) {
      s_.get_last_error();  // clear the sticky-free error so that later calls are not blamed
      throw_error(ErrorCode::Unsupported, "cuda",
                  fmt::format("no usable CUDA device: cudaGetDeviceCount failed with error {} "
                              "({}) [{}]",
                              status, s_.error_string(status), describe()));
    }
    if (count == 0) {
      throw_error(
          ErrorCode::Unsupported, "cuda",
          fmt::format(
              "no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES="
              "\"{}\") [{}]",
              std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "",
              describe()));
    }
    return count;
  }

  void set_device(int device) override { check(s_.set_device(device), "cudaSetDevice"); }

  int device_of(const void* pointer) override {
    PointerAttributes attributes{};
    if (s_.pointer_attributes(&attributes, pointer) != kCudaSuccess) {
      s_.get_last_error();
      return -1;
    }
    if (attributes.type == kMemoryTypeDevice || attributes.type == kMemoryTypeManaged) {
      return attributes.device;
    }
    return -1;
  }

  void* host_alloc(size_t bytes) override {
    void* pointer = nullptr;
    check(s_.host_alloc(&pointer, bytes, kHostAllocPortable),
          fmt::format("cudaHostAlloc of {} bytes", bytes));
    return pointer;
  }
  void host_free(void* pointer) override { check(s_.free_host(pointer), "cudaFreeHost"); }

  void* device_alloc(int device, size_t bytes) override {
    set_device(device);
    void* pointer = nullptr;
    check(s_.malloc(&pointer, bytes),
          fmt::format("cudaMalloc of {} bytes on cuda:{}", bytes, device));
    return pointer;
  }
  void device_free(void* pointer) override { check(s_.free(pointer), "cudaFree"); }

  void copy_async(void* dst, const void* src, size_t bytes, CudaStream stream) override {
    check(s_.memcpy_async(dst, src, bytes, kMemcpyDefault, stream), "cudaMemcpyAsync");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check(s_.memcpy(dst, src, bytes, kMemcpyDefault), "cudaMemcpy");
  }
  void fill(void* dst, int value, size_t bytes) override {
    check(s_.memset(dst, value, bytes), "cudaMemset");
    check(s_.stream_synchronize(nullptr), "cudaStreamSynchronize");
  }

  CudaStream create_stream(int device) override {
    set_device(device);
    CudaStream stream = nullptr;
    check(s_.stream_create(&stream, kStreamNonBlocking), "cudaStreamCreateWithFlags");
    return stream;
  }
  void destroy_stream(CudaStream stream) override {
    check(s_.stream_destroy(stream), "cudaStreamDestroy");
  }
  void synchronize_stream(CudaStream stream) override {
    check(s_.stream_synchronize(stream), "cudaStreamSynchronize");
  }

  CudaEvent create_event(int device) override {
    set_device(device);
    CudaEvent event = nullptr;
    check(s_.event_create(&event, kEventDisableTiming), "cudaEventCreateWithFlags");
    return event;
  }
  void destroy_event(CudaEvent event) override {
    check(s_.event_destroy(event), "cudaEventDestroy");
  }
  void record_event(CudaEvent event, CudaStream stream) override {
    check(s_.event_record(event, stream), "cudaEventRecord");
  }
  bool event_done(CudaEvent event) override {
    cudaError status = s_.event_query(event);
    if (status == kCudaErrorNotReady) return false;
    check(status, "cudaEventQuery");
    return true;
  }
  void stream_wait_event(CudaStream stream, CudaEvent event) override {
    check(s_.stream_wait_event(stream, event, 0), "cudaStreamWaitEvent");
  }

 private:
  void check(cudaError status, std::string_view what) const {
    if (status == kCudaSuccess) return;
    throw_error(
        ErrorCode::Internal, "cuda",
        fmt::format("{} failed: CUDA error {} ({})", what, status, s_.error_string(status)));
  }

  void* handle_;
  std::string file_;
  std::string version_;
  Symbols s_{};
};

std::mutex runtime_mutex;
CudaRuntime* test_runtime = nullptr;  // guarded by runtime_mutex

// Opens the CUDA runtime, or throws Unsupported listing every file tried and why it failed.
std::unique_ptr<CudaRuntime> load_runtime() {
  const char* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  std::vector<std::string> candidates(std::begin(names), std::end(names));
  std::vector<std::string> homes;
  for (const char* variable : {"WEFT_CUDA_HOME", "CUDA_HOME"}) {
    if (const char* home = std::getenv(variable); home != nullptr && *home != '\0') {
      homes.emplace_back(home);
    }
  }
  homes.emplace_back("/usr/local/cuda");
  for (const std::string& home : homes) {
    for (const char* dir : {"lib64", "lib"}) {
      for (const char* name : names) candidates.push_back(fmt::format("{}/{}/{}", home, dir, name));
    }
  }
  std::vector<std::string> refused;
  for (const std::string& file : candidates) {
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      refused.push_back(why ? why : file + ": dlopen failed");
      continue;
    }
    return std::make_unique<DynamicCudaRuntime>(handle, file);
  }
  throw_error(ErrorCode::Unsupported, "cuda",
              fmt::format("CUDA tensors need the CUDA runtime (libcudart), which could not be "
                          "loaded; install CUDA or set WEFT_CUDA_HOME to its directory. Tried: {}",
                          fmt::join(refused, "; ")));
}

}  // namespace

namespace {
thread_local CudaStream current_stream = nullptr;
}  // namespace

CudaStream current_cuda_stream() { return current_stream; }

CudaStream set_current_cuda_stream(CudaStream stream) {
  CudaStream previous = current_stream;
  current_stream = stream;
  return previous;
}

CudaRuntime& cuda_runtime() {
  std::lock_guard<std::mutex> lock(runtime_mutex);
  if (test_runtime != nullptr) return *test_runtime;
  // Loaded once and kept: a failed load is retried at the next call (the caller may have fixed
  // the environment), a successful one lives as long as the process.
  static CudaRuntime* loaded = nullptr;
  if (loaded == nullptr) loaded = load_runtime().release();
  return *loaded;
}

CudaRuntime* set_cuda_runtime_for_testing(CudaRuntime* runtime) {
  std::lock_guard<std::mutex> lock(runtime_mutex);
  CudaRuntime* previous = test_runtime;
  test_runtime = runtime;
  return previous;
}

}  // namespace weft
