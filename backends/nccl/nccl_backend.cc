#include "backends/nccl/nccl_backend.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "backends/nccl/cuda_util.h"
#include "backends/nccl/event_pool.h"
#include "backends/nccl/nccl_launch.h"
#include "backends/nccl/nccl_types.h"
#include "backends/nccl/unique_id_exchange.h"
#include "runtime/flight_recorder.h"

namespace weft::nccl {
namespace {

using Clock = std::chrono::steady_clock;

ErrorContext base_context(const BackendOptions& options) {
  ErrorContext context;
  context.rank = options.rank;
  context.size = options.size;
  context.group = options.group_name;
  return context;
}

bool reduces(CollectiveKind kind) {
  return kind == CollectiveKind::AllReduce || kind == CollectiveKind::Reduce ||
         kind == CollectiveKind::ReduceScatter;
}

// Everything about a part that NCCL could refuse, checked before any part of a unit is issued:
// a unit refused half-way would leave its first parts running on this rank only.
void validate(const Collective& c, const ErrorContext& context) {
  for (const std::vector<Tensor>* list : {&c.inputs, &c.outputs}) {
    for (const Tensor& t : *list) {
      if (t.device.kind != DeviceKind::Cuda) {
        throw Error(ErrorCode::InvalidArgument, context,
                    fmt::format("backend \"nccl\" serves CUDA tensors only, not {}", describe(t)));
      }
      require_nccl_dtype(t.dtype, context);
    }
  }
  if (reduces(c.kind) && !c.inputs.empty()) to_nccl_reduction(c.op, c.inputs[0].dtype, context);
  if (c.kind == CollectiveKind::Recv && c.peer == kAnySource) {
    throw Error(ErrorCode::Unsupported, context,
                "backend \"nccl\" cannot receive from any source (NCCL names the peer of every "
                "receive)");
  }
}

// Failures of the operation's own arguments leave the group usable; anything else (a
// communicator that did not come up, an NCCL or CUDA error) breaks it.
bool breaks_group(ErrorCode code) {
  return code != ErrorCode::InvalidArgument && code != ErrorCode::Unsupported &&
         code != ErrorCode::Aborted;
}

}  // namespace

SplitCommunicators::~SplitCommunicators() {
  for (auto& [device, comm] : comms) {
    if (comm != nullptr) ncclCommAbort(comm);
  }
}

NcclBackend::NcclBackend(const BackendOptions& options)
    : options_(options),
      settings_(parse_nccl_settings([](const char* name) { return std::getenv(name); },
                                    options.settings)),
      watchdog_(options.store, base_context(options), settings_.poll) {
  if (options.from_parent == nullptr) return;
  auto* split = static_cast<SplitCommunicators*>(options.from_parent.get());
  WEFT_CHECK(split->magic == SplitCommunicators::kMagic,
             "from_parent is not what the nccl backend's split() returns");
  const ErrorContext context = base_context(options);
  for (auto& [device, comm] : split->comms) {
    if (comm == nullptr) continue;
    std::shared_ptr<NcclComm> adopted = NcclComm::adopt(comm, device, context);
    comm = nullptr;
    comms_[device] = adopted;
    watchdog_.add_comm(adopted);
    last_device_ = device;
  }
}

NcclBackend::~NcclBackend() {
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  if (!watchdog_.drain(deadline)) {
    watchdog_.abort(
        fmt::format("the group's nccl backend was destroyed with operations still "
                    "running after the group's timeout ({} ms)",
                    options_.timeout.count()));
  }
  std::map<int, std::shared_ptr<NcclComm>> comms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms.swap(comms_);
  }
  // Nothing is pending: finalize and destroy, bounded (aborted past the deadline).
  const Clock::time_point destroy_deadline = Clock::now() + options_.timeout;
  for (auto& [device, comm] : comms) comm->destroy(destroy_deadline);
}

std::shared_ptr<Work> NcclBackend::post(Collective collective, ErrorContext context) {
  std::vector<Collective> parts;
  parts.push_back(std::move(collective));
  return run(std::move(parts), std::move(context));
}

std::shared_ptr<Work> NcclBackend::post_coalesced(std::vector<Collective> collectives,
                                                  ErrorContext context) {
  return run(std::move(collectives), std::move(context));
}

int NcclBackend::device_of(const std::vector<Collective>& parts, const ErrorContext& context) {
  int device = -1;
  for (const Collective& c : parts) {
    for (const std::vector<Tensor>* list : {&c.inputs, &c.outputs}) {
      for (const Tensor& t : *list) {
        if (device < 0) {
          device = t.device.index;
        } else if (t.device.index != device) {
          throw Error(ErrorCode::InvalidArgument, context,
                      fmt::format("backend \"nccl\" runs a coalesced unit on one device, but its "
                                  "tensors are on cuda:{} and cuda:{}",
                                  device, t.device.index));
        }
      }
    }
  }
  if (device >= 0) return device;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (last_device_ >= 0) return last_device_;
  }
  return current_device(context);
}

std::shared_ptr<NcclComm> NcclBackend::comm_for(int device, const ErrorContext& context) {
  int index;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = comms_.find(device);
    if (it != comms_.end()) {
      last_device_ = device;
      return it->second;
    }
    index = next_unique_id_++;
  }
  const Clock::time_point start = Clock::now();
  std::vector<uint8_t> id = exchange_unique_id(
      *options_.store, options_.rank, index, options_.timeout, sizeof(ncclUniqueId),
      [&] {
        ncclUniqueId unique;
        const ncclResult_t result = ncclGetUniqueId(&unique);
        if (result != ncclSuccess) {
          throw Error(error_code_for(result), context,
                      fmt::format("ncclGetUniqueId: {}", describe_nccl_result(result, nullptr)));
        }
        const auto* bytes = reinterpret_cast<const uint8_t*>(&unique);
        return std::vector<uint8_t>(bytes, bytes + sizeof(unique));
      },
      context);
  // One timeout for the whole set-up: the id, then the communicator.
  const auto left =
      std::max(std::chrono::milliseconds(1),
               options_.timeout -
                   std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start));
  std::shared_ptr<NcclComm> comm = NcclComm::create(
      device, options_.rank, options_.size, id, left,
      [this] {
        // This backend's abort(), or the group's, which cannot reach abort()
        // while the group's post() (this call) holds its lock.
        return aborted_.load(std::memory_order_acquire) ||
               (options_.abort_requested && options_.abort_requested());
      },
      context);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_[device] = comm;
    last_device_ = device;
  }
  watchdog_.add_comm(comm);
  return comm;
}

std::shared_ptr<Work> NcclBackend::run(std::vector<Collective> parts, ErrorContext context) {
  const TraceRef trace = unit_trace(parts);
  auto refused = [&](std::exception_ptr error) {
    auto work = std::make_shared<Work>(context, options_.timeout);
    work->set_trace(trace);
    work->fail(std::move(error));
    return work;
  };
  if (std::exception_ptr refusal = watchdog_.refusal(context)) return refused(refusal);
  if (parts.empty()) {
    auto work = std::make_shared<Work>(context, options_.timeout);
    work->set_trace(trace);
    work->complete();
    return work;
  }
  auto part_context = [&](const Collective& c) {
    if (parts.size() == 1) return context;
    ErrorContext one = context;
    one.op = std::string(collective_name(c.kind));
    one.seq = c.seq;
    return one;
  };
  try {
    for (const Collective& c : parts) validate(c, part_context(c));
    const int device = device_of(parts, context);
    DeviceGuard device_guard(device, context);
    std::shared_ptr<NcclComm> comm = comm_for(device, context);
    // The collective's own timeout runs from here: creating the communicator (the first call on
    // a device) had one of its own.
    const Clock::time_point deadline = Clock::now() + options_.timeout;

    NcclComm::Use use(*comm);
    ncclComm_t handle = use.comm();
    if (handle == nullptr) {
      if (std::exception_ptr refusal = watchdog_.refusal(context)) return refused(refusal);
      throw Error(ErrorCode::Aborted, context,
                  fmt::format("the NCCL communicator on cuda:{} was aborted", device));
    }
    EventPool& events = *comm->events();
    // The internal stream waits for each caller stream's queued work (one event each).
    std::vector<CudaStream> waited;
    for (const Collective& c : parts) {
      if (std::find(waited.begin(), waited.end(), c.stream) != waited.end()) continue;
      waited.push_back(c.stream);
      cudaEvent_t start = events.acquire(context);
      // Back to the pool at once: cudaStreamWaitEvent captured the record, a later record of
      // the same event does not change what the stream waits for.
      struct Release {
        EventPool& pool;
        cudaEvent_t event;
        ~Release() { pool.release(event); }
      } release{events, start};
      check_cuda(cudaEventRecord(start, c.stream), "cudaEventRecord on the caller's stream",
                 context);
      check_cuda(cudaStreamWaitEvent(comm->stream(), start, 0),
                 "cudaStreamWaitEvent (the nccl stream waiting for the caller's)", context);
    }
    auto work = std::make_shared<Work>(context, options_.timeout);
    if (!settings_.blocking_wait) work->expect_device_completion();
    work->set_trace(trace);
    {
      Launcher launcher(*comm, handle, options_.rank, options_.size, deadline);
      if (parts.size() == 1) {
        launcher.launch(parts[0], context);
      } else {
        launcher.group_start(context);
        for (const Collective& c : parts) launcher.launch(c, part_context(c));
        launcher.group_end(context);
      }
    }
    auto end = std::make_shared<EndEvent>(comm->events(), events.acquire(context), context);
    end->record(comm->stream());
    work->mark_started();
    work->set_device_completion(end);
    watchdog_.track(work, end, device, deadline);
    return work;
  } catch (const Error& error) {
    if (breaks_group(error.code())) watchdog_.fail_group(error, context);
    return refused(std::current_exception());
  } catch (const std::exception& e) {
    Error error(ErrorCode::Internal, context, e.what());
    watchdog_.fail_group(error, context);
    return refused(std::make_exception_ptr(error));
  }
}

std::shared_ptr<void> NcclBackend::split(int color, int key, const ErrorContext& context) {
  if (std::exception_ptr refusal = watchdog_.refusal(context)) std::rethrow_exception(refusal);
  std::map<int, std::shared_ptr<NcclComm>> comms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms = comms_;
  }
  if (comms.empty()) return nullptr;
  auto result = std::make_shared<SplitCommunicators>();
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  for (auto& [device, comm] : comms) {
    ncclComm_t child =
        comm->split(color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, deadline, context);
    if (child != nullptr) result->comms[device] = child;
  }
  if (result->comms.empty()) return nullptr;
  return result;
}

void NcclBackend::abort(const std::string& reason) {
  aborted_.store(true, std::memory_order_release);
  watchdog_.abort(reason);
}

}  // namespace weft::nccl
