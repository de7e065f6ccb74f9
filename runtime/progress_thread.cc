#include "runtime/progress_thread.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "runtime/log.h"

namespace weft {
namespace {

// Linux limits thread names to 15 characters plus the terminator; longer names are refused.
constexpr size_t kMaxThreadName = 15;

// How often a destructor stuck on a task that ignores the abort hook says so: drain_timeout,
// kept between these so the log is neither flooded nor silent for minutes.
constexpr std::chrono::milliseconds kMinWarnInterval{1000};
constexpr std::chrono::milliseconds kMaxWarnInterval{60'000};

// now + timeout, clamped instead of overflowing (drain_timeout may be milliseconds::max()).
std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  auto now = std::chrono::steady_clock::now();
  auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::time_point::max() - now);
  return timeout >= room ? std::chrono::steady_clock::time_point::max() : now + timeout;
}

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

bool is_aborted_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.code() == ErrorCode::Aborted;
  } catch (...) {
    return false;
  }
}

}  // namespace

ProgressThread::ProgressThread(std::string name, std::chrono::milliseconds drain_timeout,
                               std::chrono::milliseconds work_timeout, bool caller_runs)
    : name_(std::move(name)),
      drain_timeout_(drain_timeout),
      work_timeout_(work_timeout),
      caller_runs_(caller_runs) {
  if (drain_timeout_.count() < 0) {
    throw_error(ErrorCode::InvalidArgument, fmt::format("progress thread \"{}\"", name_),
                fmt::format("negative drain timeout {} ms", drain_timeout_.count()));
  }
  if (work_timeout_ != Work::kDefaultTimeout && work_timeout_.count() < 0) {
    throw_error(ErrorCode::InvalidArgument, fmt::format("progress thread \"{}\"", name_),
                fmt::format("negative work timeout {} ms", work_timeout_.count()));
  }
  helper_link_->owner = this;
  thread_ = std::thread([this] { loop(); });
  std::string short_name = name_.substr(0, kMaxThreadName);
  // Only a debugging aid: a failure leaves the thread unnamed and changes nothing else.
  pthread_setname_np(thread_.native_handle(), short_name.c_str());
}

ProgressThread::~ProgressThread() {
  {
    // Waits for an inline run in progress; none starts after this.
    std::lock_guard<std::mutex> link_lock(helper_link_->mutex);
    helper_link_->owner = nullptr;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  bool drained = idle_cv_.wait_until(lock, deadline_after(drain_timeout_),
                                     [this] { return queue_.empty() && running_ == nullptr; });
  if (!drained) {
    size_t left = queue_.size() + (running_ != nullptr ? 1 : 0);
    lock.unlock();
    abort(
        fmt::format("progress thread \"{}\" destroyed with {} task(s) unfinished after waiting "
                    "{} ms for them",
                    name_, left, drain_timeout_.count()));
    lock.lock();
  }
  stopping_ = true;
  task_cv_.notify_one();
  // The running task, if any, was told to stop by the abort hook; say so if it does not listen.
  auto warn_every = std::clamp(drain_timeout_, kMinWarnInterval, kMaxWarnInterval);
  while (!idle_cv_.wait_for(lock, warn_every, [this] { return exited_; })) {
    WEFT_LOG_WARN("progress thread \"{}\": still waiting for {} to return after abort", name_,
                  running_ != nullptr ? running_->context().describe() : "its last task");
  }
  lock.unlock();
  thread_.join();
}

std::shared_ptr<Work> ProgressThread::submit(ErrorContext context, std::function<void()> task,
                                             bool defer, TraceRef trace) {
  WEFT_CHECK(task != nullptr, "submit needs a task");
  auto work = std::make_shared<Work>(std::move(context), work_timeout_);
  work->set_trace(std::move(trace));
  std::weak_ptr<HelperLink> link = helper_link_;
  const Work* raw = work.get();
  if (caller_runs_)
    work->set_wait_helper([link, raw] {
      std::shared_ptr<HelperLink> held = link.lock();
      if (!held) return;
      // try_lock: a callback of an inline run that waits for another Work must not deadlock here;
      // it simply sleeps until the progress thread runs that Work.
      std::unique_lock<std::mutex> link_lock(held->mutex, std::try_to_lock);
      if (link_lock.owns_lock() && held->owner != nullptr) held->owner->run_inline(raw);
    });
  defer = defer && caller_runs_;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) {
      const Clock::time_point now = Clock::now();
      if (defer) {
        queue_.push_back(Task{work, std::move(task), now + kDeferral});
        ++deferred_;
        hot_until_ = now + kHotPeriod;
        // A hot thread looks at the queue within kDeferral anyway: no wake-up.
        if (sleep_ == Sleep::UntilNotified) task_cv_.notify_one();
      } else {
        // Urgent: whatever is queued ahead must start now too.
        for (size_t i = queue_.size() - deferred_; i < queue_.size(); ++i) {
          queue_[i].not_before = Clock::time_point::min();
        }
        deferred_ = 0;
        queue_.push_back(Task{work, std::move(task)});
        if (sleep_ != Sleep::Awake) task_cv_.notify_one();
      }
      return work;
    }
    reason = abort_reason_;
  }
  work->fail(std::make_exception_ptr(
      Error(ErrorCode::Aborted, work->context(),
            fmt::format("issued after the progress thread was aborted: {}", reason))));
  return work;
}

void ProgressThread::set_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  abort_hook_ = std::move(hook);
}

void ProgressThread::abort(const std::string& reason) {
  std::deque<Task> dropped;
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
    dropped.swap(queue_);
    deferred_ = 0;
    hook = std::move(abort_hook_);
    if (running_ == nullptr) idle_cv_.notify_all();
  }
  // The hook first: the running task may be holding up a peer, and the queued Works only need
  // marking.
  if (hook) {
    try {
      hook();
    } catch (const std::exception& e) {
      WEFT_LOG_ERROR("progress thread \"{}\": abort hook threw (ignored): {}", name_, e.what());
    } catch (...) {
      WEFT_LOG_ERROR("progress thread \"{}\": abort hook threw (ignored)", name_);
    }
  }
  for (auto& task : dropped) {
    task.work->fail(
        std::make_exception_ptr(Error(ErrorCode::Aborted, task.work->context(),
                                      fmt::format("aborted before it ran: {}", reason))));
  }
}

bool ProgressThread::is_aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_;
}

size_t ProgressThread::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size();
}

void ProgressThread::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stopping_ && queue_.empty()) break;
    const Clock::time_point now = Clock::now();
    // A task run inline by a waiting caller holds running_: nothing starts until it ends.
    if (!queue_.empty() && running_ == nullptr) {
      const Clock::time_point start_at = queue_.front().not_before;
      if (start_at <= now || stopping_) {
        run_front(lock);
        if (queue_.empty()) idle_cv_.notify_all();
        continue;
      }
      // Deferred: give a waiting caller until start_at to claim it.
      sleep_ = Sleep::Timed;
      wake_at_ = start_at;
      task_cv_.wait_until(lock, start_at);
    } else if (now < hot_until_) {
      sleep_ = Sleep::Timed;
      wake_at_ = std::min(hot_until_, now + kDeferral);
      task_cv_.wait_until(lock, wake_at_);
    } else {
      sleep_ = Sleep::UntilNotified;
      task_cv_.wait(lock);
    }
    sleep_ = Sleep::Awake;
  }
  exited_ = true;
  idle_cv_.notify_all();
}

void ProgressThread::run_inline(const Work* work) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_ || running_ != nullptr) return;
  // Claim `work` and the deferred tasks ahead of it; anything else ahead is the thread's to run.
  size_t claim = 0;
  while (claim < queue_.size() && queue_[claim].work.get() != work) {
    if (queue_[claim].not_before == Clock::time_point::min()) return;
    ++claim;
  }
  if (claim == queue_.size()) return;
  for (size_t i = 0; i <= claim && !aborted_ && !queue_.empty(); ++i) run_front(lock);
  // The destructor may be waiting for the queue to drain, the thread for queued work. A thread in
  // a timed sleep that ends before the next task may start needs no wake-up: on a core it shares
  // with this caller, each one preempted the caller twice, about 17 us per small collective
  // waited on one by one (50 queued 8-byte all_reduces, 2 ranks bound to 2 cores).
  if (queue_.empty()) {
    idle_cv_.notify_all();
  } else if (sleep_ == Sleep::UntilNotified ||
             (sleep_ == Sleep::Timed && queue_.front().not_before < wake_at_)) {
    task_cv_.notify_one();
  }
}

void ProgressThread::run_front(std::unique_lock<std::mutex>& lock) {
  Task task = std::move(queue_.front());
  queue_.pop_front();
  deferred_ = std::min(deferred_, queue_.size());
  running_ = task.work.get();
  lock.unlock();
  run_task(task);
  // Drop what the task captured before the next one starts, so that its buffers are not kept
  // alive for the length of an unrelated collective.
  task.run = nullptr;
  lock.lock();
  running_ = nullptr;
}

void ProgressThread::run_task(Task& task) {
  task.work->mark_started();
  std::exception_ptr error;
  try {
    task.run();
  } catch (...) {
    error = std::current_exception();
  }
  if (error == nullptr) {
    task.work->complete();
    return;
  }
  bool aborted = false;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted = aborted_;
    reason = abort_reason_;
  }
  if (aborted && !is_aborted_error(error)) {
    error = std::make_exception_ptr(
        Error(ErrorCode::Aborted, task.work->context(),
              fmt::format("aborted while running: {} (the operation then failed with: {})", reason,
                          describe_exception(error))));
  }
  task.work->fail(std::move(error));
}

}  // namespace weft
