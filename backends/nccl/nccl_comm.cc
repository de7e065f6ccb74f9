#include "backends/nccl/nccl_comm.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "backends/nccl/cuda_util.h"
#include "backends/nccl/nccl_types.h"
#include "runtime/log.h"

namespace weft::nccl {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// How long abort() waits for the thread issuing calls to let go of the communicator before
// leaving the abort to that thread (which sees aborting_ at its next poll, within a few ms).
constexpr milliseconds kAbortLockBudget{2000};
// What the destructor allows a communicator nobody destroyed explicitly.
constexpr milliseconds kDestroyBudget{10'000};

// The pause between two polls of an async error. A collective's host side (ncclGroupEnd in
// non-blocking mode) is usually done within microseconds, so the first polls only yield; init
// and split take milliseconds to seconds, so the pause then grows to 2 ms: no spinning.
class Backoff {
 public:
  void pause() {
    if (rounds_++ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, microseconds(2000));
  }

 private:
  int rounds_ = 0;
  microseconds sleep_{50};
};

std::string format_ms(std::chrono::milliseconds ms) {
  if (ms.count() % 1000 == 0) return fmt::format("{} s", ms.count() / 1000);
  return fmt::format("{} ms", ms.count());
}

ncclConfig_t non_blocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// ncclCommGetAsyncError, folding a failed query into the result.
ncclResult_t query_async(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
  return queried == ncclSuccess ? state : queried;
}

}  // namespace

std::shared_ptr<NcclComm> NcclComm::create(int device, int rank, int size,
                                           const std::vector<uint8_t>& unique_id,
                                           std::chrono::milliseconds timeout,
                                           const std::function<bool()>& cancel,
                                           const ErrorContext& context) {
  const auto deadline = Clock::now() + timeout;
  ncclUniqueId id;
  WEFT_CHECK(unique_id.size() == sizeof(id));
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t config = non_blocking_config();
  ncclComm_t comm = nullptr;
  const std::string what =
      fmt::format("ncclCommInitRankConfig (rank {} of {} on cuda:{})", rank, size, device);
  const ncclResult_t started = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    const std::string text = describe_nccl_result(started, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    throw Error(error_code_for(started), context, fmt::format("{}: {}", what, text));
  }
  Backoff backoff;
  for (;;) {
    const ncclResult_t state = query_async(comm);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      const std::string text = describe_nccl_result(state, comm);
      ncclCommAbort(comm);
      throw Error(error_code_for(state), context, fmt::format("{}: {}", what, text));
    }
    if (cancel()) {
      ncclCommAbort(comm);
      throw Error(
          ErrorCode::Aborted, context,
          fmt::format("{}: the backend was aborted while the communicator initialised", what));
    }
    if (Clock::now() >= deadline) {
      ncclCommAbort(comm);
      throw Error(ErrorCode::Timeout, context,
                  fmt::format("waited {} for the NCCL communicator of {} ranks on cuda:{} to "
                              "initialise ({}): a rank has not joined or cannot be reached; the "
                              "communicator was aborted (set WEFT_TIMEOUT)",
                              format_ms(timeout), size, device, what));
    }
    backoff.pause();
  }
  return std::shared_ptr<NcclComm>(new NcclComm(comm, device, context));
}

std::shared_ptr<NcclComm> NcclComm::adopt(ncclComm_t comm, int device,
                                          const ErrorContext& context) {
  return std::shared_ptr<NcclComm>(new NcclComm(comm, device, context));
}

NcclComm::NcclComm(ncclComm_t comm, int device, const ErrorContext& context)
    : device_(device), events_(std::make_shared<EventPool>(device)), comm_(comm) {
  try {
    DeviceGuard device_guard(device, context);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags (the nccl backend's stream)", context);
  } catch (...) {
    ncclCommAbort(comm);
    throw;
  }
}

NcclComm::~NcclComm() {
  destroy(Clock::now() + kDestroyBudget);
  // Stream-ordered: the memory is released after the last collective that used it.
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  cudaGetLastError();
}

NcclComm::Use::Use(NcclComm& owner) : owner_(owner), lock_(owner.use_mutex_) {}

NcclComm::Use::~Use() {
  // An abort that could not take the communicator from this holder left the abort to it.
  if (owner_.aborting()) owner_.abort_locked();
}

ncclComm_t NcclComm::Use::comm() const {
  if (owner_.aborting()) return nullptr;
  std::lock_guard<std::mutex> lock(owner_.state_mutex_);
  return owner_.comm_;
}

void NcclComm::wait_ready(ncclResult_t result, Clock::time_point deadline, const char* what,
                          const ErrorContext& context) {
  if (result == ncclSuccess) return;
  ncclComm_t comm;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    comm = comm_;
  }
  if (result != ncclInProgress || comm == nullptr) {
    throw Error(
        error_code_for(result), context,
        fmt::format("{} on cuda:{}: {}", what, device_, describe_nccl_result(result, comm)));
  }
  Backoff backoff;
  for (;;) {
    if (aborting()) {
      throw Error(
          ErrorCode::Aborted, context,
          fmt::format("{} on cuda:{}: the NCCL communicator is being aborted", what, device_));
    }
    const ncclResult_t state = query_async(comm);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      throw Error(
          error_code_for(state), context,
          fmt::format("{} on cuda:{}: {}", what, device_, describe_nccl_result(state, comm)));
    }
    if (Clock::now() >= deadline) {
      throw Error(ErrorCode::Timeout, context,
                  fmt::format("{} on cuda:{} was still in progress at its deadline (NCCL "
                              "non-blocking call; set WEFT_TIMEOUT)",
                              what, device_));
    }
    backoff.pause();
  }
}

ncclResult_t NcclComm::async_error() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (comm_ == nullptr) return ncclSuccess;
  return query_async(comm_);
}

ncclComm_t NcclComm::split(int color, int key, Clock::time_point deadline,
                           const ErrorContext& context) {
  Use use(*this);
  ncclComm_t comm = use.comm();
  if (comm == nullptr) {
    throw Error(
        ErrorCode::Aborted, context,
        fmt::format("ncclCommSplit on cuda:{}: the parent's communicator was aborted", device_));
  }
  DeviceGuard device_guard(device_, context);
  ncclConfig_t config = non_blocking_config();
  ncclComm_t child = nullptr;
  const ncclResult_t started = ncclCommSplit(comm, color, key, &child, &config);
  auto fail = [&](ErrorCode code, const std::string& detail) {
    if (child != nullptr) ncclCommAbort(child);
    throw Error(code, context,
                fmt::format("ncclCommSplit (color {}, key {}) on cuda:{}: {}", color, key, device_,
                            detail));
  };
  if (started != ncclSuccess && started != ncclInProgress) {
    fail(error_code_for(started), describe_nccl_result(started, comm));
  }
  Backoff backoff;
  for (;;) {
    if (aborting()) fail(ErrorCode::Aborted, "the parent's communicator is being aborted");
    const ncclResult_t parent_state = query_async(comm);
    const ncclResult_t child_state = child != nullptr ? query_async(child) : ncclSuccess;
    for (auto [state, which] : {std::pair{parent_state, comm}, std::pair{child_state, child}}) {
      if (state != ncclSuccess && state != ncclInProgress) {
        fail(error_code_for(state), describe_nccl_result(state, which));
      }
    }
    if (parent_state == ncclSuccess && child_state == ncclSuccess) return child;
    if (Clock::now() >= deadline) {
      fail(ErrorCode::Timeout,
           "still in progress at the group's timeout: a rank of the parent group has not "
           "called split (set WEFT_TIMEOUT)");
    }
    backoff.pause();
  }
}

void* NcclComm::scratch(size_t bytes, const ErrorContext& context) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Some headroom, so that a series of growing calls does not reallocate each time.
  const size_t grown = std::max<size_t>({bytes, scratch_bytes_ * 2, 256});
  if (scratch_ != nullptr) {
    cudaFreeAsync(scratch_, stream_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  check_cuda(cudaMallocAsync(&scratch_, grown, stream_),
             fmt::format("cudaMallocAsync of {} bytes of scratch on cuda:{}", grown, device_),
             context);
  scratch_bytes_ = grown;
  return scratch_;
}

bool NcclComm::abort_locked() {
  ncclComm_t comm;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    comm = comm_;
    comm_ = nullptr;
  }
  if (comm == nullptr) return false;
  const ncclResult_t result = ncclCommAbort(comm);
  if (result != ncclSuccess) {
    WEFT_LOG_WARN("nccl: ncclCommAbort on cuda:{} returned {}", device_,
                  describe_nccl_result(result, nullptr));
  }
  return true;
}

bool NcclComm::abort() {
  bool expected = false;
  if (!aborting_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) return false;
  std::unique_lock<std::timed_mutex> lock(use_mutex_, std::defer_lock);
  if (lock.try_lock_for(kAbortLockBudget)) return abort_locked();
  WEFT_LOG_WARN(
      "nccl: the thread issuing calls on cuda:{} holds the communicator; it aborts it "
      "when it lets go",
      device_);
  return true;
}

void NcclComm::destroy(Clock::time_point deadline) {
  std::unique_lock<std::timed_mutex> lock(use_mutex_, std::defer_lock);
  if (!lock.try_lock_until(deadline)) {
    abort();
    return;
  }
  ncclComm_t comm;
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    comm = comm_;
  }
  if (comm == nullptr) return;
  // ncclCommFinalize flushes what is queued and tears down the connections; non-blocking, it
  // reports progress through the async error, so the wait is bounded by the deadline.
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  ncclResult_t state = ncclCommFinalize(comm);
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
  Backoff backoff;
  while (state == ncclInProgress) {
    state = query_async(comm);
    if (state != ncclInProgress) break;
    if (Clock::now() >= deadline || aborting()) break;
    backoff.pause();
  }
  if (state != ncclSuccess) {
    WEFT_LOG_DEBUG("nccl: finalizing the communicator on cuda:{} did not finish ({}): aborting it",
                   device_,
                   state == ncclInProgress ? "deadline" : describe_nccl_result(state, comm));
    aborting_.store(true, std::memory_order_release);
    abort_locked();
    return;
  }
  {
    std::lock_guard<std::mutex> state_lock(state_mutex_);
    comm_ = nullptr;
  }
  ncclCommDestroy(comm);
}

}  // namespace weft::nccl
