// CUDA tensors on the tcp backend (runtime/cuda_staging.h) and the core's CUDA plumbing (streams,
// device-completing Works, Backend::split), on machines without a GPU.
//
// No test here claims to have run on a GPU. The staging logic (which pinned buffer each tensor
// uses, what is copied in and out, in which stream's order, when the Work completes) is tested
// against FakeCuda, a stand-in for the CUDA runtime whose "device memory" is host memory and whose
// streams really are queues: a copy queued on a stream happens only when an event recorded after
// it is waited for or found done, so code that reads a buffer before its copy has run reads stale
// data and fails these tests. What needs a real device runs in tests/conformance with
// WEFT_TEST_DEVICE=cuda (skipped without one) and in benchmarks/gpu/check.
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/cuda.h"
#include "weft/process_group.h"
#include "weft/weft.h"

#include "runtime/cuda_runtime.h"
#include "tests/support/fake_cuda.h"
#include "tests/support/multiproc.h"

using namespace weft;
using std::chrono::seconds;

namespace {

using test::FakeCuda;

std::shared_ptr<ProcessGroup> join(uint16_t port, int rank, int size, const std::string& backend) {
  ProcessGroupOptions options;
  options.backend = backend;
  options.url = fmt::format("tcp://127.0.0.1:{}", port);
  options.rank = rank;
  options.world_size = size;
  options.timeout = seconds(20);
  return init_process_group(options);
}

// `values` copied into fresh fake device memory.
template <typename T>
T* on_device(FakeCuda& cuda, const std::vector<T>& values) {
  auto* p = static_cast<T*>(cuda.device_alloc(0, values.size() * sizeof(T)));
  cuda.copy(p, values.data(), values.size() * sizeof(T));
  return p;
}

template <typename T>
std::vector<T> to_host(FakeCuda& cuda, const T* p, size_t n) {
  std::vector<T> out(n);
  cuda.copy(out.data(), p, n * sizeof(T));
  return out;
}

}  // namespace

TEST_CASE("cuda tensors on tcp: every collective stages through pinned memory, results exact",
          "[cuda]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int rank) {
    FakeCuda cuda;
    set_cuda_runtime_for_testing(&cuda);
    auto pg = join(port, rank, 3, "cpu:tcp,cuda:tcp");
    RANK_CHECK(pg->backend_name(DeviceKind::Cuda) == "tcp");
    const int P = 3;
    const size_t n = 1000;
    const Device gpu = Device::cuda(0);

    // all_reduce in place and out of place.
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = float(rank * 10000 + i);
    float* dx = on_device(cuda, x);
    float* dy = static_cast<float*>(cuda.device_alloc(0, n * sizeof(float)));
    pg->all_reduce(Tensor::of(dx, n, gpu), Tensor::of(dy, n, gpu))->synchronize();
    pg->all_reduce(Tensor::of(dx, n, gpu))->synchronize();
    auto y = to_host(cuda, dy, n);
    auto xr = to_host(cuda, dx, n);
    for (size_t i = 0; i < n; ++i) {
      const float want = float((0 + 1 + 2) * 10000 + P * i);
      RANK_CHECK(y[i] == want && xr[i] == want, "all_reduce [{}]: {} / {} != {}", i, y[i], xr[i],
                 want);
    }

    // all_gather in place (this rank's block of the output is the input) and reduce_scatter.
    std::vector<int32_t> gathered(P * n, -1);
    for (size_t i = 0; i < n; ++i) gathered[rank * n + i] = int32_t(rank * 7 + i);
    int32_t* dg = on_device(cuda, gathered);
    pg->all_gather_into_tensor(Tensor::of(dg, P * n, gpu), Tensor::of(dg + rank * n, n, gpu))
        ->synchronize();
    auto g = to_host(cuda, dg, P * n);
    for (int r = 0; r < P; ++r) {
      for (size_t i = 0; i < n; ++i) {
        RANK_CHECK(g[r * n + i] == int32_t(r * 7 + i), "all_gather [{}][{}]: {}", r, i,
                   g[r * n + i]);
      }
    }
    std::vector<double> rs_in(P * n);
    for (size_t i = 0; i < P * n; ++i) rs_in[i] = double(rank + 1) * double(i);
    double* drs = on_device(cuda, rs_in);
    double* drs_out = static_cast<double*>(cuda.device_alloc(0, n * sizeof(double)));
    pg->reduce_scatter_tensor(Tensor::of(drs_out, n, gpu), Tensor::of(drs, P * n, gpu))
        ->synchronize();
    auto rs = to_host(cuda, drs_out, n);
    for (size_t i = 0; i < n; ++i) {
      const double want = double(1 + 2 + 3) * double(rank * n + i);
      RANK_CHECK(rs[i] == want, "reduce_scatter [{}]: {} != {}", i, rs[i], want);
    }

    // broadcast from 2, reduce to 1 (max), send/recv around a ring, all_to_all with splits.
    std::vector<float> b(n, float(rank));
    float* db = on_device(cuda, b);
    pg->broadcast(Tensor::of(db, n, gpu), 2)->synchronize();
    for (float v : to_host(cuda, db, n)) RANK_CHECK(v == 2.0f, "broadcast: {}", v);
    std::vector<float> m(n, float(rank * 3));
    float* dm = on_device(cuda, m);
    pg->reduce(Tensor::of(dm, n, gpu), 1, ReduceOp::Max)->synchronize();
    for (float v : to_host(cuda, dm, n)) {
      RANK_CHECK(v == (rank == 1 ? 6.0f : float(rank * 3)), "reduce: {}", v);
    }
    std::vector<int64_t> msg(n, rank + 100);
    int64_t* dsend = on_device(cuda, msg);
    int64_t* drecv = static_cast<int64_t*>(cuda.device_alloc(0, n * sizeof(int64_t)));
    auto s = pg->send(Tensor::of(dsend, n, gpu), (rank + 1) % P, 5);
    auto r = pg->recv(Tensor::of(drecv, n, gpu), (rank + P - 1) % P, 5);
    s->synchronize();
    r->synchronize();
    for (int64_t v : to_host(cuda, drecv, n)) {
      RANK_CHECK(v == (rank + P - 1) % P + 100, "recv: {}", v);
    }
    // Rank r sends j + 1 elements to rank j, all of value 10 * r + j.
    std::vector<size_t> in_splits, out_splits;
    std::vector<int32_t> a2a_in;
    for (int j = 0; j < P; ++j) {
      in_splits.push_back(j + 1);
      out_splits.push_back(rank + 1);
      for (int k = 0; k <= j; ++k) a2a_in.push_back(10 * rank + j);
    }
    int32_t* da = on_device(cuda, a2a_in);
    int32_t* dao = static_cast<int32_t*>(cuda.device_alloc(0, P * (rank + 1) * sizeof(int32_t)));
    pg->all_to_all(Tensor::of(dao, P * (rank + 1), gpu), Tensor::of(da, a2a_in.size(), gpu),
                   out_splits, in_splits)
        ->synchronize();
    auto ao = to_host(cuda, dao, P * (rank + 1));
    for (int j = 0; j < P; ++j) {
      for (int k = 0; k <= rank; ++k) {
        RANK_CHECK(ao[j * (rank + 1) + k] == 10 * j + rank, "all_to_all from {}: {}", j,
                   ao[j * (rank + 1) + k]);
      }
    }
    // A send to oneself copies on the device.
    int64_t* dself = static_cast<int64_t*>(cuda.device_alloc(0, n * sizeof(int64_t)));
    auto to_self = pg->send(Tensor::of(dsend, n, gpu), rank, 9);
    pg->recv(Tensor::of(dself, n, gpu), rank, 9)->synchronize();
    to_self->wait();
    for (int64_t v : to_host(cuda, dself, n)) RANK_CHECK(v == rank + 100, "self: {}", v);
    // Pinned buffers are pooled: later calls of the same sizes allocate none.
    const int pinned = cuda.pinned_allocations.load();
    for (int i = 0; i < 3; ++i) pg->all_reduce(Tensor::of(dx, n, gpu))->synchronize();
    RANK_CHECK(cuda.pinned_allocations.load() == pinned, "{} -> {}", pinned,
               cuda.pinned_allocations.load());
    pg->destroy();
  });
}

TEST_CASE("cuda tensors on tcp: ordered after the caller's stream; wait() orders the stream after",
          "[cuda]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    FakeCuda cuda;
    set_cuda_runtime_for_testing(&cuda);
    auto pg = join(port, rank, 2, "tcp");  // one name: tcp serves cpu and, staged, cuda
    const size_t n = 4096;
    const Device gpu = Device::cuda(0);
    CudaStream user = cuda.create_stream(0);
    float* dx = static_cast<float*>(cuda.device_alloc(0, n * sizeof(float)));
    std::vector<float> x(n, float(rank + 1));
    // The input is written by a copy still queued on the caller's stream: the all_reduce must
    // read it after that copy, not the 0xEE bytes that are there now.
    cuda.copy_async(dx, x.data(), n * sizeof(float), user);
    std::shared_ptr<Work> work;
    {
      CudaStreamGuard guard(user);
      work = pg->all_reduce(Tensor::of(dx, n, gpu));
      RANK_CHECK(work->expects_device_completion());
      work->wait();  // returns once the copy back is queued; the user stream waits for it
    }
    // Unless the staging thread saw the end event pass first (then the Work had completed and
    // there is nothing left for the stream to wait for), wait() made the stream wait.
    RANK_CHECK(cuda.waits[user] >= 1 || work->is_completed(),
               "wait() neither made the caller's stream wait nor found the Work completed");
    RANK_CHECK(current_cuda_stream() == nullptr);
    work->synchronize();
    RANK_CHECK(work->is_completed() && work->is_success());
    for (float v : to_host(cuda, dx, n)) RANK_CHECK(v == 3.0f, "{}", v);
    pg->destroy();
  });
}

TEST_CASE("cuda tensors: lists of separate tensors are staged through device memory", "[cuda]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    FakeCuda cuda;
    set_cuda_runtime_for_testing(&cuda);
    auto pg = join(port, rank, 2, "cpu:tcp,cuda:tcp");
    const Device gpu = Device::cuda(0);
    // all_gather into two separate allocations; reduce_scatter from two.
    std::vector<float> mine(4, float(rank + 1));
    float* in = on_device(cuda, mine);
    float* a = static_cast<float*>(cuda.device_alloc(0, 4 * sizeof(float)));
    float* b = static_cast<float*>(cuda.device_alloc(0, 4 * sizeof(float)));
    pg->all_gather({Tensor::of(a, 4, gpu), Tensor::of(b, 4, gpu)}, Tensor::of(in, 4, gpu))
        ->synchronize();
    for (float v : to_host(cuda, a, 4)) RANK_CHECK(v == 1.0f, "block 0: {}", v);
    for (float v : to_host(cuda, b, 4)) RANK_CHECK(v == 2.0f, "block 1: {}", v);
    std::vector<float> x0(4, float(10 * rank)), x1(4, float(10 * rank + 1));
    float* d0 = on_device(cuda, x0);
    float* d1 = on_device(cuda, x1);
    float* out = static_cast<float*>(cuda.device_alloc(0, 4 * sizeof(float)));
    pg->reduce_scatter(Tensor::of(out, 4, gpu), {Tensor::of(d0, 4, gpu), Tensor::of(d1, 4, gpu)})
        ->wait();  // a list's Work completes on the host once its copies out are done
    const float want = rank == 0 ? 0.0f + 10.0f : 1.0f + 11.0f;
    for (float v : to_host(cuda, out, 4))
      RANK_CHECK(v == want, "reduce_scatter: {} != {}", v, want);
    pg->destroy();
  });
}

TEST_CASE("cuda tensors without a usable CUDA runtime fail with Unsupported naming the reason",
          "[cuda]") {
  bool usable = true;
  try {
    cuda_runtime().device_count();
  } catch (const Error& e) {
    usable = false;
  }
  if (usable) {
    WARN("skipped: this machine has a CUDA device; the no-device message cannot be checked");
    return;
  }
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2, "cpu:tcp,cuda:tcp");
    std::vector<float> host(8, 1.0f);  // never touched: the backend refuses before any copy
    try {
      pg->all_reduce(Tensor::of(host.data(), 8, Device::cuda(0)))->synchronize();
      RANK_CHECK(false, "a CUDA tensor was accepted without a CUDA device");
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_CHECK(e.code() == ErrorCode::Unsupported, "{}", what);
      RANK_CHECK(what.find("cudaGetDeviceCount") != std::string::npos ||
                     what.find("libcudart") != std::string::npos,
                 "{}", what);
      RANK_CHECK(what.find("rank " + std::to_string(rank) + "/2") != std::string::npos, "{}", what);
    }
    // The group still works for host tensors.
    std::vector<float> v(4, float(rank));
    pg->all_reduce(Tensor::of(v.data(), 4))->wait();
    RANK_CHECK(v[0] == 1.0f);
    pg->destroy();
  });
}

TEST_CASE("C API: buffers on a CUDA device through weft_set_buffer_device", "[cuda]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    FakeCuda cuda;
    set_cuda_runtime_for_testing(&cuda);
    const std::string url = fmt::format("tcp://127.0.0.1:{}", port);
    weft_init_options_t options = WEFT_INIT_OPTIONS_INIT;
    options.url = url.c_str();
    options.rank = rank;
    options.world_size = 2;
    options.backend = "cpu:tcp,cuda:tcp";
    weft_group_t* group = nullptr;
    RANK_CHECK(weft_init(&options, &group) == WEFT_SUCCESS, "{}", weft_last_error());
    RANK_CHECK(weft_set_buffer_device("gpu") == WEFT_ERR_INVALID_ARGUMENT);
    RANK_CHECK(std::string(weft_last_error()).find("\"gpu\"") != std::string::npos);
    RANK_CHECK(weft_set_buffer_device("cuda:0") == WEFT_SUCCESS, "{}", weft_last_error());
    std::vector<int32_t> x(100, rank + 1);
    int32_t* dx = on_device(cuda, x);
    RANK_CHECK(weft_all_reduce(group, dx, dx, 100, WEFT_INT32, WEFT_SUM, nullptr) == WEFT_SUCCESS,
               "{}", weft_last_error());
    for (int32_t v : to_host(cuda, dx, 100)) RANK_CHECK(v == 3, "{}", v);
    weft_work_t* work = nullptr;
    RANK_CHECK(weft_all_reduce(group, dx, dx, 100, WEFT_INT32, WEFT_SUM, &work) == WEFT_SUCCESS,
               "{}", weft_last_error());
    RANK_CHECK(weft_work_synchronize(work, -1) == WEFT_SUCCESS, "{}", weft_last_error());
    weft_work_free(work);
    for (int32_t v : to_host(cuda, dx, 100)) RANK_CHECK(v == 6, "{}", v);
    RANK_CHECK(weft_set_buffer_device("cpu") == WEFT_SUCCESS);
    weft_group_destroy(group);
  });
}

namespace {

// A cuda-only backend that completes every operation at once and reports what its group's
// parent gave it: proves the generic split path (Backend::split on every rank, from_parent on
// the sub-group's backend) without NCCL.
std::atomic<int> last_split_color{-100};
std::atomic<int> from_parent_value{-1};

class SplitProbe final : public Backend {
 public:
  explicit SplitProbe(const BackendOptions& options) {
    if (options.from_parent)
      from_parent_value = *std::static_pointer_cast<int>(options.from_parent);
  }
  std::string_view name() const override { return "split_probe"; }
  std::shared_ptr<Work> post(Collective, ErrorContext context) override {
    return Work::completed(std::move(context));
  }
  std::shared_ptr<void> split(int color, int key, const ErrorContext&) override {
    last_split_color = color;
    if (color == kNoColor) return nullptr;
    return std::make_shared<int>(color * 100 + key);
  }
  void abort(const std::string&) override {}
};

}  // namespace

TEST_CASE("split and new_group hand each backend's split() result to the sub-group's backend",
          "[cuda]") {
  static BackendRegistration probe{
      {"split_probe", {DeviceKind::Cuda}, [](const BackendOptions& options) {
         return std::make_unique<SplitProbe>(options);
       }}};
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int rank) {
    auto pg = join(port, rank, 3, "cpu:tcp,cuda:split_probe");
    float dummy = 0;
    const Tensor t = Tensor::of(&dummy, 1, Device::cuda(0));
    // Before the parent has a cuda backend, split gives nothing.
    auto early = pg->split(rank == 2 ? -1 : 0, rank);
    RANK_CHECK(last_split_color == -100);
    pg->all_reduce(t)->wait();  // makes the parent's cuda backend
    auto child = pg->split(rank == 2 ? -1 : 7, 10 - rank);
    RANK_CHECK(last_split_color == (rank == 2 ? Backend::kNoColor : 7), "{}",
               last_split_color.load());
    if (rank != 2) {
      child->all_reduce(t)->wait();
      RANK_CHECK(from_parent_value == 700 + 10 - rank, "{}", from_parent_value.load());
    } else {
      RANK_CHECK(child == nullptr);
    }
    from_parent_value = -1;
    auto sub = pg->new_group({2, 0});
    RANK_CHECK(last_split_color == (rank == 1 ? Backend::kNoColor : 0));
    if (sub) {
      sub->all_reduce(t)->wait();
      RANK_CHECK(from_parent_value == (rank == 2 ? 0 : 1), "{}", from_parent_value.load());
    }
    // The probe's collectives complete at once, without the other ranks: meet once more on the
    // host backend before rank 0 (the store's host) leaves, or a member still forming its
    // sub-group's connections loses the store.
    pg->barrier()->wait();
    pg->destroy();
  });
}
