#include "backends/nccl/event_pool.h"

#include "backends/nccl/cuda_util.h"

namespace weft::nccl {

EventPool::~EventPool() {
  // Destroying an event whose record has not passed is allowed: CUDA frees it once it has.
  for (cudaEvent_t event : free_) cudaEventDestroy(event);
}

cudaEvent_t EventPool::acquire(const ErrorContext& context) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      cudaEvent_t event = free_.back();
      free_.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags",
             context);
  return event;
}

void EventPool::release(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(event);
}

void EndEvent::record(cudaStream_t stream) {
  check_cuda(cudaEventRecord(event_, stream), "cudaEventRecord (the operation's end event)",
             context_);
}

bool EndEvent::query() {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) return false;
  check_cuda(status, "cudaEventQuery on the operation's end event", context_);
  return false;
}

void EndEvent::block_stream(CudaStream stream) {
  check_cuda(cudaStreamWaitEvent(stream, event_, 0),
             "cudaStreamWaitEvent (the caller's stream waiting for the operation)", context_);
}

}  // namespace weft::nccl
