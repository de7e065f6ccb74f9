// CUDA tensors on a host backend: copy in, run on pinned memory, copy out (runtime/cuda_staging.h).
#include "runtime/cuda_staging.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/cuda_runtime.h"
#include "runtime/log.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;

// An event that is destroyed with its last owner (a Work may hold one past the backend's life).
class OwnedEvent {
 public:
  explicit OwnedEvent(int device) : event_(cuda_runtime().create_event(device)) {}
  ~OwnedEvent() {
    try {
      cuda_runtime().destroy_event(event_);
    } catch (const std::exception& e) {
      WEFT_LOG_WARN("cuda staging: destroying an event failed: {}", e.what());
    }
  }
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  CudaEvent get() const { return event_; }

 private:
  CudaEvent event_;
};

// The end of an operation's copies back to the device.
class EventCompletion final : public DeviceCompletion {
 public:
  explicit EventCompletion(std::shared_ptr<OwnedEvent> event) : event_(std::move(event)) {}
  bool query() override { return cuda_runtime().event_done(event_->get()); }
  void block_stream(CudaStream stream) override {
    cuda_runtime().stream_wait_event(stream, event_->get());
  }

 private:
  std::shared_ptr<OwnedEvent> event_;
};

// Pinned host buffers, allocated once (cudaHostAlloc) in power-of-two sizes and reused.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  using Lease = std::shared_ptr<void>;

  ~PinnedPool() {
    for (const Block& block : blocks_) {
      try {
        cuda_runtime().host_free(block.data);
      } catch (const std::exception& e) {
        WEFT_LOG_WARN("cuda staging: freeing a pinned buffer failed: {}", e.what());
      }
    }
  }

  Lease acquire(size_t bytes) {
    const size_t rounded = std::bit_ceil(std::max<size_t>(bytes, 4096));
    std::lock_guard<std::mutex> lock(mutex_);
    Block* chosen = nullptr;
    for (Block& block : blocks_) {
      if (!block.leased && block.bytes >= rounded &&
          (chosen == nullptr || block.bytes < chosen->bytes)) {
        chosen = &block;
      }
    }
    if (chosen == nullptr) {
      blocks_.push_back(Block{cuda_runtime().host_alloc(rounded), rounded, false});
      chosen = &blocks_.back();
    }
    chosen->leased = true;
    void* data = chosen->data;
    return Lease(data, [pool = shared_from_this()](void* released) { pool->release(released); });
  }

 private:
  struct Block {
    void* data;
    size_t bytes;
    bool leased;
  };
  void release(void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Block& block : blocks_) {
      if (block.data == data) block.leased = false;
    }
  }

  std::mutex mutex_;
  std::vector<Block> blocks_;  // guarded by mutex_
};

// The host image of one operation (or coalesced unit): the collectives the host backend runs,
// what to copy in before and out after, and the pinned buffers they use.
struct StagedCall {
  std::vector<Collective> host;
  struct Copy {
    void* device;
    void* pinned;
    size_t bytes;
  };
  std::vector<Copy> copy_in;
  std::vector<Copy> copy_out;
  std::vector<PinnedPool::Lease> leases;
};

bool lies_within(const Tensor& inner, const Tensor& outer) {
  auto begin = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data); };
  return begin(inner) >= begin(outer) &&
         begin(inner) + inner.nbytes() <= begin(outer) + outer.nbytes();
}

// Each output gets a pinned buffer; an input that lies inside an output (the in-place forms)
// takes its place in that output's buffer, so the host backend sees the same aliasing.
void stage(Collective c, PinnedPool& pool, StagedCall& staged, bool keep_trace) {
  std::vector<Tensor> pinned_outputs;
  for (const Tensor& out : c.outputs) {
    Tensor host = out;
    host.device = Device::cpu();
    if (out.count > 0) {
      staged.leases.push_back(pool.acquire(out.nbytes()));
      host.data = staged.leases.back().get();
      staged.copy_out.push_back({out.data, host.data, out.nbytes()});
    }
    pinned_outputs.push_back(host);
  }
  std::vector<Tensor> pinned_inputs;
  for (const Tensor& in : c.inputs) {
    Tensor host = in;
    host.device = Device::cpu();
    if (in.count > 0) {
      host.data = nullptr;
      for (size_t i = 0; i < c.outputs.size(); ++i) {
        if (c.outputs[i].count > 0 && lies_within(in, c.outputs[i])) {
          host.data = static_cast<char*>(pinned_outputs[i].data) +
                      (static_cast<char*>(in.data) - static_cast<char*>(c.outputs[i].data));
          break;
        }
      }
      if (host.data == nullptr) {
        staged.leases.push_back(pool.acquire(in.nbytes()));
        host.data = staged.leases.back().get();
      }
      staged.copy_in.push_back({in.data, host.data, in.nbytes()});
    }
    pinned_inputs.push_back(host);
  }
  c.inputs = std::move(pinned_inputs);
  c.outputs = std::move(pinned_outputs);
  c.stream = nullptr;
  if (!keep_trace) c.trace = TraceRef{};  // the outer Work reports to the recorder, once
  staged.host.push_back(std::move(c));
}

int call_device(const Collective& c) {
  for (const Tensor& t : c.inputs) return t.device.index;
  for (const Tensor& t : c.outputs) return t.device.index;
  return 0;
}

class CudaStagingBackend final : public Backend {
 public:
  CudaStagingBackend(std::unique_ptr<Backend> host, const BackendOptions& options)
      : host_(std::move(host)),
        rank_(options.rank),
        size_(options.size),
        group_(options.group_name),
        timeout_(options.timeout),
        pool_(std::make_shared<PinnedPool>()) {
    thread_ = std::thread([this] { run(); });
  }

  ~CudaStagingBackend() override {
    {
      // Drain what was issued, up to the timeout; then abort the rest.
      std::unique_lock<std::mutex> lock(mutex_);
      if (!done_cv_.wait_for(lock, timeout_, [this] { return in_flight_ == 0; })) {
        lock.unlock();
        abort("the group was destroyed while CUDA operations were still running");
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    jobs_cv_.notify_all();
    thread_.join();
    host_.reset();  // drains (or fails) what the host backend still runs
    fail_jobs(std::make_exception_ptr(
        Error(ErrorCode::Aborted, context("destroy", 0), "the group was destroyed")));
    for (auto& [device, streams] : streams_) {
      try {
        cuda_runtime().destroy_stream(streams.in);
        cuda_runtime().destroy_stream(streams.out);
      } catch (const std::exception& e) {
        WEFT_LOG_WARN("cuda staging: destroying streams failed: {}", e.what());
      }
    }
  }

  std::string_view name() const override { return host_->name(); }
  bool supports_recv_any() const override { return host_->supports_recv_any(); }
  std::shared_ptr<void> split(int color, int key, const ErrorContext& context) override {
    return host_->split(color, key, context);
  }

  std::shared_ptr<Work> post(Collective c, ErrorContext context) override {
    std::vector<Collective> one;
    one.push_back(std::move(c));
    return stage_and_post(std::move(one), std::move(context), false);
  }

  // A coalesced unit goes to the host backend as one unit (its sends and receives are posted
  // together there: both ranks may receive first), staged as one.
  std::shared_ptr<Work> post_coalesced(std::vector<Collective> collectives,
                                       ErrorContext context) override {
    if (collectives.empty()) return Work::completed(std::move(context));
    return stage_and_post(std::move(collectives), std::move(context), true);
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_) return;
      aborted_ = true;
      abort_reason_ = reason;
    }
    jobs_cv_.notify_all();
    host_->abort(reason);
  }

 private:
  std::shared_ptr<Work> stage_and_post(std::vector<Collective> cs, ErrorContext context,
                                       bool coalesced) {
    auto outer = std::make_shared<Work>(context, timeout_);
    outer->expect_device_completion();
    if (!coalesced) {
      outer->set_trace(cs[0].trace);
      if (cs[0].source) outer->set_source(cs[0].source);
    }
    try {
      const int device = call_device(cs[0]);
      const CudaStream caller = cs[0].stream;
      Streams& streams = streams_for(device);
      CudaRuntime& cuda = cuda_runtime();
      auto staged = std::make_shared<StagedCall>();
      for (Collective& c : cs) stage(std::move(c), *pool_, *staged, coalesced);
      // The copies in run after what the caller's stream queued before this call.
      auto ready = std::make_shared<OwnedEvent>(device);
      if (!staged->copy_in.empty()) {
        auto issued = std::make_shared<OwnedEvent>(device);
        cuda.record_event(issued->get(), caller);
        cuda.stream_wait_event(streams.in, issued->get());
        for (const StagedCall::Copy& copy : staged->copy_in) {
          cuda.copy_async(copy.pinned, copy.device, copy.bytes, streams.in);
        }
      }
      cuda.record_event(ready->get(), streams.in);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++in_flight_;
      }
      enqueue(Job{ready, Clock::now() + timeout_, outer,
                  [this, outer, staged, context, device, coalesced] {
                    run_on_host(outer, staged, context, device, coalesced);
                  }});
    } catch (...) {
      outer->fail_if_pending(std::current_exception());
    }
    return outer;
  }

  struct Streams {
    CudaStream in = nullptr;   // copies to pinned memory (they wait for callers' streams)
    CudaStream out = nullptr;  // copies back to the device (they wait for nothing)
  };
  // A step that waits for the device: `then` runs on the staging thread once `event` has passed.
  struct Job {
    std::shared_ptr<OwnedEvent> event;
    Clock::time_point deadline;
    std::shared_ptr<Work> work;
    std::function<void()> then;
  };

  ErrorContext context(std::string op, uint64_t seq) const {
    ErrorContext where;
    where.rank = rank_;
    where.size = size_;
    where.group = group_;
    where.op = std::move(op);
    where.seq = seq;
    return where;
  }

  Streams& streams_for(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(device);
    if (it != streams_.end()) return it->second;
    Streams made;
    made.in = cuda_runtime().create_stream(device);
    made.out = cuda_runtime().create_stream(device);
    return streams_.emplace(device, made).first->second;
  }

  void enqueue(Job job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopping_) {
        jobs_.push_back(std::move(job));
        jobs_cv_.notify_all();
        return;
      }
    }
    finished(job.work, std::make_exception_ptr(Error(ErrorCode::Aborted, job.work->context(),
                                                     "the group was destroyed")));
  }

  // The outer Work has ended (success or error): one fewer in flight.
  void finished(const std::shared_ptr<Work>& work, std::exception_ptr error) {
    if (error) {
      work->fail_if_pending(std::move(error));
    } else {
      work->complete_if_pending();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    --in_flight_;
    done_cv_.notify_all();
  }

  // Staging thread: runs each job once its event has passed, in order. The device cannot wake a
  // host thread, so the event is polled, sleeping 20 us doubling to 1 ms in between (on the
  // condition variable, so that an abort or shutdown ends the wait at once).
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    auto slice = std::chrono::microseconds(20);
    while (true) {
      if (jobs_.empty()) {
        if (stopping_) return;
        jobs_cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        continue;
      }
      Job& job = jobs_.front();
      std::exception_ptr error;
      bool ready = false;
      if (aborted_) {
        error = std::make_exception_ptr(Error(ErrorCode::Aborted, job.work->context(),
                                              "the group was aborted: " + abort_reason_));
      } else {
        lock.unlock();
        try {
          ready = cuda_runtime().event_done(job.event->get());
        } catch (...) {
          error = std::current_exception();
        }
        lock.lock();
        if (!ready && !error && Clock::now() >= job.deadline) {
          error = std::make_exception_ptr(Error(
              ErrorCode::Timeout, job.work->context(),
              fmt::format("the CUDA copies of this operation did not finish within {} ms (the "
                          "caller's stream never reached the operation, or the device is stuck)",
                          timeout_.count())));
        }
      }
      if (!ready && !error) {
        jobs_cv_.wait_for(lock, slice, [this] { return aborted_ || stopping_; });
        slice = std::min(slice * 2, std::chrono::microseconds(1000));
        if (stopping_ && !aborted_) {
          // Shutting down with work left (the drain timed out): fail it below.
          error = std::make_exception_ptr(
              Error(ErrorCode::Aborted, job.work->context(), "the group was destroyed"));
        } else {
          continue;
        }
      }
      slice = std::chrono::microseconds(20);
      Job taken = std::move(job);
      jobs_.pop_front();
      lock.unlock();
      if (error) {
        finished(taken.work, error);
      } else {
        try {
          taken.then();
        } catch (...) {
          finished(taken.work, std::current_exception());
        }
      }
      lock.lock();
    }
  }

  void fail_jobs(std::exception_ptr error) {
    std::deque<Job> left;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      left.swap(jobs_);
    }
    for (Job& job : left) finished(job.work, error);
  }

  // Staging thread: the inputs are in pinned memory; run the host collective.
  void run_on_host(const std::shared_ptr<Work>& outer, const std::shared_ptr<StagedCall>& staged,
                   const ErrorContext& context, int device, bool coalesced) {
    std::shared_ptr<Work> inner = coalesced ? host_->post_coalesced(staged->host, context)
                                            : host_->post(staged->host[0], context);
    outer->mark_started();
    inner->on_complete([this, outer, staged, device](const Work& done) {
      if (std::exception_ptr error = done.exception()) {
        finished(outer, error);
        return;
      }
      try {
        CudaRuntime& cuda = cuda_runtime();
        Streams& streams = streams_for(device);
        for (const StagedCall::Copy& copy : staged->copy_out) {
          cuda.copy_async(copy.device, copy.pinned, copy.bytes, streams.out);
        }
        auto end = std::make_shared<OwnedEvent>(device);
        cuda.record_event(end->get(), streams.out);
        outer->set_device_completion(std::make_shared<EventCompletion>(end));
        // The pinned buffers go back to the pool once the copies out have run.
        enqueue(Job{end, Clock::now() + timeout_, outer,
                    [this, outer, staged] { finished(outer, nullptr); }});
      } catch (...) {
        finished(outer, std::current_exception());
      }
    });
  }

  std::unique_ptr<Backend> host_;
  const int rank_;
  const int size_;
  const std::string group_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<PinnedPool> pool_;

  std::mutex mutex_;
  std::condition_variable jobs_cv_;  // jobs_ grew, or abort/stop
  std::condition_variable done_cv_;  // in_flight_ fell
  std::deque<Job> jobs_;             // guarded by mutex_
  std::map<int, Streams> streams_;   // guarded by mutex_ (entries never move once made)
  size_t in_flight_ = 0;             // guarded by mutex_
  bool aborted_ = false;             // guarded by mutex_
  bool stopping_ = false;            // guarded by mutex_
  std::string abort_reason_;         // guarded by mutex_
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_staging_backend(std::unique_ptr<Backend> host,
                                                   const BackendOptions& options) {
  // Fail at creation, not at the first copy, when there is no device: the message names CUDA's
  // reason ("no usable CUDA device: ... insufficient driver").
  cuda_runtime().device_count();
  return std::make_unique<CudaStagingBackend>(std::move(host), options);
}

}  // namespace weft
