#include "weft/work.h"

#include <utility>

#include <fmt/format.h>

#include "weft/config.h"

#include "runtime/flight_recorder.h"
#include "runtime/log.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;

// "250 ms", "2500 ms", "30 s": how long a wait lasted, exact, in the unit WEFT_TIMEOUT was
// probably written in.
std::string format_duration(std::chrono::milliseconds duration) {
  auto ms = duration.count();
  if (ms >= 1000 && ms % 1000 == 0) return fmt::format("{} s", ms / 1000);
  return fmt::format("{} ms", ms);
}

// now + timeout, clamped to time_point::max() instead of overflowing (a caller may pass
// milliseconds::max() to mean "as long as it takes").
Clock::time_point deadline_after(Clock::time_point now, std::chrono::milliseconds timeout) {
  auto room = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

// Resolves kDefaultTimeout against `fallback`; refuses other negative values.
std::chrono::milliseconds resolve_timeout(std::chrono::milliseconds timeout,
                                          std::chrono::milliseconds fallback,
                                          const ErrorContext& context, const char* what) {
  if (timeout == Work::kDefaultTimeout) return fallback;
  if (timeout.count() < 0) {
    throw Error(ErrorCode::InvalidArgument, context,
                fmt::format("{}: negative timeout {} ms (use Work::kDefaultTimeout for the "
                            "default)",
                            what, timeout.count()));
  }
  return timeout;
}

}  // namespace

Work::Work(ErrorContext context, std::chrono::milliseconds timeout)
    : context_(std::move(context)),
      timeout_(resolve_timeout(timeout, config().timeout, context_, "Work")) {}

Work::~Work() = default;

std::shared_ptr<Work> Work::completed(ErrorContext context) {
  auto work = std::make_shared<Work>(std::move(context));
  work->complete();
  return work;
}

std::shared_ptr<Work> Work::failed(ErrorContext context, std::exception_ptr error) {
  auto work = std::make_shared<Work>(std::move(context));
  work->fail(std::move(error));
  return work;
}

bool Work::is_completed() const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Pending) return true;
    if (device_ == nullptr) return false;
  }
  return poll_device();
}

void Work::set_device_completion(std::shared_ptr<DeviceCompletion> completion) {
  WEFT_CHECK(completion != nullptr, "set_device_completion needs an event");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_CHECK(device_ == nullptr, "a Work's device completion was set twice");
    device_ = std::move(completion);
  }
  completed_cv_.notify_all();
}

std::shared_ptr<DeviceCompletion> Work::device_completion() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return device_;
}

bool Work::poll_device() const {
  std::shared_ptr<DeviceCompletion> device;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Pending) return true;
    device = device_;
  }
  if (device == nullptr) return false;
  // Completing is a change of state that any observer may make once the event has passed (as
  // c10d's isCompleted() does): the Work object itself is never const where it lives.
  Work& self = const_cast<Work&>(*this);
  try {
    if (!device->query()) return false;
    self.complete_if_pending();
  } catch (...) {
    self.fail_if_pending(std::current_exception());
  }
  return true;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_ == State::Succeeded;
}

int Work::source_rank() const {
  // Succeeded is set under the mutex after the backend wrote the rank: reading it after
  // is_success() sees the write.
  if (source_ == nullptr || !is_success()) return -1;
  return *source_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::wait(std::chrono::milliseconds timeout) const {
  auto resolved = resolve_timeout(timeout, timeout_, context_, "wait");
  if (wait_helper_ && resolved >= timeout_ && !is_completed()) wait_helper_();
  if (device_expected_) {
    wait_on_device(deadline_after(Clock::now(), resolved), resolved);
    return;
  }
  wait_until(deadline_after(Clock::now(), resolved), resolved);
}

void Work::wait_on_device(Clock::time_point deadline, std::chrono::milliseconds waited) const {
  std::shared_ptr<DeviceCompletion> device;
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    bool ready = completed_cv_.wait_until(
        lock, deadline, [this] { return state_ != State::Pending || device_ != nullptr; });
    if (!ready) {
      throw Error(ErrorCode::Timeout, context_,
                  fmt::format("its device work was not queued within {}; the operation is still "
                              "running (abort the group to stop it, or set WEFT_TIMEOUT)",
                              format_duration(waited)));
    }
    if (state_ == State::Pending) device = device_;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
  if (device != nullptr) device->block_stream(current_cuda_stream());
}

void Work::synchronize(std::chrono::milliseconds timeout) const {
  auto resolved = resolve_timeout(timeout, timeout_, context_, "synchronize");
  if (!device_expected_) {
    wait(resolved);
    return;
  }
  if (wait_helper_ && resolved >= timeout_ && !is_completed()) wait_helper_();
  const auto deadline = deadline_after(Clock::now(), resolved);
  // The device has no way to wake a host thread but the event: poll it, sleeping on the state's
  // condition variable in between (a failure or a watchdog's completion wakes it at once), from
  // 20 us up to 1 ms per round.
  auto slice = std::chrono::microseconds(20);
  while (!poll_device()) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    if (now >= deadline) break;
    completed_cv_.wait_until(lock, std::min(deadline, now + slice),
                             [this] { return state_ != State::Pending; });
    slice = std::min(slice * 2, std::chrono::microseconds(1000));
  }
  wait_until(deadline, resolved);
}

void Work::wait_until(Clock::time_point deadline, std::chrono::milliseconds waited) const {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    bool done =
        completed_cv_.wait_until(lock, deadline, [this] { return state_ != State::Pending; });
    if (!done) {
      throw Error(ErrorCode::Timeout, context_,
                  fmt::format("did not complete within {}; the operation is still running "
                              "(abort the group to stop it, or set WEFT_TIMEOUT)",
                              format_duration(waited)));
    }
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

void Work::wait_quietly_until(Clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(mutex_);
  completed_cv_.wait_until(lock, deadline, [this] { return state_ != State::Pending; });
}

void Work::on_complete(Callback callback) {
  WEFT_CHECK(callback != nullptr, "on_complete needs a callable");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::Pending) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  run_callback(callback);
}

std::shared_ptr<Work> Work::then(Callback callback) {
  WEFT_CHECK(callback != nullptr, "then needs a callable");
  auto next = std::make_shared<Work>(context_, timeout_);
  next->set_wait_helper(wait_helper_);
  // The callback runs outside run_callback's catch-all: what it throws fails `next`.
  on_complete([next, callback = std::move(callback)](const Work& done) {
    try {
      callback(done);
    } catch (...) {
      next->fail(std::current_exception());
      return;
    }
    next->complete();
  });
  return next;
}

std::shared_future<void> Work::get_future() {
  auto promise = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = promise->get_future().share();
  on_complete([promise](const Work& done) {
    if (std::exception_ptr error = done.exception()) {
      promise->set_exception(error);
    } else {
      promise->set_value();
    }
  });
  return future;
}

void Work::complete() { finish(State::Succeeded, nullptr); }

void Work::fail(std::exception_ptr error) {
  WEFT_CHECK(error != nullptr, "fail() needs an error");
  finish(State::Failed, std::move(error));
}

bool Work::complete_if_pending() { return finish(State::Succeeded, nullptr, true); }

bool Work::fail_if_pending(std::exception_ptr error) {
  WEFT_CHECK(error != nullptr, "fail_if_pending() needs an error");
  return finish(State::Failed, std::move(error), true);
}

void Work::mark_started() const {
  if (trace_.recorder) trace_.recorder->started(trace_);
}

bool Work::finish(State state, std::exception_ptr error, bool if_pending) {
  if (if_pending) {
    // Several threads may race to finish this Work: claim it before reporting to the recorder.
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Pending || finishing_) return false;
    finishing_ = true;
  }
  // The recorder first: a failure may dump the process's flight recorders, and that must happen
  // before a waiter learns of the failure (and perhaps exits).
  if (trace_.recorder) trace_.recorder->finished(trace_, error);
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_CHECK(state_ == State::Pending && (if_pending || !finishing_),
               "a Work was completed twice (complete() or fail() after completion)");
    state_ = state;
    error_ = std::move(error);
    callbacks.swap(callbacks_);
  }
  // Waiters are woken before callbacks run, so a slow callback never delays them.
  completed_cv_.notify_all();
  for (const auto& callback : callbacks) run_callback(callback);
  return true;
}

void Work::run_callback(const Callback& callback) const {
  try {
    callback(*this);
  } catch (const std::exception& e) {
    WEFT_LOG_ERROR("{}: completion callback threw (ignored): {}", context_.describe(), e.what());
  } catch (...) {
    WEFT_LOG_ERROR("{}: completion callback threw a non-standard exception (ignored)",
                   context_.describe());
  }
}

void wait_all(std::span<const std::shared_ptr<Work>> works, std::chrono::milliseconds timeout) {
  for (size_t i = 0; i < works.size(); ++i) {
    if (works[i] == nullptr) {
      throw Error(
          ErrorCode::InvalidArgument,
          fmt::format("wait_all: InvalidArgument: entry {} of {} is a null Work", i, works.size()));
    }
  }
  if (timeout != Work::kDefaultTimeout && timeout.count() < 0) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("wait_all: InvalidArgument: negative timeout {} ms (use "
                            "Work::kDefaultTimeout for each Work's own)",
                            timeout.count()));
  }
  const auto start = Clock::now();
  // Host Works of one group complete in issue order (one progress thread runs them): waiting for
  // the last one first costs the caller one wake-up, not one per Work, and its wait helper may
  // run the deferred small collectives queued ahead of it on this thread. The loop below then
  // finds them complete and reports the first error in list order, as before.
  const auto same_queue = [&] {
    for (const auto& work : works) {
      if (work->device_expected_ || work->context_.group != works.back()->context_.group) {
        return false;
      }
    }
    return true;
  };
  if (works.size() > 1 && !works.back()->is_completed() && same_queue()) {
    const Work& last = *works.back();
    auto resolved = timeout == Work::kDefaultTimeout ? last.timeout() : timeout;
    if (last.wait_helper_ && resolved >= last.timeout()) last.wait_helper_();
    last.wait_quietly_until(deadline_after(start, resolved));
  }
  for (const auto& work : works) {
    auto resolved = timeout == Work::kDefaultTimeout ? work->timeout() : timeout;
    if (work->wait_helper_ && resolved >= work->timeout() && !work->is_completed()) {
      work->wait_helper_();
    }
    if (work->device_expected_) {
      work->wait_on_device(deadline_after(start, resolved), resolved);
    } else {
      work->wait_until(deadline_after(start, resolved), resolved);
    }
  }
}

}  // namespace weft
