// tests/support/fake_cuda.h: a stand-in for the CUDA runtime (runtime/cuda_runtime.h) for tests
// on machines without a GPU. Installed with set_cuda_runtime_for_testing(), it lets CUDA tensors
// travel every code path that does not need a device: its "device" memory is host memory, and its
// streams really are queues: a copy queued on a stream happens only when an event recorded after
// it is waited for (stream_wait_event), found done (the second event_done() query: the first
// says "not yet", as a busy device would), or a synchronous copy or stream synchronisation runs.
// Code that reads a buffer before the copy into it has run reads stale bytes (device memory starts
// as 0xEE) and fails the test that uses it. It proves the staging logic, not CUDA: nothing here
// has run on a GPU.
//
// Thread safety: every method may be called from any thread (one mutex).
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "runtime/cuda_runtime.h"

namespace weft::test {

class FakeCuda final : public CudaRuntime {
 public:
  std::string describe() const override { return "fake CUDA runtime (tests/cuda)"; }
  int device_count() override { return 2; }
  void set_device(int) override {}
  int device_of(const void* pointer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [base, bytes] : device_) {
      auto p = static_cast<const char*>(pointer);
      if (p >= base && p < base + bytes) return 0;
    }
    return -1;
  }
  void* host_alloc(size_t bytes) override {
    ++pinned_allocations;
    return std::malloc(bytes);
  }
  void host_free(void* pointer) override { std::free(pointer); }
  void* device_alloc(int, size_t bytes) override {
    auto* p = static_cast<char*>(std::malloc(bytes));
    std::memset(p, 0xEE, bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    device_[p] = bytes;
    return p;
  }
  void device_free(void* pointer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    device_.erase(static_cast<char*>(pointer));
    std::free(pointer);
  }
  void copy_async(void* dst, const void* src, size_t bytes, CudaStream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    queue(stream).push_back([=] { std::memcpy(dst, src, bytes); });
    ++queued_copies;
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [stream, pending] : streams_) run(pending, pending.size());
    std::memcpy(dst, src, bytes);
  }
  void fill(void* dst, int value, size_t bytes) override { std::memset(dst, value, bytes); }
  CudaStream create_stream(int) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto stream = reinterpret_cast<CudaStream>(++next_handle_);
    streams_[stream];
    return stream;
  }
  void destroy_stream(CudaStream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    run(streams_[stream], streams_[stream].size());
    streams_.erase(stream);
  }
  void synchronize_stream(CudaStream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    run(queue(stream), queue(stream).size());
  }
  CudaEvent create_event(int) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto event = reinterpret_cast<CudaEvent>(++next_handle_);
    events_[event] = Event{};
    return event;
  }
  void destroy_event(CudaEvent event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.erase(event);
  }
  // The event covers what `stream` queued so far.
  void record_event(CudaEvent event, CudaStream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Event& e = events_.at(event);
    e.stream = stream;
    e.ticket = executed_[stream] + queue(stream).size();
    e.recorded = true;
  }
  // Not done at the first query (the device is "busy"); the second runs the copies it covers.
  bool event_done(CudaEvent event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Event& e = events_.at(event);
    if (!e.recorded) return true;
    if (e.ticket <= executed_[e.stream]) return true;
    if (!e.queried) {
      e.queried = true;
      return false;
    }
    reach(e);
    return true;
  }
  // A stream waiting for an event: the device runs what the event covers first.
  void stream_wait_event(CudaStream stream, CudaEvent event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Event& e = events_.at(event);
    if (e.recorded) reach(e);
    ++waits[stream];
  }

  // Runs everything queued on `stream` (the caller's kernels "finish").
  void drain(CudaStream stream) { synchronize_stream(stream); }

  std::atomic<int> pinned_allocations{0};
  std::atomic<int> queued_copies{0};
  std::map<CudaStream, int> waits;  // guarded by mutex_

 private:
  struct Event {
    CudaStream stream = nullptr;
    size_t ticket = 0;
    bool recorded = false;
    bool queried = false;
  };
  std::deque<std::function<void()>>& queue(CudaStream stream) { return streams_[stream]; }
  void run(std::deque<std::function<void()>>& pending, size_t n) {
    CudaStream stream = nullptr;
    for (auto& [s, q] : streams_) {
      if (&q == &pending) stream = s;
    }
    for (size_t i = 0; i < n && !pending.empty(); ++i) {
      pending.front()();
      pending.pop_front();
      ++executed_[stream];
    }
  }
  void reach(const Event& e) {
    size_t done = executed_[e.stream];
    if (e.ticket > done) run(queue(e.stream), e.ticket - done);
  }

  std::mutex mutex_;
  std::map<char*, size_t> device_;                                   // guarded by mutex_
  std::map<CudaStream, std::deque<std::function<void()>>> streams_;  // guarded by mutex_
  std::map<CudaStream, size_t> executed_;                            // guarded by mutex_
  std::map<CudaEvent, Event> events_;                                // guarded by mutex_
  uintptr_t next_handle_ = 0x1000;                                   // guarded by mutex_
};

}  // namespace weft::test
