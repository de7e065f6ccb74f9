// backends/nccl/nccl_backend.h: "nccl", the backend for CUDA tensors: NCCL communicators per
// (group, device), collectives on an internal stream ordered after the caller's stream, Works
// that complete on the device, and a watchdog (docs/nccl.md).
//
// A post runs on the calling thread, with no progress thread in between: the group serialises
// posts, and NCCL queues each collective on the device in issue order, so the host's part is a
// few NCCL calls and two event records:
//
//   1. the communicator for the tensors' device (created at its first use: unique id through the
//      group's store, ncclCommInitRankConfig non-blocking, bounded by the group's timeout; or
//      the one the parent group's split() made);
//   2. an event recorded on the caller's stream (Collective::stream), which the internal stream
//      waits for: the collective reads its inputs after what the caller had queued;
//   3. the NCCL calls on the internal stream, then the end event;
//   4. a Work that expects device completion (Work::wait() makes the caller's current stream wait
//      for the end event; synchronize() blocks the host), handed to the watchdog.
//
// Memory: tensors are borrowed views (weft/tensor.h). The collective reads and writes them on the
// internal stream until the end event, so the caller must not free or reuse them before the Work
// completes: after wait() that holds for work the caller queues on its stream later (a caching
// allocator that frees on that stream is safe); a free from another stream needs synchronize().
//
// Thread safety: post(), post_coalesced() and split() are called by the group, one at a time;
// abort() from any thread. The destructor drains (up to the timeout), destroys the communicators
// (aborting them past a deadline) and joins the watchdog: it never hangs.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "weft/backend.h"

#include "backends/nccl/nccl_comm.h"
#include "backends/nccl/nccl_settings.h"
#include "backends/nccl/nccl_watchdog.h"

namespace weft::nccl {

class NcclBackend final : public Backend {
 public:
  // Touches no device unless options.from_parent holds communicators (which it adopts): without
  // a GPU, creation succeeds and the first collective fails with Unsupported naming CUDA's reason.
  // Throws Error(InvalidArgument) for a malformed WEFT_NCCL_* setting.
  explicit NcclBackend(const BackendOptions& options);
  ~NcclBackend() override;

  std::string_view name() const override { return "nccl"; }
  std::shared_ptr<Work> post(Collective collective, ErrorContext context) override;
  // One ncclGroupStart/End around every part (all on one device), one Work for the unit.
  std::shared_ptr<Work> post_coalesced(std::vector<Collective> collectives,
                                       ErrorContext context) override;
  // ncclCommSplit of every communicator this backend has; nullptr when it has none yet.
  std::shared_ptr<void> split(int color, int key, const ErrorContext& context) override;
  void abort(const std::string& reason) override;

  const NcclSettings& settings() const { return settings_; }

 private:
  std::shared_ptr<Work> run(std::vector<Collective> parts, ErrorContext context);
  // The device a unit runs on: its tensors' (all the same), else (a barrier) the last device
  // used, else the calling thread's current device.
  int device_of(const std::vector<Collective>& parts, const ErrorContext& context);
  std::shared_ptr<NcclComm> comm_for(int device, const ErrorContext& context);

  const BackendOptions options_;
  const NcclSettings settings_;
  // Posts and splits are serialised by the group; this guards comms_ against abort() and the
  // destructor.
  std::mutex mutex_;
  std::map<int, std::shared_ptr<NcclComm>> comms_;  // guarded by mutex_; by device
  int next_unique_id_ = 0;                          // guarded by mutex_; uid rounds made
  int last_device_ = -1;                            // guarded by mutex_
  // Raised by abort(): ends a communicator's initialisation in progress on the posting thread.
  std::atomic<bool> aborted_{false};
  Watchdog watchdog_;
};

// What split() returns and BackendOptions::from_parent carries: the child communicators by
// device. Those nobody adopts are aborted when it dies.
struct SplitCommunicators {
  static constexpr uint64_t kMagic = 0x6e63636c73706c74;  // "ncclsplt"
  uint64_t magic = kMagic;
  std::map<int, ncclComm_t> comms;
  ~SplitCommunicators();
};

}  // namespace weft::nccl
