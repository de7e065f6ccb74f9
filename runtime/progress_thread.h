// runtime/progress_thread.h: the one thread per backend that runs its collectives in issue order.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "weft/error.h"
#include "weft/work.h"

namespace weft {

// How long past a request's deadline a transport may keep the caller's buffer while it takes the
// request back from a silent peer (the shared-memory transport waits this long for a stopped
// peer to acknowledge a single-copy send it may still read).
inline constexpr std::chrono::seconds kWithdrawBound{2};

// How long a Work's default wait() waits past its collective's own deadline (the group's
// `timeout`, counted from its start) before giving up with a generic Timeout: long enough for the
// collective's own error, which names the peer not heard from, to come first, including a
// withdrawal from a silent peer (kWithdrawBound) and what the backend asks the store on the way
// out. The trace watchdog allows the same before it calls an operation overdue.
inline std::chrono::nanoseconds wait_margin(std::chrono::nanoseconds timeout) {
  return std::max<std::chrono::nanoseconds>(std::chrono::seconds(1), timeout / 10) + kWithdrawBound;
}

// A ProgressThread runs submitted tasks one at a time, in submission (issue) order, on a thread
// of its own, and completes each task's Work: a task that returns succeeds it, a task that throws
// fails it with what it threw. A process group's backend submits each collective here, so the
// caller's thread goes on computing while the collective runs, and collectives of one group never
// overlap or reorder (every rank must run them in the same order).
//
//   state      | submit()                     | queued tasks          | running task
//   -----------+------------------------------+-----------------------+--------------------------
//   running    | queues; Work pending         | run in FIFO order     | runs to its end
//   aborted    | returns a Work failed with   | failed with Aborted   | abort hook called so it
//              | Aborted; the task never runs | at once, never run    | unblocks; fails Aborted
//
// abort() is one-way: nothing leaves the aborted state. A running task that throws after an
// abort has its Work failed with Error(Aborted) (its own error quoted in the message), because
// what the caller must act on is the abort, not whatever the torn-down transport reported; a
// running task that returns normally despite the abort has succeeded.
//
// Destruction drains, then aborts: the destructor waits up to drain_timeout for the queued and
// running tasks to finish (what a user destroying a group after issuing work expects: it gets
// done), then aborts whatever is left with "destroyed" as the reason, and joins the thread. The
// join waits for the running task to return, so tasks must honour the abort hook or their own
// deadline (every weft blocking call has one); while it waits the destructor logs a warning every
// drain_timeout (at least 1 s, at most 60 s) naming the task.
//
// Caller runs (when enabled at construction): a thread that wait()s for a Work whose task is first
// in the queue while no task runs takes the task and runs it itself (Work::set_wait_helper),
// instead of sleeping until the progress thread has woken, run it, and woken it back: for a small
// collective those two wake-ups are most of its latency. Order is kept (only the first queued task,
// only when none runs); the task sees no difference but the thread, and its Work's callbacks run on
// the caller.
//
// Deferred start (caller-runs threads only): a task submitted with `defer` (a backend does so
// for small collectives, whose latency two thread wake-ups would double) does not wake the
// thread; the thread starts it at most kDeferral after its submission if no caller has claimed it
// by then. A caller that waits for a deferred task claims it and the deferred tasks queued ahead
// of it, and runs them in order on its own thread: a small collective then costs no wake-up at
// all. So that a deferred submission needs no wake-up, the thread stays "hot" for kHotPeriod
// after one: it sleeps in timed slices of kDeferral instead of until notified, and looks at the
// queue when each ends. A task submitted without `defer` wakes the thread at once and ends the
// deferral of the tasks queued ahead of it. Deferral changes when a task starts, never the order.
//
// A task must not wait() for the Work of a task submitted after it: that task cannot start
// before this one returns, so the wait can only time out.
//
// Thread safety: submit(), abort(), set_abort_hook() and the accessors may be called from any
// thread, concurrently, including from a task or a Work callback on the progress thread itself.
// One mutex guards the queue and state; the thread sleeps on a condition variable when idle.
// Ownership: a queued task (and what it captures) is owned here until it has run or been
// aborted; its Work is shared with the caller. REQUIRES: the destructor does not run on the
// progress thread (a task or callback must not drop the last reference to the owner).
class ProgressThread {
 public:
  // Starts the thread, named `name` (truncated to 15 characters, the kernel's limit) so that it
  // shows in top and gdb. `drain_timeout` bounds how long the destructor waits for queued work
  // before aborting it; `work_timeout` is the default timeout of each submitted Work
  // (Work::kDefaultTimeout: WEFT_TIMEOUT).
  // `caller_runs` enables running a waited-for task on the waiting thread (see the class comment):
  // only for tasks that honour their own deadline, because a caller running a task inline cannot
  // give up at its wait()'s timeout (a wait with a timeout shorter than the Work's never helps).
  // The longest a deferred task waits for a caller to claim it before the thread starts it.
  static constexpr std::chrono::microseconds kDeferral{1000};
  // How long the thread polls its queue every kDeferral after a deferred submission, instead of
  // sleeping until notified.
  static constexpr std::chrono::milliseconds kHotPeriod{50};

  ProgressThread(std::string name, std::chrono::milliseconds drain_timeout,
                 std::chrono::milliseconds work_timeout = Work::kDefaultTimeout,
                 bool caller_runs = false);
  // Drains for up to drain_timeout, aborts what is left, joins. See the class comment.
  ~ProgressThread();

  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Queues `task` to run after every task submitted before it and returns its pending Work, whose
  // context is `context` (errors about the task start with context.describe()). After abort()
  // the task is dropped and the Work returned has already failed with Error(Aborted).
  // `defer` asks for a deferred start (see the class comment; ignored unless caller_runs).
  // `trace`: the flight recorder entries the Work reports to (Work::set_trace).
  // REQUIRES: task is not empty.
  std::shared_ptr<Work> submit(ErrorContext context, std::function<void()> task, bool defer = false,
                               TraceRef trace = {});

  // Installs what abort() calls to unblock a running task, e.g. the transport's abort(). Called
  // at most once, on the aborting thread, without any lock held; what it throws is logged.
  // Replaces any previous hook. Install it before submitting work that may block.
  void set_abort_hook(std::function<void()> hook);

  // Aborts: fails every queued task's Work with Error(Aborted) whose message carries `reason`,
  // calls the abort hook so a running task unblocks, and makes every later submit() fail. Does
  // not wait for the running task. Safe from any thread; only the first call has an effect.
  // Callbacks of the aborted Works run on the calling thread.
  void abort(const std::string& reason);

  bool is_aborted() const;
  // Tasks queued and not yet started (the running one excluded).
  size_t pending() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Task {
    std::shared_ptr<Work> work;
    std::function<void()> run;
    // Deferred tasks only: when the thread may start it unclaimed; min() for the others.
    Clock::time_point not_before = Clock::time_point::min();
  };
  // What the thread does while it holds no task: mutex_ held to read or write it.
  enum class Sleep { Awake, Timed, UntilNotified };

  // The thread's body: pops and runs tasks until stopping_ with an empty queue.
  void loop();
  // Runs `work`'s task on the calling thread when no task runs and it is first in the queue, or
  // only deferred tasks are queued ahead of it (those run first, in order); otherwise does
  // nothing. Called by Work::wait() through the wait helper.
  void run_inline(const Work* work);

  // What the wait helpers of this thread's Works hold: the thread while it lives. A helper locks
  // `mutex` for the length of its inline run, so the destructor (which clears `owner` first) never
  // frees the thread under it.
  struct HelperLink {
    std::mutex mutex;
    ProgressThread* owner = nullptr;  // guarded by mutex
  };
  std::shared_ptr<HelperLink> helper_link_ = std::make_shared<HelperLink>();
  // Pops the first queued task and runs it with mutex_ released (running_ set meanwhile).
  // REQUIRES: `lock` holds mutex_, the queue is not empty and no task runs.
  void run_front(std::unique_lock<std::mutex>& lock);
  // Runs one task and completes its Work. Called on the progress thread without mutex_ held.
  void run_task(Task& task);

  const std::string name_;
  const std::chrono::milliseconds drain_timeout_;
  const std::chrono::milliseconds work_timeout_;
  const bool caller_runs_;

  mutable std::mutex mutex_;
  // Wakes the thread: a task was queued, or stopping_ was set.
  std::condition_variable task_cv_;
  // Wakes the destructor: the queue emptied with no task running, or the thread exited.
  std::condition_variable idle_cv_;
  std::deque<Task> queue_;  // guarded by mutex_
  // guarded by mutex_: how many tasks at the back of queue_ are deferred. A task submitted
  // without `defer` ends the deferral of every task ahead of it, so the deferred ones are always
  // the last few: submit() touches only those (a program may queue 100,000 operations).
  size_t deferred_ = 0;
  Sleep sleep_ = Sleep::Awake;        // guarded by mutex_
  Clock::time_point hot_until_{};     // guarded by mutex_; see kHotPeriod
  Clock::time_point wake_at_{};       // guarded by mutex_; when a Timed sleep ends
  const Work* running_ = nullptr;     // guarded by mutex_; the task being run, for messages
  bool aborted_ = false;              // guarded by mutex_
  std::string abort_reason_;          // guarded by mutex_; set with aborted_
  bool stopping_ = false;             // guarded by mutex_; the destructor has given up waiting
  bool exited_ = false;               // guarded by mutex_; loop() has returned
  std::function<void()> abort_hook_;  // guarded by mutex_

  // Last: started once every field above is initialised.
  std::thread thread_;
};

}  // namespace weft
