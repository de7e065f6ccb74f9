// ProcessGroup (weft/process_group.h): the submit path every collective takes (numbering, the
// backend, coalescing), teardown and the group's accessors, over the Backend interface. The group
// never names a backend: it asks the registry for the factory of whatever the backend map says.
// Each collective's argument checks and staging are in process_group_calls.cc; making groups in
// group_creation.cc; the state they share in process_group_state.h.
#include "weft/process_group.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "weft/prefix_store.h"

#include "runtime/cuda_staging.h"
#include "runtime/desync_check.h"
#include "runtime/log.h"
#include "runtime/process_group_state.h"
#include "runtime/staging.h"

namespace weft {

namespace {

std::atomic<uint64_t> forks_seen{0};
[[maybe_unused]] const int atfork_registered =
    pthread_atfork(nullptr, nullptr, [] { forks_seen.fetch_add(1, std::memory_order_relaxed); });

std::string describe_call(const Collective& c, DType dtype, size_t count) {
  std::string text = fmt::format("{} x {}", dtype_name(dtype), count);
  switch (c.kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::ReduceScatter:
      text += ", " + describe(c.op);
      break;
    case CollectiveKind::Reduce:
      text += fmt::format(", {}, root {}", describe(c.op), c.root);
      break;
    case CollectiveKind::Broadcast:
    case CollectiveKind::Gather:
    case CollectiveKind::Scatter:
      text += fmt::format(", root {}", c.root);
      break;
    case CollectiveKind::Send:
      text += fmt::format(", to {} tag {}", c.peer, c.tag);
      break;
    case CollectiveKind::Recv:
      if (c.peer == kAnySource) {
        text += fmt::format(", from any rank tag {}", c.tag);
      } else {
        text += fmt::format(", from {} tag {}", c.peer, c.tag);
      }
      break;
    default:
      break;
  }
  return text;
}

DType call_dtype(const Collective& c) {
  if (!c.inputs.empty()) return c.inputs[0].dtype;
  if (!c.outputs.empty()) return c.outputs[0].dtype;
  return DType::Float32;
}

Device call_device(const Collective& c) {
  if (!c.inputs.empty()) return c.inputs[0].device;
  if (!c.outputs.empty()) return c.outputs[0].device;
  return Device::cpu();
}

size_t call_elements(const Collective& c) {
  size_t n = 0;
  for (const Tensor& t : c.inputs) n = std::max(n, t.count);
  for (const Tensor& t : c.outputs) n = std::max(n, t.count);
  return n;
}

}  // namespace

uint64_t fork_count() { return forks_seen.load(std::memory_order_relaxed); }

std::vector<std::string> dump_trace(const std::string& reason) { return trace::dump_all(reason); }

namespace {

// The registry entry of the backend serving `kind`, mapped to `mapped` in the group's backend map.
// CUDA tensors go to nccl by default when its module loads (c10d's default), and to the host
// backend, staging through pinned memory, when it does not.
Registry::Entry registry_entry(const ProcessGroup::State& s, DeviceKind kind,
                               const std::string& mapped) {
  if (kind == DeviceKind::Cuda && s.backend_text.empty()) {
    try {
      return Registry::global().resolve("nccl");
    } catch (const Error& e) {
      WEFT_LOG_DEBUG(
          "rank {}/{} group \"{}\": no nccl backend for cuda tensors ({}); using "
          "\"{}\" through pinned host buffers",
          s.rank, s.size, s.name, e.what(), mapped);
    }
  }
  return Registry::global().find(mapped);
}

}  // namespace

Backend& ProcessGroup::State::backend_for(DeviceKind kind, const ErrorContext& where) {
  auto it = backends.find(kind);
  if (it != backends.end()) return *it->second;
  auto mapped = std::find_if(backend_map.begin(), backend_map.end(),
                             [&](const auto& entry) { return entry.first == kind; });
  if (mapped == backend_map.end()) {
    throw Error(ErrorCode::Unsupported, where,
                fmt::format("no backend serves {} tensors in this group (backend map \"{}\"; "
                            "registered backends: {})",
                            device_kind_name(kind), backend_text,
                            fmt::join(Registry::global().names(), ", ")));
  }
  Registry::Entry entry = registry_entry(*this, kind, mapped->second);
  const bool staged = kind == DeviceKind::Cuda &&
                      std::find(entry.devices.begin(), entry.devices.end(), DeviceKind::Cuda) ==
                          entry.devices.end();
  BackendOptions options;
  options.store = std::make_shared<PrefixStore>(std::string(device_kind_name(kind)) + "/", store);
  options.rank = rank;
  options.size = size;
  options.group_name = name;
  options.timeout = timeout;
  options.global_ranks = global_ranks;
  options.settings = backend_settings;
  options.device = kind;
  options.abort_requested = [signal = abort_signal] { return signal->raised(); };
  if (auto inherited = from_parent.find(kind); inherited != from_parent.end()) {
    options.from_parent = std::move(inherited->second);
    from_parent.erase(inherited);
  }
  std::unique_ptr<Backend> backend = entry.factory(options);
  if (staged) {
    try {
      backend = make_cuda_staging_backend(std::move(backend), options);
    } catch (const Error& e) {
      throw Error(
          e.code(), where,
          fmt::format("backend \"{}\" cannot serve cuda tensors: {}", entry.name, e.what()));
    }
  }
  Backend& made = *backend;
  backends.emplace(kind, std::move(backend));
  return made;
}

std::map<DeviceKind, std::shared_ptr<void>> ProcessGroup::State::split_backends(
    int color, int key, const ErrorContext& where) {
  std::vector<std::pair<DeviceKind, Backend*>> made;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [kind, backend] : backends) made.emplace_back(kind, backend.get());
  }
  // Outside the mutex: a backend's split may be collective over the group (ncclCommSplit) and
  // take a while; the backends live until destroy(), which the caller may not run concurrently.
  std::map<DeviceKind, std::shared_ptr<void>> given;
  for (auto& [kind, backend] : made) {
    if (std::shared_ptr<void> result = backend->split(color, key, where)) given[kind] = result;
  }
  return given;
}

std::shared_ptr<Work> chain(const std::shared_ptr<Work>& inner, const ErrorContext& context,
                            std::chrono::milliseconds timeout, Epilogue epilogue) {
  auto outer = std::make_shared<Work>(context, timeout);
  // Waiting for the outer Work may run the inner one on the waiting thread, as for any other.
  if (inner->wait_helper()) {
    outer->set_wait_helper([inner, helper = inner->wait_helper()] { helper(); });
  }
  inner->on_complete([outer, epilogue = std::move(epilogue)](const Work& done) {
    if (std::exception_ptr error = done.exception()) {
      outer->fail(error);
      return;
    }
    try {
      if (epilogue) epilogue();
    } catch (...) {
      outer->fail(std::current_exception());
      return;
    }
    outer->complete();
  });
  return outer;
}

// ---- The submit path, shared by every collective.

std::shared_ptr<Work> submit(ProcessGroup::State& s, Collective c, Epilogue epilogue) {
  const DType dtype = call_dtype(c);
  const Device device = call_device(c);
  const bool p2p = c.kind == CollectiveKind::Send || c.kind == CollectiveKind::Recv;
  if (std::optional<BufferPool::Lease> staged = stage_overlapping_input(*s.staging, c, s.rank)) {
    epilogue = [lease = *staged, then = std::move(epilogue)] {
      if (then) then();
    };
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::string_view op = collective_name(c.kind);
  s.check_usable(op);
  if (s.coalescing && s.coalesced.device && *s.coalesced.device != device.kind) {
    throw Error(ErrorCode::InvalidArgument, s.context(op, s.seq + 1),
                "a coalesced group must use one device kind");
  }
  // The backend is looked up (and made, on first use) before numbering: "no backend serves
  // cuda tensors" is a refusal like any other.
  Backend* backend = nullptr;
  if (!s.coalescing && !s.aborted) backend = &s.backend_for(device.kind, s.context(op, s.seq + 1));
  std::shared_ptr<const int> source = c.source;  // a receive from any source reports its sender
  if (c.kind == CollectiveKind::Recv && c.peer == kAnySource) {
    if (s.coalescing) {
      throw Error(ErrorCode::InvalidArgument, s.context(op, 0),
                  "a receive from any source cannot be part of a coalesced unit (which rank's "
                  "message it takes would depend on the order the unit posts its operations)");
    }
    if (backend != nullptr && !backend->supports_recv_any()) {
      throw Error(ErrorCode::Unsupported, s.context(op, 0),
                  fmt::format("backend \"{}\" cannot receive from any source here (recv from a "
                              "given rank works)",
                              backend->name()));
    }
  }
  if (device.kind == DeviceKind::Cuda) c.stream = current_cuda_stream();
  if (!p2p) c.seq = ++s.seq;
  ErrorContext context = s.context(op, c.seq, describe_call(c, dtype, call_elements(c)));
  if (s.recorder) {
    c.trace = TraceRef{s.recorder, s.recorder->queued(c, dtype, call_fingerprint(c, dtype)), 1,
                       p2p ? 0 : c.seq};
  }
  if (s.aborted) {
    auto work = std::make_shared<Work>(context, s.timeout);
    work->set_trace(std::move(c.trace));
    work->fail(std::make_exception_ptr(
        Error(ErrorCode::Aborted, context, "the group was aborted: " + s.abort_reason)));
    return work;
  }
  if (s.coalescing) {
    s.coalesced.device = device.kind;
    auto work = std::make_shared<Work>(context, s.timeout);
    work->set_trace(c.trace);
    s.coalesced.calls.push_back(std::move(c));
    s.coalesced.works.push_back(work);
    s.coalesced.epilogues.push_back(std::move(epilogue));
    return work;
  }
  if (s.debug_detail && !p2p) check_fingerprints(s, c, dtype, context);
  TraceRef trace = c.trace;
  std::shared_ptr<Work> work = backend->post(std::move(c), context);
  if (trace.recorder && !work->has_trace()) {
    // A backend that does not report to the recorder: at least its outcome is recorded.
    work->on_complete(
        [trace](const Work& done) { trace.recorder->finished(trace, done.exception()); });
  }
  if (epilogue) work = chain(work, context, s.timeout, std::move(epilogue));
  if (source) work->set_source(std::move(source));
  return work;
}

ProcessGroup::ProcessGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}

ProcessGroup::~ProcessGroup() {
  try {
    destroy();
  } catch (const std::exception& e) {
    WEFT_LOG_WARN("rank {}/{} group \"{}\": destroy: {}", state_->rank, state_->size, state_->name,
                  e.what());
  }
}

int ProcessGroup::rank() const { return state_->rank; }
int ProcessGroup::size() const { return state_->size; }
const std::string& ProcessGroup::name() const { return state_->name; }
std::chrono::milliseconds ProcessGroup::timeout() const { return state_->timeout; }
const std::vector<int>& ProcessGroup::global_ranks() const { return state_->global_ranks; }

uint64_t ProcessGroup::sequence_number() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->seq;
}

std::string ProcessGroup::backend_name(DeviceKind kind) const {
  for (const auto& [k, name] : state_->backend_map) {
    if (k == kind) return registry_entry(*state_, kind, name).name;
  }
  throw Error(ErrorCode::InvalidArgument, state_->context("backend_name", 0),
              fmt::format("no backend is mapped for {}", device_kind_name(kind)));
}

// ---- Coalescing.

void ProcessGroup::start_coalescing() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->check_usable("start_coalescing");
  if (state_->coalescing) {
    throw Error(ErrorCode::InvalidArgument, state_->context("start_coalescing", state_->seq),
                "already coalescing: call end_coalescing() first");
  }
  state_->coalescing = true;
}

std::shared_ptr<Work> ProcessGroup::end_coalescing() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.check_usable("end_coalescing");
  if (!s.coalescing) {
    throw Error(ErrorCode::InvalidArgument, s.context("end_coalescing", s.seq),
                "start_coalescing() was not called");
  }
  s.coalescing = false;
  CoalescedCalls recorded = std::exchange(s.coalesced, {});
  std::vector<Collective>& calls = recorded.calls;
  const std::vector<std::shared_ptr<Work>>& works = recorded.works;
  const std::vector<Epilogue>& epilogues = recorded.epilogues;
  const DeviceKind kind = recorded.device.value_or(DeviceKind::Cpu);
  ErrorContext context = s.context("coalesced", calls.empty() ? s.seq : calls.front().seq,
                                   fmt::format("{} operations", calls.size()));
  if (calls.empty()) return Work::completed(context);
  if (s.aborted) {
    auto error = std::make_exception_ptr(
        Error(ErrorCode::Aborted, context, "the group was aborted: " + s.abort_reason));
    for (auto& work : works) work->fail(error);
    return Work::failed(context, error);
  }
  Backend& backend = s.backend_for(kind, context);
  if (s.debug_detail) {
    for (const Collective& c : calls) {
      if (c.kind != CollectiveKind::Send && c.kind != CollectiveKind::Recv) {
        check_fingerprints(s, c, call_dtype(c), s.context(collective_name(c.kind), c.seq));
      }
    }
  }
  std::shared_ptr<Work> group = backend.post_coalesced(std::move(calls), context);
  return chain(group, context, s.timeout, [works, epilogues] {
    for (size_t i = 0; i < works.size(); ++i) {
      try {
        if (epilogues[i]) epilogues[i]();
      } catch (...) {
        works[i]->fail(std::current_exception());
        continue;
      }
      works[i]->complete();
    }
  });
}

// ---- Symmetric memory.

std::shared_ptr<SymmetricBuffer> ProcessGroup::allocate_symmetric(size_t bytes) {
  State& s = *state_;
  Backend* backend = nullptr;
  ErrorContext context;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.check_usable("allocate_symmetric");
    context = s.context("allocate_symmetric", 0, fmt::format("{} bytes per rank", bytes));
    if (s.aborted) {
      throw Error(ErrorCode::Aborted, context, "the group was aborted: " + s.abort_reason);
    }
    backend = &s.backend_for(DeviceKind::Cpu, context);
  }
  // Outside the lock: the allocation waits for every rank (up to the timeout), and abort() must
  // be able to take the lock meanwhile. The backend lives until destroy().
  return backend->allocate_symmetric(bytes, context);
}

// ---- Teardown.

void ProcessGroup::abort(const std::string& reason) {
  State& s = *state_;
  std::vector<Backend*> backends;
  // Raised before taking the group's lock, which a post() may hold while a backend sets up (the
  // nccl backend's first collective makes its communicator): such a backend polls the signal
  // (BackendOptions::abort_requested), and the store waits end on it.
  s.abort_signal->raise(reason);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.aborted) return;
    s.aborted = true;
    s.abort_reason = reason;
    // In a fork() child the backends' threads are gone: marking the group aborted is all there is.
    if (!s.in_forked_child()) {
      for (auto& [kind, backend] : s.backends) backends.push_back(backend.get());
    }
  }
  s.abort_signal->raise(reason);
  if (s.world->trace) s.world->trace->dump(fmt::format("group \"{}\" aborted: {}", s.name, reason));
  fail_self_messages(s, std::make_exception_ptr(
                            Error(ErrorCode::Aborted, s.context("send/recv to self", 0), reason)));
  WEFT_LOG_INFO("rank {}/{} group \"{}\": aborted: {}", s.rank, s.size, s.name, reason);
  // Backends live until destroy(), which takes the mutex after us: the pointers stay valid.
  for (Backend* backend : backends) backend->abort(reason);
}

bool ProcessGroup::is_aborted() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->aborted;
}

void ProcessGroup::destroy() {
  State& s = *state_;
  std::map<DeviceKind, std::unique_ptr<Backend>> backends;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.destroyed) return;
    s.destroyed = true;
    if (s.in_forked_child()) {
      // Tearing down would join threads (the backends', the store server's) that exist only in
      // the parent: leave this copy of the parent's group as it is, and say why.
      for (auto& [kind, backend] : s.backends) static_cast<void>(backend.release());
      static_cast<void>(new std::shared_ptr<World>(std::move(s.world)));
      s.fail_forked("destroy");
    }
    backends = std::move(s.backends);
    s.backends.clear();
  }
  forget_default_group(this);
  fail_self_messages(s, std::make_exception_ptr(
                            Error(ErrorCode::Aborted, s.context("send/recv to self", 0),
                                  "the group was destroyed before the other half was posted")));
  // Each backend drains what was issued (up to the timeout), then aborts the rest and joins.
  backends.clear();
}

}  // namespace weft
