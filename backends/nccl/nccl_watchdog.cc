#include "backends/nccl/nccl_watchdog.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>

#include "backends/nccl/nccl_types.h"
#include "runtime/log.h"

namespace weft::nccl {
namespace {

// "300 s", "1500 ms": how timeouts read in messages.
std::string format_timeout(std::chrono::milliseconds ms) {
  if (ms.count() % 1000 == 0) return fmt::format("{} s", ms.count() / 1000);
  return fmt::format("{} ms", ms.count());
}

}  // namespace

Watchdog::Watchdog(std::shared_ptr<Store> store, ErrorContext base, std::chrono::milliseconds poll)
    : failure_(std::move(store), base.rank), base_(std::move(base)), poll_(poll) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::add_comm(std::shared_ptr<NcclComm> comm) {
  bool aborted_already = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.push_back(comm);
    aborted_already = broken_.has_value();
  }
  if (aborted_already) comm->abort();
}

void Watchdog::track(std::shared_ptr<Work> work, std::shared_ptr<DeviceCompletion> end, int device,
                     Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_) {
      pending_.push_back(Pending{std::move(work), std::move(end), device, deadline});
      wake_.notify_all();
      return;
    }
  }
  work->fail_if_pending(refusal(work->context()));
}

std::exception_ptr Watchdog::refusal(const ErrorContext& context) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_) return nullptr;
  if (broken_->code == ErrorCode::Aborted) {
    return std::make_exception_ptr(Error(
        ErrorCode::Aborted, context,
        fmt::format("issued after the group's nccl backend was aborted: {}", broken_->cause)));
  }
  return std::make_exception_ptr(
      Error(broken_->code, context,
            fmt::format("the group's NCCL communicators were aborted after an earlier failure: {}",
                        broken_->cause)));
}

void Watchdog::abort(const std::string& reason) {
  Failure failure;
  failure.code = ErrorCode::Aborted;
  failure.context = base_;
  failure.for_others = reason;
  break_group(failure, /*record=*/false);
}

void Watchdog::fail_group(const Error& error, const ErrorContext& context) {
  Failure failure;
  failure.code = error.code();
  failure.context = context;
  failure.error = std::make_exception_ptr(error);
  failure.for_others = fmt::format("failed with the group: {}", error.what());
  break_group(failure, /*record=*/true);
}

bool Watchdog::drain(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return drained_.wait_until(lock, deadline, [this] { return pending_.empty(); });
}

std::vector<std::shared_ptr<NcclComm>> Watchdog::comms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return comms_;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // Nothing pending: sleep until a post or the destructor wakes us.
    wake_.wait(lock, [this] { return stop_ || !pending_.empty(); });
    if (stop_) return;
    if (wake_.wait_for(lock, poll_, [this] { return stop_; })) return;
    std::vector<Pending> pending = pending_;
    std::vector<std::shared_ptr<NcclComm>> comms = comms_;
    lock.unlock();
    std::optional<Failure> failure = poll_once(pending, comms);
    lock.lock();
    std::unordered_set<const Work*> done;
    for (const Pending& p : pending) {
      if (p.end == nullptr) done.insert(p.work.get());
    }
    std::erase_if(pending_, [&](const Pending& p) { return done.contains(p.work.get()); });
    if (failure) {
      lock.unlock();
      break_group(*failure, /*record=*/true);
      lock.lock();
    }
    if (pending_.empty()) drained_.notify_all();
  }
}

std::optional<Watchdog::Failure> Watchdog::poll_once(
    std::vector<Pending>& pending, const std::vector<std::shared_ptr<NcclComm>>& comms) {
  for (const std::shared_ptr<NcclComm>& comm : comms) {
    const ncclResult_t state = comm->async_error();
    if (state == ncclSuccess || state == ncclInProgress) continue;
    Failure failure;
    failure.code = error_code_for(state);
    failure.context = base_;
    // The oldest Work on the failing device is the one the error most likely belongs to.
    for (const Pending& p : pending) {
      if (p.device == comm->device()) {
        failure.context = p.work->context();
        break;
      }
    }
    const std::string cause = fmt::format(
        "NCCL reported {} on the communicator on cuda:{}; the group's NCCL communicators were "
        "aborted",
        describe_nccl_result(state, nullptr), comm->device());
    failure.for_others = cause;
    return failure;
  }
  const Clock::time_point now = Clock::now();
  for (Pending& p : pending) {
    try {
      if (p.end->query()) {
        p.work->complete_if_pending();
        p.end = nullptr;  // done: removed from the list
        continue;
      }
    } catch (const Error& e) {
      Failure failure;
      failure.code = e.code();
      failure.context = p.work->context();
      failure.first = p.work.get();
      failure.error = std::current_exception();
      failure.for_others = fmt::format("failed with the group: {}", e.what());
      return failure;
    }
    if (now >= p.deadline) {
      Failure failure;
      failure.code = ErrorCode::Timeout;
      failure.context = p.work->context();
      failure.first = p.work.get();
      failure.error = std::make_exception_ptr(
          Error(ErrorCode::Timeout, p.work->context(),
                fmt::format("did not finish on cuda:{} within {}; the group's NCCL communicators "
                            "were aborted (a rank is stuck, gone or issued other collectives; set "
                            "WEFT_TIMEOUT)",
                            p.device, format_timeout(p.work->timeout()))));
      failure.for_others = fmt::format("failed with the group: {} timed out on cuda:{}",
                                       p.work->context().describe(), p.device);
      return failure;
    }
  }
  return std::nullopt;
}

void Watchdog::break_group(const Failure& failure, bool record) {
  std::vector<Pending> victims;
  std::vector<std::shared_ptr<NcclComm>> comms;
  std::string first_message;
  if (failure.error) {
    try {
      std::rethrow_exception(failure.error);
    } catch (const std::exception& e) {
      first_message = e.what();
    }
  } else {
    first_message = Error(failure.code, failure.context, failure.for_others).what();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) return;
    broken_ = Broken{failure.code,
                     failure.code == ErrorCode::Aborted ? failure.for_others : first_message};
    victims.swap(pending_);
    comms = comms_;
  }
  if (record) {
    WEFT_LOG_WARN("{}", first_message);
    failure_.record(failure.context, first_message);
  }
  for (const std::shared_ptr<NcclComm>& comm : comms) comm->abort();
  for (const Pending& p : victims) {
    if (p.work.get() == failure.first) {
      p.work->fail_if_pending(failure.error);
    } else if (failure.code == ErrorCode::Aborted) {
      p.work->fail_if_pending(std::make_exception_ptr(Error(
          ErrorCode::Aborted, p.work->context(), fmt::format("aborted: {}", failure.for_others))));
    } else {
      p.work->fail_if_pending(
          std::make_exception_ptr(Error(failure.code, p.work->context(), failure.for_others)));
    }
  }
  drained_.notify_all();
}

}  // namespace weft::nccl
