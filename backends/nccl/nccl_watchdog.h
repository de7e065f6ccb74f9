// backends/nccl/nccl_watchdog.h: the thread that completes, times out and fails the nccl
// backend's Works, and breaks the group when NCCL reports an error.
//
// NCCL has no way to wake a host thread: a collective's end is an event on the device, a peer's
// death an async error on the communicator. So one thread per backend polls both, every `poll`
// (WEFT_NCCL_POLL, 1 ms) while any Work is pending, and sleeps on a condition variable (no CPU at
// all) while none is:
//
//   each round | what it finds                        | what it does
//   -----------+--------------------------------------+------------------------------------------
//              | a Work's end event passed            | completes it (complete_if_pending)
//              | a communicator's async error         | breaks the group: PeerLost for
//              |                                      | ncclRemoteError, Internal otherwise
//              | a Work past its deadline             | breaks the group: Timeout
//              | a device error on an event           | breaks the group: Internal
//
// Breaking the group aborts every communicator (ncclCommAbort: the kernels stop), fails every
// pending Work naming its rank, group, op and sequence number and the cause, records the first
// failure in the group's store (backends/common/group_failure.h), and fails every later post
// with the same cause. abort() does the same with Aborted.
//
// Thread safety: every method may be called from any thread. mutex_ guards the pending list, the
// communicators and the broken state; Works are completed and failed outside it (their callbacks
// run on this thread).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "weft/error.h"
#include "weft/store.h"
#include "weft/work.h"

#include "backends/common/group_failure.h"
#include "backends/nccl/nccl_comm.h"

namespace weft::nccl {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // `base`: rank, size and group, for errors that no single Work owns (a communicator's).
  Watchdog(std::shared_ptr<Store> store, ErrorContext base, std::chrono::milliseconds poll);
  // stop(): joins the thread. Leaves pending Works as they are (the backend drains first).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Polls `comm`'s async error from now on, and aborts it when the group breaks.
  void add_comm(std::shared_ptr<NcclComm> comm);

  // Watches `work` until its `end` passes (completing it) or `deadline` (breaking the group). A
  // group already broken or aborted fails it at once, with the cause.
  void track(std::shared_ptr<Work> work, std::shared_ptr<DeviceCompletion> end, int device,
             Clock::time_point deadline);

  // nullptr while the group is usable, else the error a later operation described by `context`
  // fails with: Aborted with the abort's reason, or the first failure's code and message.
  std::exception_ptr refusal(const ErrorContext& context) const;

  // Breaks the group with Aborted carrying `reason`: aborts the communicators, fails every
  // pending Work. Bounded; only the first call (or the first failure) has an effect.
  void abort(const std::string& reason);

  // Breaks the group after a failure the posting thread met (a communicator that did not
  // initialise, an NCCL call that failed): records `error`'s message in the group's store,
  // aborts the communicators, fails the pending Works and every later post with its code.
  void fail_group(const Error& error, const ErrorContext& context);

  // Blocks until no Work is pending or `deadline` passes; returns whether none is.
  bool drain(Clock::time_point deadline);

  // The communicators added, for the backend's destructor.
  std::vector<std::shared_ptr<NcclComm>> comms() const;

 private:
  struct Pending {
    std::shared_ptr<Work> work;
    std::shared_ptr<DeviceCompletion> end;
    int device;
    Clock::time_point deadline;
  };
  // Why the group broke: the code later operations fail with, and what they say.
  struct Broken {
    ErrorCode code;
    std::string cause;
  };

  void run();
  // One round over `pending` and `comms` (copies, outside the lock). Completes what passed;
  // returns the failure to break the group with, if any.
  struct Failure {
    ErrorCode code;
    ErrorContext context;         // the Work or communicator that failed first
    const Work* first = nullptr;  // that Work, when a Work failed first
    std::exception_ptr error;     // that Work's error
    std::string for_others;       // what every other pending Work's error says
  };
  std::optional<Failure> poll_once(std::vector<Pending>& pending,
                                   const std::vector<std::shared_ptr<NcclComm>>& comms);
  // Marks the group broken (first call only), aborts the communicators and fails every pending
  // Work: failure.first with failure.error, the others with failure.for_others. `record`: write
  // the failure to the group's store (not for a local abort).
  void break_group(const Failure& failure, bool record);

  backends::GroupFailure failure_;
  const ErrorContext base_;
  const std::chrono::milliseconds poll_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;                  // pending work, or stop
  std::condition_variable drained_;               // pending_ became empty
  std::vector<Pending> pending_;                  // guarded by mutex_; in post order
  std::vector<std::shared_ptr<NcclComm>> comms_;  // guarded by mutex_
  std::optional<Broken> broken_;                  // guarded by mutex_
  bool stop_ = false;                             // guarded by mutex_
  std::thread thread_;
};

}  // namespace weft::nccl
