// backends/nccl/nccl_comm.h: one NCCL communicator of a group on one device, with the stream its
// collectives run on, its event pool and scratch memory; created, split, destroyed and aborted in
// bounded time.
//
// Every communicator is non-blocking (ncclConfig_t::blocking = 0): NCCL calls return at once,
// possibly with ncclInProgress, and the communicator's async error says when the call's host
// side is done. So no NCCL call can hold a thread past a deadline: wait_ready() polls, bounded,
// and gives up when the communicator is being aborted.
//
// Thread safety. Two locks, taken in this order:
//   use_mutex_   held by the one thread issuing NCCL calls on the communicator (Use, below): the
//                posting thread, split(), destroy. Also what abort() takes before ncclCommAbort,
//                so that the communicator is never freed under a call in progress.
//   state_mutex_ guards comm_ (nullptr once aborted or destroyed) for the short calls any thread
//                makes (async_error() from the watchdog).
// abort() may be called from any thread at any time: it raises aborting_, which makes a holder
// of use_mutex_ stop waiting at once; if the holder does not let go within the abort's budget,
// the holder aborts the communicator itself when it releases it. Either way abort() returns in
// bounded time and the communicator is aborted exactly once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "weft/error.h"

#include "backends/nccl/event_pool.h"

namespace weft::nccl {

class NcclComm {
 public:
  using Clock = std::chrono::steady_clock;

  // Creates the communicator of `size` ranks from a unique id (unique_id_exchange.h) on
  // `device`, non-blocking, and waits until it is ready, `timeout` passes or `cancel` returns true
  // (the backend's abort()). Throws Error(Timeout) naming what it waited for, Error(Aborted), or
  // the code of NCCL's error (nccl_types.h) with NCCL's message; the communicator is aborted
  // first.
  static std::shared_ptr<NcclComm> create(int device, int rank, int size,
                                          const std::vector<uint8_t>& unique_id,
                                          std::chrono::milliseconds timeout,
                                          const std::function<bool()>& cancel,
                                          const ErrorContext& context);
  // Takes over `comm` (ncclCommSplit's result, already ready) on `device`.
  static std::shared_ptr<NcclComm> adopt(ncclComm_t comm, int device, const ErrorContext& context);

  // Destroys the communicator if nothing aborted it: destroy(deadline of 10 s) (a bounded
  // ncclCommFinalize, then ncclCommDestroy; ncclCommAbort if that does not finish).
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int device() const { return device_; }
  // The internal stream every collective on this communicator runs on (non-blocking).
  cudaStream_t stream() const { return stream_; }
  const std::shared_ptr<EventPool>& events() const { return events_; }

  // The right to issue NCCL calls: holds use_mutex_. comm() is nullptr when the communicator is
  // gone (aborted or destroyed): the caller fails its operation with aborted_reason().
  class Use {
   public:
    explicit Use(NcclComm& owner);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ncclComm_t comm() const;

   private:
    NcclComm& owner_;
    std::unique_lock<std::timed_mutex> lock_;
  };

  // After an NCCL call on this communicator returned `result`: when it is ncclInProgress, polls
  // the async error until the call's host side is done, `deadline` passes or an abort begins.
  // Throws Error naming `context` and `what`: Timeout past the deadline, Aborted when aborted,
  // NCCL's code otherwise. REQUIRES: the caller holds a Use.
  void wait_ready(ncclResult_t result, Clock::time_point deadline, const char* what,
                  const ErrorContext& context);

  // ncclCommGetAsyncError; ncclSuccess when the communicator is gone. Any thread.
  ncclResult_t async_error();

  // ncclCommSplit into `color` (NCCL_SPLIT_NOCOLOR: none) ordered by `key`, non-blocking and
  // bounded by `deadline`. Returns the child (nullptr for NCCL_SPLIT_NOCOLOR). Throws as
  // wait_ready().
  ncclComm_t split(int color, int key, Clock::time_point deadline, const ErrorContext& context);

  // Scratch device memory of at least `bytes` on the internal stream, grown stream-ordered
  // (cudaMallocAsync), so it never synchronises the device. Valid for work queued on stream()
  // until the next call. REQUIRES: the caller holds a Use.
  void* scratch(size_t bytes, const ErrorContext& context);

  // ncclCommAbort, once; bounded (see the class comment). Any thread. Returns whether this call
  // (or the holder it asked) aborted it, false when it was already gone.
  bool abort();
  // Finalizes and destroys the communicator within `deadline`, aborting it past that. Any thread.
  void destroy(Clock::time_point deadline);

  bool aborting() const { return aborting_.load(std::memory_order_acquire); }

 private:
  NcclComm(ncclComm_t comm, int device, const ErrorContext& context);
  // Aborts comm_ (under both locks). Returns whether there was one.
  bool abort_locked();

  const int device_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<EventPool> events_;
  void* scratch_ = nullptr;   // guarded by use_mutex_
  size_t scratch_bytes_ = 0;  // guarded by use_mutex_

  std::timed_mutex use_mutex_;
  std::mutex state_mutex_;
  ncclComm_t comm_ = nullptr;  // guarded by state_mutex_ (written also under use_mutex_)
  std::atomic<bool> aborting_{false};
};

}  // namespace weft::nccl
