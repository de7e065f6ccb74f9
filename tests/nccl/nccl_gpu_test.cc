// The nccl backend on a real device, world size 1 (NCCL refuses two ranks on one GPU): every
// collective checked element by element against a host reference, stream ordering, the Work's
// wait()/synchronize()/is_completed() semantics, abort and timeout in bounded time, and a
// 2-rank communicator whose second rank never comes. Without a device it prints why and exits 77
// (meson's skip): nothing is faked.
//
// Plain main, no Catch2: each check prints its place and the values; the exit code is 1 if any
// failed. WEFT_TEST_NCCL_DIR (set by meson) is the folder holding libweft-backend-nccl.so.
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "weft/backend.h"
#include "weft/cuda.h"
#include "weft/half.h"
#include "weft/hash_store.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;
int failures = 0;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      ++failures;                                                          \
      std::fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "" __VA_ARGS__);                                \
      std::fprintf(stderr, "\n");                                          \
    }                                                                      \
  } while (0)

void cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "FAIL: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Device memory holding `count` elements of `dtype`, freed at the end of the scope.
struct DeviceBuffer {
  DeviceBuffer(size_t bytes) : bytes(bytes) {
    cuda(cudaMalloc(&data, bytes ? bytes : 1), "malloc");
  }
  ~DeviceBuffer() { cudaFree(data); }
  void upload(const void* host) {
    cuda(cudaMemcpy(data, host, bytes, cudaMemcpyDefault), "upload");
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> host(bytes);
    cuda(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDefault), "download");
    return host;
  }
  void* data = nullptr;
  size_t bytes;
};

Tensor on_device(const DeviceBuffer& b, DType dtype, size_t count) {
  return Tensor{b.data, count, dtype, Device::cuda(0)};
}

Registry::Entry entry() { return Registry::global().resolve("nccl"); }

BackendOptions options(int rank, int size, std::chrono::milliseconds timeout) {
  BackendOptions o;
  o.store = std::make_shared<HashStore>();
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.device = DeviceKind::Cuda;
  return o;
}

ErrorContext context_of(CollectiveKind kind, uint64_t seq) {
  ErrorContext c;
  c.rank = 0;
  c.size = 1;
  c.group = "world";
  c.op = std::string(collective_name(kind));
  c.seq = seq;
  return c;
}

uint64_t next_seq = 1;

// Posts and blocks the host until done; returns "" or the error's message.
std::string run(Backend& backend, Collective c) {
  c.seq = next_seq++;
  const CollectiveKind kind = c.kind;
  try {
    backend.post(std::move(c), context_of(kind, next_seq - 1))
        ->synchronize(std::chrono::seconds(60));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Bytes of `count` elements 1, 2, 3, ... (mod a small range, so that every dtype holds them).
std::vector<unsigned char> pattern(DType dtype, size_t count, int start = 1) {
  std::vector<unsigned char> bytes(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const int v = static_cast<int>((start + i) % 50) + 1;
    unsigned char* at = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::Float32: {
        float f = v;
        std::memcpy(at, &f, 4);
        break;
      }
      case DType::Float64: {
        double d = v;
        std::memcpy(at, &d, 8);
        break;
      }
      case DType::Float16: {
        uint16_t h = float_to_half(v);
        std::memcpy(at, &h, 2);
        break;
      }
      case DType::BFloat16: {
        uint16_t b = float_to_bf16(v);
        std::memcpy(at, &b, 2);
        break;
      }
      case DType::Int8:
      case DType::UInt8:
        *at = static_cast<unsigned char>(v);
        break;
      case DType::Bool:
        *at = static_cast<unsigned char>(v % 2);
        break;
      case DType::Int32:
      case DType::UInt32: {
        uint32_t u = v;
        std::memcpy(at, &u, 4);
        break;
      }
      case DType::Int64:
      case DType::UInt64: {
        uint64_t u = v;
        std::memcpy(at, &u, 8);
        break;
      }
      default:
        break;
    }
  }
  return bytes;
}

void expect_bytes(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                  DType dtype, const char* what) {
  EXPECT(got.size() == want.size(), "%s: %zu bytes, not %zu", what, got.size(), want.size());
  const size_t element = dtype_size(dtype);
  for (size_t i = 0; i + element <= std::min(got.size(), want.size()); i += element) {
    if (std::memcmp(got.data() + i, want.data() + i, element) != 0) {
      EXPECT(false, "%s (%s): element %zu differs", what, std::string(dtype_name(dtype)).c_str(),
             i / element);
      return;
    }
  }
}

Collective make(CollectiveKind kind, std::vector<Tensor> in, std::vector<Tensor> out) {
  Collective c;
  c.kind = kind;
  c.inputs = std::move(in);
  c.outputs = std::move(out);
  c.counts = {c.inputs.empty() ? 0 : c.inputs[0].count};
  return c;
}

void every_collective(Backend& backend) {
  const size_t n = 1000;
  // all_reduce of one rank is the input itself, for every dtype and op NCCL has.
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : {ReduceOp(ReduceOp::Sum), ReduceOp(ReduceOp::Prod), ReduceOp(ReduceOp::Min),
                        ReduceOp(ReduceOp::Max), ReduceOp(ReduceOp::Avg)}) {
      if (dtype == DType::Bool && op == ReduceOp::Avg) continue;
      DeviceBuffer x(n * dtype_size(dtype)), y(n * dtype_size(dtype));
      const auto in = pattern(dtype, n);
      x.upload(in.data());
      Collective c =
          make(CollectiveKind::AllReduce, {on_device(x, dtype, n)}, {on_device(y, dtype, n)});
      c.op = op;
      const std::string error = run(backend, c);
      EXPECT(error.empty(), "all_reduce %s %s: %s", std::string(dtype_name(dtype)).c_str(),
             describe(op).c_str(), error.c_str());
      expect_bytes(y.download(), in, dtype, "all_reduce output");
      expect_bytes(x.download(), in, dtype, "all_reduce input untouched");
    }
  }
  // premul_sum scales: 0.5 * v for float32 and float16, in place.
  for (DType dtype : {DType::Float32, DType::Float16}) {
    DeviceBuffer x(n * dtype_size(dtype));
    x.upload(pattern(dtype, n).data());
    Collective c =
        make(CollectiveKind::AllReduce, {on_device(x, dtype, n)}, {on_device(x, dtype, n)});
    c.op = ReduceOp::premul_sum(0.5);
    EXPECT(run(backend, c).empty(), "premul_sum");
    const auto got = x.download();
    for (size_t i = 0; i < n; ++i) {
      const float want = 0.5f * static_cast<float>((1 + i) % 50 + 1);
      float v;
      if (dtype == DType::Float32) {
        std::memcpy(&v, got.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, got.data() + 2 * i, 2);
        v = half_to_float(h);
      }
      if (v != want) {
        EXPECT(false, "premul_sum %s element %zu: %g, not %g",
               std::string(dtype_name(dtype)).c_str(), i, v, want);
        break;
      }
    }
  }
  const DType f = DType::Float32;
  const auto in = pattern(f, n);
  const auto zeros = std::vector<unsigned char>(n * 4, 0);
  // The collectives that move data: at one rank, output == input (gather/scatter: the one block).
  for (CollectiveKind kind :
       {CollectiveKind::Reduce, CollectiveKind::Broadcast, CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter, CollectiveKind::Gather, CollectiveKind::Scatter,
        CollectiveKind::AllToAll}) {
    for (bool in_place : {false, true}) {
      DeviceBuffer x(n * 4), y(n * 4);
      x.upload(in.data());
      y.upload(zeros.data());
      const DeviceBuffer& out = in_place ? x : y;
      Collective c = make(kind, {on_device(x, f, n)}, {on_device(out, f, n)});
      c.send_counts = {n};
      c.recv_counts = {n};
      const std::string error = run(backend, c);
      EXPECT(error.empty(), "%s%s: %s", std::string(collective_name(kind)).c_str(),
             in_place ? " in place" : "", error.c_str());
      expect_bytes(out.download(), in, f, std::string(collective_name(kind)).c_str());
    }
  }
  // Barrier, and a send to itself with its receive in one coalesced unit.
  EXPECT(run(backend, make(CollectiveKind::Barrier, {}, {})).empty(), "barrier");
  {
    DeviceBuffer x(n * 4), y(n * 4);
    x.upload(in.data());
    Collective send = make(CollectiveKind::Send, {on_device(x, f, n)}, {});
    Collective recv = make(CollectiveKind::Recv, {}, {on_device(y, f, n)});
    send.peer = recv.peer = 0;
    std::vector<Collective> unit = {send, recv};
    std::string error;
    try {
      backend.post_coalesced(unit, context_of(CollectiveKind::Send, 0))
          ->synchronize(std::chrono::seconds(60));
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT(error.empty(), "send/recv to self: %s", error.c_str());
    expect_bytes(y.download(), in, f, "send/recv to self");
  }
}

// Ordering against the caller's stream: the input is written on stream s just before the post,
// and the output read on s just after wait(); the host never synchronises in between.
void stream_ordering(Backend& backend) {
  const size_t n = 1 << 20;
  cudaStream_t s;
  cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  DeviceBuffer x(n * 4), y(n * 4);
  const auto in = pattern(DType::Float32, n, 7);
  std::vector<unsigned char> out(n * 4);
  cuda(cudaMemcpyAsync(x.data, in.data(), n * 4, cudaMemcpyDefault, s), "copy in");
  Collective c = make(CollectiveKind::AllReduce, {on_device(x, DType::Float32, n)},
                      {on_device(y, DType::Float32, n)});
  c.stream = s;
  c.seq = next_seq++;
  auto work = backend.post(c, context_of(CollectiveKind::AllReduce, c.seq));
  {
    CudaStreamGuard guard(s);
    work->wait();
  }
  cuda(cudaMemcpyAsync(out.data(), y.data, n * 4, cudaMemcpyDefault, s), "copy out");
  cuda(cudaStreamSynchronize(s), "sync");
  expect_bytes(out, in, DType::Float32, "stream-ordered all_reduce");
  EXPECT(work->is_completed() && work->is_success(), "completed after the stream passed it");
  cudaStreamDestroy(s);
}

// A stream held back by a host function until `release`: collectives posted on it cannot start.
struct HeldStream {
  HeldStream() {
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    cuda(cudaLaunchHostFunc(
             stream,
             [](void* flag) {
               // Blocks (futex) until release(): same process, so atomic wait wakes.
               static_cast<std::atomic<bool>*>(flag)->wait(false);
             },
             &released),
         "cudaLaunchHostFunc");
  }
  ~HeldStream() {
    release();
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  void release() {
    released = true;
    released.notify_all();
  }
  std::atomic<bool> released{false};
  cudaStream_t stream;
};

std::shared_ptr<Work> post_held(Backend& backend, HeldStream& held, DeviceBuffer& x) {
  Collective c = make(CollectiveKind::AllReduce, {on_device(x, DType::Float32, 16)},
                      {on_device(x, DType::Float32, 16)});
  c.stream = held.stream;
  c.seq = next_seq++;
  return backend.post(c, context_of(CollectiveKind::AllReduce, c.seq));
}

void work_semantics(Backend& backend) {
  DeviceBuffer x(64);
  HeldStream held;
  auto work = post_held(backend, held, x);
  EXPECT(!work->is_completed(), "pending while its stream is held");
  const auto start = Clock::now();
  work->wait();  // queues a stream wait; must not block the host
  EXPECT(Clock::now() - start < std::chrono::seconds(1), "wait() blocked the host");
  bool timed_out = false;
  try {
    work->synchronize(std::chrono::milliseconds(200));
  } catch (const Error& e) {
    timed_out = e.code() == ErrorCode::Timeout;
  }
  EXPECT(timed_out, "synchronize(200 ms) on a held collective throws Timeout");
  held.release();
  work->synchronize(std::chrono::seconds(30));
  EXPECT(work->is_completed() && work->is_success(), "done once released");
}

void abort_is_bounded() {
  auto backend = entry().factory(options(0, 1, std::chrono::seconds(120)));
  DeviceBuffer x(64);
  HeldStream held;
  auto work = post_held(*backend, held, x);
  const auto start = Clock::now();
  // abort() from another thread; the stream stays held until the Work has failed (or 10 s
  // passed), so that an abort that waited for the collective would show here, not hang.
  std::thread aborter([&] { backend->abort("test abort"); });
  ErrorCode code = ErrorCode::Internal;
  try {
    work->synchronize(std::chrono::seconds(10));
  } catch (const Error& e) {
    code = e.code();
  }
  EXPECT(code == ErrorCode::Aborted, "the pending Work fails with Aborted");
  EXPECT(Clock::now() - start < std::chrono::seconds(10), "abort took too long");
  held.release();
  aborter.join();
}

void watchdog_timeout_is_bounded() {
  auto backend = entry().factory(options(0, 1, std::chrono::seconds(2)));
  DeviceBuffer x(64);
  HeldStream held;
  auto work = post_held(*backend, held, x);
  const auto start = Clock::now();
  std::string what;
  ErrorCode code = ErrorCode::Internal;
  try {
    work->synchronize(std::chrono::seconds(20));
  } catch (const Error& e) {
    code = e.code();
    what = e.what();
  }
  EXPECT(code == ErrorCode::Timeout, "Timeout from the watchdog: %s", what.c_str());
  EXPECT(what.find("did not finish on cuda:0 within 2 s") != std::string::npos, "%s", what.c_str());
  EXPECT(Clock::now() - start < std::chrono::seconds(10), "the watchdog took too long");
  held.release();
}

void missing_rank_times_out_init() {
  auto backend = entry().factory(options(0, 2, std::chrono::seconds(3)));
  DeviceBuffer x(64);
  Collective c = make(CollectiveKind::AllReduce, {on_device(x, DType::Float32, 16)},
                      {on_device(x, DType::Float32, 16)});
  const auto start = Clock::now();
  const std::string error = run(*backend, c);
  EXPECT(error.find("Timeout") != std::string::npos &&
             error.find("to initialise") != std::string::npos,
         "%s", error.c_str());
  EXPECT(Clock::now() - start < std::chrono::seconds(15), "init did not give up in time");
  backend.reset();
  EXPECT(Clock::now() - start < std::chrono::seconds(20), "destruction after a failed init");
}

// abort() from another thread ends a communicator's initialisation that waits for a rank that
// never comes: the post returns a failed Work well before the group's timeout.
void abort_ends_init() {
  BackendOptions o = options(0, 2, std::chrono::seconds(120));
  auto backend = entry().factory(o);
  DeviceBuffer x(64);
  std::shared_ptr<Work> work;
  const auto start = Clock::now();
  std::thread poster([&] {
    Collective c = make(CollectiveKind::AllReduce, {on_device(x, DType::Float32, 16)},
                        {on_device(x, DType::Float32, 16)});
    c.seq = next_seq++;
    work = backend->post(c, context_of(CollectiveKind::AllReduce, c.seq));
  });
  // Rank 0 publishes the unique id just before it starts the communicator: then abort.
  o.store->wait({"nccl/uid/0"}, std::chrono::seconds(30));
  backend->abort("test abort during init");
  poster.join();
  ErrorCode code = ErrorCode::Internal;
  try {
    work->synchronize(std::chrono::seconds(5));
  } catch (const Error& e) {
    code = e.code();
  }
  EXPECT(code == ErrorCode::Aborted, "a post whose init was aborted fails with Aborted");
  EXPECT(Clock::now() - start < std::chrono::seconds(30), "abort did not end the init");
}

void split_makes_a_working_child(Backend& parent) {
  EXPECT(parent.split(Backend::kNoColor, 0, context_of(CollectiveKind::Barrier, 0)) == nullptr,
         "no color: nothing");
  BackendOptions o = options(0, 1, std::chrono::seconds(30));
  o.from_parent = parent.split(0, 0, context_of(CollectiveKind::Barrier, 0));
  EXPECT(o.from_parent != nullptr, "split of a backend with a communicator");
  auto child = entry().factory(o);
  DeviceBuffer x(16);
  const auto in = pattern(DType::Float32, 4);
  x.upload(in.data());
  Collective c = make(CollectiveKind::AllReduce, {on_device(x, DType::Float32, 4)},
                      {on_device(x, DType::Float32, 4)});
  EXPECT(run(*child, c).empty(), "all_reduce on the child");
  expect_bytes(x.download(), in, DType::Float32, "child all_reduce");
  // The child used the split communicator: no unique id went through its store.
  EXPECT(!o.store->check({"nccl/uid/0"}), "the child made a unique id");
}

}  // namespace
}  // namespace weft

int main() {
  using namespace weft;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("no CUDA device: %s\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "none visible");
    return 77;
  }
  const char* built = std::getenv("WEFT_TEST_NCCL_DIR");
  if (built != nullptr) setenv("WEFT_PLUGIN_PATH", built, 1);
  cuda(cudaSetDevice(0), "cudaSetDevice");
  {
    auto backend = entry().factory(options(0, 1, std::chrono::seconds(60)));
    every_collective(*backend);
    stream_ordering(*backend);
    work_semantics(*backend);
    split_makes_a_working_child(*backend);
  }
  abort_is_bounded();
  watchdog_timeout_is_bounded();
  missing_rank_times_out_init();
  abort_ends_init();
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}
