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
  std::lock_guard<std::mutex> lock(mutex_);
  return state_ != State::Pending;
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
  wait_until(deadline_after(Clock::now(), resolved), resolved);
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

void Work::mark_started() const {
  if (trace_.recorder) trace_.recorder->started(trace_);
}

void Work::finish(State state, std::exception_ptr error) {
  // The recorder first: a failure may dump the process's flight recorders, and that must happen
  // before a waiter learns of the failure (and perhaps exits).
  if (trace_.recorder) trace_.recorder->finished(trace_, error);
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_CHECK(state_ == State::Pending,
               "a Work was completed twice (complete() or fail() after completion)");
    state_ = state;
    error_ = std::move(error);
    callbacks.swap(callbacks_);
  }
  // Waiters are woken before callbacks run, so a slow callback never delays them.
  completed_cv_.notify_all();
  for (const auto& callback : callbacks) run_callback(callback);
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
  for (const auto& work : works) {
    auto resolved = timeout == Work::kDefaultTimeout ? work->timeout() : timeout;
    if (work->wait_helper_ && resolved >= work->timeout() && !work->is_completed()) {
      work->wait_helper_();
    }
    work->wait_until(deadline_after(start, resolved), resolved);
  }
}

}  // namespace weft
