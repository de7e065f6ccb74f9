// weft/work.h: weft::Work, the handle every asynchronous operation returns, and wait_all().
//
// A collective posted on a process group runs later, on its backend's progress thread; the caller
// gets a std::shared_ptr<Work> at once and decides when to block on it:
//
//   auto work = pg.all_reduce(grad);    // returns immediately
//   compute_something_else();           // overlaps with the communication
//   work->wait();                       // throws weft::Error if the all_reduce failed
//
// The shape is c10d's Work (is_completed, is_success, exception, wait(timeout)), plus a
// completion callback, and the completion side (complete, fail) that backends call.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "weft/cuda.h"
#include "weft/error.h"

namespace weft {

class FlightRecorder;  // runtime-internal: runtime/flight_recorder.h

// Where a group's flight recorder (docs/flight-recorder.md) keeps an operation, or the
// operations [first, first + count) of a coalesced unit. The group sets it on each Collective it
// posts; a backend hands it to the Work it returns (set_trace()), so that the Work reports when
// the operation starts and how it ends. Empty (no recorder) when recording is off.
struct TraceRef {
  std::shared_ptr<FlightRecorder> recorder;
  uint64_t first = 0;
  uint32_t count = 0;
  uint64_t seq = 0;  // the highest collective sequence number among them; 0: send/recv only
};

// The device side of an operation that ends on a CUDA device (the nccl backend; CUDA tensors on
// a host backend, which copy back on the device): an event recorded after its last kernel or copy.
// A backend gives one to its Work (Work::set_device_completion) once the operation's device work
// is queued. Implementations call the CUDA runtime; weft's core never does.
class DeviceCompletion {
 public:
  virtual ~DeviceCompletion() = default;
  // Whether the device has finished the operation. Never blocks. Throws weft::Error when the
  // device reports an error.
  virtual bool query() = 0;
  // Makes `stream` wait for the operation (cudaStreamWaitEvent): later work queued on `stream`
  // runs after it. Never blocks the host.
  virtual void block_stream(CudaStream stream) = 0;
};

// A Work is the state of one asynchronous operation: pending until the thread that runs the
// operation completes it, then succeeded or failed for good.
//
//   state      | is_completed | is_success | exception() | wait()
//   -----------+--------------+------------+-------------+----------------------------------
//   pending    | false        | false      | nullptr     | blocks; Error(Timeout) past timeout
//   succeeded  | true         | true       | nullptr     | returns
//   failed     | true         | false      | the error   | rethrows the error
//
// Transitions: pending -> succeeded by complete(), pending -> failed by fail(). Nothing leaves
// succeeded or failed: completing a Work twice is a bug in the caller (WEFT_CHECK).
//
// Thread safety: every method may be called from any thread, concurrently. One mutex guards the
// state; waiters block on a condition variable (no spinning) and cost no CPU until the Work
// completes or their timeout passes.
// Ownership: shared. The caller and the thread that runs the operation each hold a shared_ptr;
// the Work lives until both let go. A Work owns its callbacks and whatever they capture until
// they have run.
// Timeouts: each Work carries the timeout it was created with (for a collective, the group's);
// wait() without an argument uses it. A wait that times out throws and leaves the Work running:
// only an abort of its group stops the operation itself.
class Work {
 public:
  // Passed as a timeout to wait() or wait_all(): use each Work's own timeout().
  static constexpr std::chrono::milliseconds kDefaultTimeout{-1};

  using Callback = std::function<void(const Work&)>;

  // A pending Work for the operation `context` describes (rank, group, op, sequence number: the
  // words every error message about it starts with). `timeout` is what wait() uses by default;
  // kDefaultTimeout means WEFT_TIMEOUT (300 s unless set). Throws Error(InvalidArgument) for a
  // negative timeout other than kDefaultTimeout.
  explicit Work(ErrorContext context, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~Work();

  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // An already succeeded Work, for operations with nothing to do (a collective on zero elements,
  // a barrier of one rank).
  static std::shared_ptr<Work> completed(ErrorContext context = {});
  // An already failed Work carrying `error`, for operations refused before they started (a
  // collective issued on an aborted group). REQUIRES: error != nullptr.
  static std::shared_ptr<Work> failed(ErrorContext context, std::exception_ptr error);

  // True once the Work has succeeded or failed. Never blocks beyond the state mutex (for a Work
  // that ends on a device, it also asks the device whether the end event has passed, and
  // completes the Work when it has).
  bool is_completed() const;
  // True once the Work has succeeded; false while pending or after a failure.
  bool is_success() const;
  // The error the Work failed with; nullptr while pending or after success.
  std::exception_ptr exception() const;

  // Blocks until the Work completes or `timeout` passes. Functionally equivalent to
  //
  //   auto deadline = now() + (timeout == kDefaultTimeout ? this->timeout() : timeout);
  //   while (!is_completed()) {
  //     if (now() >= deadline) throw Error(Timeout, context(), "did not complete within ...");
  //   }
  //   if (exception()) std::rethrow_exception(exception());
  //
  // except that it sleeps on a condition variable instead of looping. A failed Work rethrows its
  // stored error (the same object, so code and message are exactly what the operation threw).
  // Past the timeout it throws Error(Timeout) whose message starts with context().describe() and
  // says the operation did not complete in time; the Work keeps running and may complete later.
  // A timeout of 0 checks once. A negative timeout other than kDefaultTimeout throws
  // Error(InvalidArgument). Callbacks may still be running when wait() returns.
  //
  // A Work that ends on a device (expects_device_completion()) follows c10d's CUDA semantics
  // instead: wait() blocks the host only until the operation's device work is queued (at once for
  // the nccl backend), then makes the calling thread's current CUDA stream (weft/cuda.h) wait for
  // it and returns; it rethrows the error of a Work that has already failed. synchronize() is the
  // host-blocking wait.
  void wait(std::chrono::milliseconds timeout = kDefaultTimeout) const;

  // Blocks the host until the Work has completed, device work included, or `timeout` passes
  // (Error(Timeout), as wait()). Rethrows the Work's error. For a Work that does not end on a
  // device it is wait().
  void synchronize(std::chrono::milliseconds timeout = kDefaultTimeout) const;

  // Runs `callback(*this)` once, when the Work completes: at once on the calling thread if it
  // already has, otherwise on the thread that completes it (for a collective, the progress
  // thread: keep callbacks short, they delay the next collective). Callbacks registered before
  // completion run in registration order. An exception thrown by a callback is caught and
  // logged; it never reaches the completing thread and does not stop later callbacks.
  // REQUIRES: callback is not empty.
  void on_complete(Callback callback);

  // c10d's Future.then(): a new Work that completes after `callback(*this)` has run, which it
  // does when this Work completes (as with on_complete(): at once if it has, else on the
  // completing thread). As in c10d (and std::experimental::future::then), the callback runs
  // whether this Work succeeded or failed and decides: the new Work fails with whatever the
  // callback throws and succeeds when it returns, so a callback that should pass a failure on
  // calls w.wait() first (on a completed Work it returns, or rethrows the error, at once). The
  // new Work has this one's context and timeout, and waiting on it helps this one run as
  // waiting on this one does. Chains: work->then(a)->then(b). REQUIRES: callback is not empty.
  std::shared_ptr<Work> then(Callback callback);

  // c10d's Work.get_future(), as a std::shared_future<void>: ready when this Work completes; its
  // get() returns on success and rethrows this Work's error (the same object) on failure. For
  // code that composes std futures; wait() is the direct way (and has this Work's timeout).
  std::shared_future<void> get_future();

  // A receive from any source (ProcessGroup::recv_any): the rank whose message it received,
  // once the Work has succeeded; -1 before that and for every other operation (c10d's
  // Work._source_rank()).
  int source_rank() const;
  // For the group: where the backend writes that rank. Set before the Work is shared.
  void set_source(std::shared_ptr<const int> source) { source_ = std::move(source); }

  // For the executor: the flight recorder entries this Work reports to. Set before the Work is
  // shared; complete() and fail() report the outcome, mark_started() the start.
  void set_trace(TraceRef trace) { trace_ = std::move(trace); }
  bool has_trace() const { return trace_.recorder != nullptr; }
  // For the executor: the operation has started running (the recorder notes the time).
  void mark_started() const;

  // Where this Work's operation runs: rank, group, op and sequence number.
  const ErrorContext& context() const { return context_; }
  // The timeout wait() uses by default (never kDefaultTimeout: resolved at construction).
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Device side, for the backend. expect_device_completion() (before the Work is shared) says the
  // operation ends on a device: wait() then follows the stream semantics above.
  // set_device_completion() hands over the device's end event once the operation's device work
  // is queued (before or after sharing; waiters in wait() are woken). From then on, whoever sees
  // the event pass first (is_completed(), synchronize(), the backend's watchdog) completes the
  // Work, through complete_if_pending().
  void expect_device_completion() { device_expected_ = true; }
  bool expects_device_completion() const { return device_expected_; }
  void set_device_completion(std::shared_ptr<DeviceCompletion> completion);
  // The end event handed over, or nullptr.
  std::shared_ptr<DeviceCompletion> device_completion() const;
  // complete() / fail() for the Work that several threads may finish: only the first call has an
  // effect; returns whether it was this one.
  bool complete_if_pending();
  bool fail_if_pending(std::exception_ptr error);

  // Completion side, for the thread that runs the operation (a backend's progress thread).
  // Each wakes every waiter, then runs the callbacks on the calling thread.
  //
  // Marks the Work succeeded. REQUIRES: pending (a second completion is a WEFT_CHECK failure).
  void complete();
  // Marks the Work failed with `error`, normally a weft::Error built from context(). REQUIRES:
  // pending, error != nullptr.
  void fail(std::exception_ptr error);

  // For the executor that will run the operation: wait() calls `helper` once before it blocks, on
  // the waiting thread, so that the executor may run the operation right there instead of waking
  // a thread of its own (a progress thread runs a waited-for collective on the caller's thread
  // when nothing runs ahead of it: the wake-ups saved are most of a small collective's latency).
  // The helper must return promptly when it cannot help. wait() calls it only when its timeout is
  // at least the Work's own (an inline run cannot stop at a shorter one). Set it before the Work
  // is shared.
  void set_wait_helper(std::function<void()> helper) { wait_helper_ = std::move(helper); }
  // The helper set above (empty if none): a Work that completes after another one forwards it.
  const std::function<void()>& wait_helper() const { return wait_helper_; }

 private:
  enum class State { Pending, Succeeded, Failed };

  // Blocks until completion or `deadline`; on timeout throws Error(Timeout) that reports
  // `waited` as the time waited. Shared by wait() and wait_all().
  void wait_until(std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds waited) const;
  // Blocks until completion or `deadline`, whichever comes first; throws nothing.
  void wait_quietly_until(std::chrono::steady_clock::time_point deadline) const;
  // Moves to `state` and runs the callbacks. REQUIRES: state != Pending. With `if_pending`,
  // returns false (and does nothing) when the Work has already completed.
  bool finish(State state, std::exception_ptr error, bool if_pending = false);
  // For a Work that ends on a device: completes it when its end event has passed (an error the
  // device reports fails it). Returns whether the Work has completed.
  bool poll_device() const;
  // wait() for a Work that ends on a device.
  void wait_on_device(std::chrono::steady_clock::time_point deadline,
                      std::chrono::milliseconds waited) const;
  // Calls `callback`, logging (not propagating) what it throws.
  void run_callback(const Callback& callback) const;

  friend void wait_all(std::span<const std::shared_ptr<Work>> works,
                       std::chrono::milliseconds timeout);

  const ErrorContext context_;
  const std::chrono::milliseconds timeout_;

  mutable std::mutex mutex_;
  // Signalled (notify_all) on the transition out of Pending. Waiters hold mutex_.
  mutable std::condition_variable completed_cv_;
  State state_ = State::Pending;              // guarded by mutex_
  std::exception_ptr error_;                  // guarded by mutex_; set iff state_ == Failed
  std::vector<Callback> callbacks_;           // guarded by mutex_; emptied at completion
  std::function<void()> wait_helper_;         // set before sharing; read-only after
  std::shared_ptr<const int> source_;         // set before sharing; read once succeeded
  TraceRef trace_;                            // set before sharing; read-only after
  bool device_expected_ = false;              // set before sharing; read-only after
  std::shared_ptr<DeviceCompletion> device_;  // guarded by mutex_; set once
  bool finishing_ = false;  // guarded by mutex_; a *_if_pending call has claimed the Work
};

// Waits for every Work in `works`, as if calling wait() on each in order, but against one
// deadline taken at the call: `timeout` from now, or with kDefaultTimeout each Work's own
// timeout from now. Throws the first error met in list order (a failed Work's error, or
// Error(Timeout) naming the first Work still pending at the deadline); Works after it are left
// as they are. Throws Error(InvalidArgument) for a null entry or a bad timeout.
// When every Work is a host Work of one group (their collectives complete in issue order), it
// first waits for the last one, which costs the caller one wake-up instead of one per Work; an
// error of an earlier Work is then reported once the last has completed (or at the deadline).
void wait_all(std::span<const std::shared_ptr<Work>> works,
              std::chrono::milliseconds timeout = Work::kDefaultTimeout);

}  // namespace weft
