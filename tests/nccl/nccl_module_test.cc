// The nccl backend as a module found by name, and what it does where CUDA cannot run: creating it
// succeeds (it touches no device until the first collective), and a collective on a CUDA tensor
// fails its Work with Unsupported naming cudaGetDeviceCount's error, at once: no crash, no hang.
//
// WEFT_TEST_NCCL_DIR (set by meson) is the folder holding the built libweft-backend-nccl.so.
#include <stdlib.h>

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include "weft/backend.h"
#include "weft/hash_store.h"
#include "weft/process_group.h"

namespace weft {
namespace {

Registry::Entry nccl_entry() {
  const char* built = std::getenv("WEFT_TEST_NCCL_DIR");
  REQUIRE(built != nullptr);
  REQUIRE(setenv("WEFT_PLUGIN_PATH", built, 1) == 0);
  return Registry::global().resolve("nccl");
}

BackendOptions options_of_one() {
  BackendOptions options;
  options.store = std::make_shared<HashStore>();
  options.rank = 0;
  options.size = 1;
  options.group_name = "world";
  options.timeout = std::chrono::seconds(10);
  options.device = DeviceKind::Cuda;
  return options;
}

ErrorContext context_of(const char* op, uint64_t seq) {
  ErrorContext context;
  context.rank = 0;
  context.size = 1;
  context.group = "world";
  context.op = op;
  context.seq = seq;
  return context;
}

// The error a Work failed with (FAIL when it succeeded), waiting at most 5 s.
std::pair<ErrorCode, std::string> failure_of(const std::shared_ptr<Work>& work) {
  try {
    work->synchronize(std::chrono::seconds(5));
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  FAIL("the Work succeeded");
  return {};
}

// Why this process has no CUDA device, or "" when it has one.
std::string no_device_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return cudaGetErrorName(status);
  return count == 0 ? "no device visible" : "";
}

Collective all_reduce_on(Device device, float* data, size_t count) {
  Collective c;
  c.kind = CollectiveKind::AllReduce;
  c.seq = 1;
  c.inputs = {Tensor::of(data, count, device)};
  c.outputs = c.inputs;
  return c;
}

TEST_CASE("the built module loads by name and serves cuda", "[nccl]") {
  const Registry::Entry entry = nccl_entry();
  CHECK(entry.name == "nccl");
  REQUIRE(entry.devices.size() == 1);
  CHECK(entry.devices[0] == DeviceKind::Cuda);
  const auto map = parse_backend_map("cuda:nccl", Registry::global());
  REQUIRE(map.size() == 1);
  CHECK(map[0].first == DeviceKind::Cuda);
  CHECK(map[0].second == "nccl");
  // It serves CUDA tensors only: a map that gives it the host is refused.
  CHECK_THROWS_AS(parse_backend_map("cpu:nccl", Registry::global()), Error);
}

TEST_CASE("without a usable CUDA device a collective fails with Unsupported naming CUDA's error",
          "[nccl]") {
  const std::string reason = no_device_reason();
  if (reason.empty()) {
    WARN("this machine has a CUDA device: tests/nccl/nccl_gpu_test covers it");
    return;
  }
  std::unique_ptr<Backend> backend = nccl_entry().factory(options_of_one());
  CHECK(backend->name() == "nccl");
  std::vector<float> data(4, 1.0f);  // never read: the device check comes first
  const auto start = std::chrono::steady_clock::now();
  auto [code, what] = failure_of(backend->post(
      all_reduce_on(Device::cuda(0), data.data(), data.size()), context_of("all_reduce", 1)));
  INFO(what);
  CHECK(code == ErrorCode::Unsupported);
  CHECK(
      what.starts_with("rank 0/1 group \"world\" all_reduce #1: Unsupported: backend \"nccl\" "
                       "has no usable CUDA device: cudaGetDeviceCount failed with error "));
  CHECK(what.find(reason) != std::string::npos);
  // A barrier has no tensor: the device is the thread's current one, with the same failure.
  Collective barrier;
  barrier.kind = CollectiveKind::Barrier;
  barrier.seq = 2;
  std::tie(code, what) = failure_of(backend->post(barrier, context_of("barrier", 2)));
  CHECK(code == ErrorCode::Unsupported);
  CHECK(what.find("cudaGetDeviceCount failed") != std::string::npos);
  // The group is not broken by it: the next call fails the same way, not as "aborted".
  std::tie(code, what) = failure_of(backend->post(
      all_reduce_on(Device::cuda(0), data.data(), data.size()), context_of("all_reduce", 3)));
  CHECK(code == ErrorCode::Unsupported);
  backend.reset();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE(
    "a group with cuda:nccl hands CUDA tensors to the module, which fails cleanly without a "
    "device",
    "[nccl]") {
  const std::string reason = no_device_reason();
  if (reason.empty()) {
    WARN("this machine has a CUDA device: tests/nccl/nccl_gpu_test covers it");
    return;
  }
  nccl_entry();
  ProcessGroupOptions options;
  options.store = std::make_shared<HashStore>();
  options.rank = 0;
  options.world_size = 1;
  options.backend = "cpu:tcp,cuda:nccl";
  options.timeout = std::chrono::seconds(10);
  auto pg = init_process_group(options);
  CHECK(pg->backend_name(DeviceKind::Cuda) == "nccl");
  std::vector<float> data(4, 1.0f);  // never read: the device check comes first
  std::string what;
  try {
    pg->all_reduce(Tensor::of(data.data(), data.size(), Device::cuda(0)))
        ->synchronize(std::chrono::seconds(5));
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Unsupported);
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("all_reduce #1") != std::string::npos);
  CHECK(what.find("Unsupported: backend \"nccl\" has no usable CUDA device: cudaGetDeviceCount "
                  "failed") != std::string::npos);
  // Host tensors still go to tcp.
  pg->all_reduce(Tensor::of(data.data(), data.size()))->wait();
  CHECK(data[0] == 1.0f);
}

TEST_CASE("with no backend named, cuda tensors go to nccl when its module loads", "[nccl]") {
  nccl_entry();  // WEFT_PLUGIN_PATH names the build's module
  ProcessGroupOptions options;
  options.store = std::make_shared<HashStore>();
  options.rank = 0;
  options.world_size = 1;
  options.timeout = std::chrono::seconds(10);
  auto pg = init_process_group(options);
  CHECK(pg->backend_name(DeviceKind::Cpu) == "tcp");
  CHECK(pg->backend_name(DeviceKind::Cuda) == "nccl");
}

TEST_CASE("what NCCL cannot do is refused before any device is touched", "[nccl]") {
  std::unique_ptr<Backend> backend = nccl_entry().factory(options_of_one());
  std::vector<int32_t> ints(4, 3);
  Collective c;
  c.kind = CollectiveKind::AllReduce;
  c.seq = 4;
  c.op = ReduceOp::BXor;
  c.inputs = {Tensor::of(ints.data(), ints.size(), Device::cuda(0))};
  c.outputs = c.inputs;
  auto [code, what] = failure_of(backend->post(c, context_of("all_reduce", 4)));
  CHECK(code == ErrorCode::Unsupported);
  CHECK(what.find("bxor on int32: backend \"nccl\" does not support bitwise reductions") !=
        std::string::npos);
  // A host tensor reaching it is a bug in the caller's backend map, said plainly.
  std::vector<float> host(2, 1.0f);
  std::tie(code, what) = failure_of(backend->post(
      all_reduce_on(Device::cpu(), host.data(), host.size()), context_of("all_reduce", 5)));
  CHECK(code == ErrorCode::InvalidArgument);
  CHECK(what.find("backend \"nccl\" serves CUDA tensors only, not float32 x 2") !=
        std::string::npos);
  // So is a receive from any source.
  Collective recv;
  recv.kind = CollectiveKind::Recv;
  recv.peer = kAnySource;
  recv.outputs = {Tensor::of(host.data(), host.size(), Device::cuda(0))};
  std::tie(code, what) = failure_of(backend->post(recv, context_of("recv", 0)));
  CHECK(code == ErrorCode::Unsupported);
  CHECK(what.find("cannot receive from any source") != std::string::npos);
  CHECK_FALSE(backend->supports_recv_any());
}

TEST_CASE("after abort() every post fails at once with Aborted and the reason", "[nccl]") {
  std::unique_ptr<Backend> backend = nccl_entry().factory(options_of_one());
  backend->abort("test abort");
  backend->abort("second abort has no effect");
  std::vector<float> data(4, 1.0f);
  auto [code, what] = failure_of(backend->post(
      all_reduce_on(Device::cuda(0), data.data(), data.size()), context_of("all_reduce", 6)));
  CHECK(code == ErrorCode::Aborted);
  CHECK(what ==
        "rank 0/1 group \"world\" all_reduce #6: Aborted: issued after the group's nccl "
        "backend was aborted: test abort");
}

TEST_CASE("a malformed nccl setting fails the backend's creation naming it", "[nccl]") {
  BackendOptions options = options_of_one();
  // (emplace, not operator[] = "0": GCC 12's -Wrestrict misreads the latter at -O3)
  options.settings.emplace("nccl_poll", std::string("0"));
  try {
    nccl_entry().factory(options);
    FAIL("created");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("setting \"nccl_poll\"=\"0\"") != std::string::npos);
  }
}

}  // namespace
}  // namespace weft
