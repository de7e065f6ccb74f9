// backends/nccl/event_pool.h: CUDA events reused across collectives, and the end event a Work
// completes on.
//
// Every collective records two events (its caller stream's point, its own end), so creating them
// per call would cost two cudaEventCreate/Destroy pairs on the critical path. A pool per device
// keeps released events (timing disabled, the cheapest kind) for the next call.
//
// Lifetime: an end event goes back to the pool only when its EndEvent dies, that is when neither
// the Work nor the watchdog can query it any more; an event that went back while a Work still
// held it could be recorded again by a later collective, and the Work would read that one's state.
// The pool is shared by the EndEvents it lent, so a Work that outlives its backend keeps it.
//
// Thread safety: acquire() and release() may be called from any thread (one mutex guards the free
// list). EndEvent's methods may run on any thread concurrently (CUDA's event calls are).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

#include "weft/error.h"
#include "weft/work.h"

namespace weft::nccl {

class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A free event, or a new one on the pool's device. REQUIRES: the calling thread's current
  // device is the pool's. Throws Error(Internal) naming `context` when CUDA refuses.
  cudaEvent_t acquire(const ErrorContext& context);
  void release(cudaEvent_t event);
  int device() const { return device_; }

 private:
  const int device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;  // guarded by mutex_
};

// The end of one operation on its device: the event recorded after its last NCCL call.
class EndEvent final : public DeviceCompletion {
 public:
  EndEvent(std::shared_ptr<EventPool> pool, cudaEvent_t event, ErrorContext context)
      : pool_(std::move(pool)), event_(event), context_(std::move(context)) {}
  ~EndEvent() override { pool_->release(event_); }

  // Records the event on `stream` (after what is queued there). Error(Internal) when CUDA refuses.
  void record(cudaStream_t stream);
  // cudaEventQuery: true when passed, false when not yet; Error(Internal) on a device error.
  bool query() override;
  // cudaStreamWaitEvent(stream, event). Error(Internal) when CUDA refuses.
  void block_stream(CudaStream stream) override;

 private:
  std::shared_ptr<EventPool> pool_;
  cudaEvent_t event_;
  ErrorContext context_;
};

}  // namespace weft::nccl
