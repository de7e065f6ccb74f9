// runtime/plugin_core.cc: one context of a backend plugin, driven from weft's threads; see
// plugin_core.h.
#include "runtime/plugin_core.h"

#include <algorithm>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "runtime/log.h"

namespace weft::plugin_detail {

static_assert(sizeof(void*) >= sizeof(uint64_t), "done() tokens are 64-bit");

namespace {

// The C view of one Collective; the vectors own what the pointers point into.
struct Descriptor {
  std::vector<weftTensor_v1_t> inputs, outputs;
  std::vector<uint64_t> counts, send_counts, recv_counts;
};

weftTensor_v1_t tensor_of(const Tensor& t) {
  return weftTensor_v1_t{
      t.data,         t.count, static_cast<int32_t>(t.dtype), static_cast<int32_t>(t.device.kind),
      t.device.index, 0};
}

weftCollective_v1_t describe(const Collective& c, Descriptor& d) {
  for (const Tensor& t : c.inputs) d.inputs.push_back(tensor_of(t));
  for (const Tensor& t : c.outputs) d.outputs.push_back(tensor_of(t));
  d.counts.assign(c.counts.begin(), c.counts.end());
  d.send_counts.assign(c.send_counts.begin(), c.send_counts.end());
  d.recv_counts.assign(c.recv_counts.begin(), c.recv_counts.end());
  weftCollective_v1_t out{};
  out.kind = static_cast<int32_t>(c.kind);
  out.op = static_cast<int32_t>(c.op.kind);
  out.op_factor = c.op.kind == ReduceOp::PremulSum ? c.op.factor : 1.0;
  out.seq = c.seq;
  out.root = c.root;
  out.peer = c.peer;
  out.tag = c.tag;
  out.inputs = d.inputs.empty() ? nullptr : d.inputs.data();
  out.num_inputs = static_cast<uint32_t>(d.inputs.size());
  out.outputs = d.outputs.empty() ? nullptr : d.outputs.data();
  out.num_outputs = static_cast<uint32_t>(d.outputs.size());
  out.counts = d.counts.empty() ? nullptr : d.counts.data();
  out.send_counts = d.send_counts.empty() ? nullptr : d.send_counts.data();
  out.recv_counts = d.recv_counts.empty() ? nullptr : d.recv_counts.data();
  return out;
}

}  // namespace

PluginCore::PluginCore(const PluginTable* p, const BackendOptions& options)
    : table(p),
      plugin(&p->v2),
      name(p->v2.name),
      group{.rank = options.rank, .size = options.size, .group = options.group_name},
      timeout(options.timeout),
      polling(p->v2.test != nullptr) {
  store.store = options.store;
  store.group_timeout = options.timeout;
  store.table = weftStore_v2_t{&store,
                               &StoreBridge::set,
                               &StoreBridge::get,
                               &StoreBridge::free_value,
                               &StoreBridge::add,
                               &StoreBridge::wait,
                               &StoreBridge::check,
                               &StoreBridge::multi_get,
                               &StoreBridge::compare_set,
                               &StoreBridge::delete_key};
  store.table_v1 = weftStore_v1_t{&store,
                                  &StoreBridge::set,
                                  &StoreBridge::get,
                                  &StoreBridge::free_value,
                                  &StoreBridge::add,
                                  &StoreBridge::wait,
                                  &StoreBridge::check,
                                  &StoreBridge::multi_get,
                                  &StoreBridge::compare_set};
  log.prefix = fmt::format("rank {}/{} group \"{}\" plugin {}", options.rank, options.size,
                           options.group_name, name);
}

// ---- The plugin thread.

void PluginCore::run(std::unique_ptr<InitStorage> init) {
  char error[kMessageSize] = {};
  void* made = nullptr;
  const weft_result_t result = table->init_v1 != nullptr
                                   ? table->init_v1(&init->args_v1, &made, error, sizeof error)
                                   : plugin->init(&init->args, &made, error, sizeof error);
  init.reset();
  std::unique_lock<std::mutex> lock(mutex);
  init_done = true;
  init_result = result;
  init_error = text_of(error, sizeof error);
  if (result == WEFT_SUCCESS) context = made;
  changed.notify_all();
  if (result != WEFT_SUCCESS) return;
  if (init_abandoned) {
    // The group gave up on init() and was never made: nothing else will use the context.
    lock.unlock();
    WEFT_LOG_WARN("{}: init() returned after weft gave up on it; finalizing the unused context",
                  log.prefix);
    plugin->finalize(made);
    return;
  }
  auto pause = std::chrono::microseconds(20);
  bool spun = false;  // spin() has run since the last unit
  while (true) {
    if (stop || !hung.empty()) return;
    if (!queued.empty()) {
      post_next(lock);
      spun = false;
      continue;
    }
    if (finalize) {
      enter(lock, "finalize()", 0);
      plugin->finalize(context);
      leave(lock);
      finalized = true;
      changed.notify_all();
      lock.unlock();
      PluginCores::get().remove(serial);  // nothing of the context is touched any more
      return;
    }
    if (!polled.empty()) {
      if (test_front(lock)) {
        pause = std::chrono::microseconds(20);
      } else {
        sleeping = true;
        wake.wait_for(lock, pause);
        sleeping = false;
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
      }
      continue;
    }
    if (!spun) {
      spin(lock);
      spun = true;
      continue;  // look at everything again before sleeping
    }
    sleeping = true;
    wake.wait(lock);
    sleeping = false;
    spun = false;
  }
}

// Watches for a unit for up to kSpin before the thread sleeps, so that a caller posting one
// unit after another pays no wake-up (yielding the CPU to any thread that wants it).
// REQUIRES: lock held; returns with it held.
void PluginCore::spin(std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  const auto until = Clock::now() + kSpin;
  while (queued_size.load(std::memory_order_acquire) == 0 && Clock::now() < until) {
    std::this_thread::yield();
  }
  lock.lock();
}

// Marks the plugin thread as inside `what` (for the watchdog) and unlocks; leave() undoes it.
void PluginCore::enter(std::unique_lock<std::mutex>& lock, const char* what, uint32_t id) {
  call = what;
  call_op = id;
  call_start = Clock::now();
  lock.unlock();
}
void PluginCore::leave(std::unique_lock<std::mutex>& lock) {
  lock.lock();
  call = nullptr;
  call_op = 0;
}

// Forgets a finished operation (remembering what it was, for messages). REQUIRES: mutex held.
void PluginCore::retire(std::unordered_map<uint32_t, Op>::iterator it) {
  const size_t slot = it->first % kRecent;
  recent_id[slot] = it->first;
  recent[slot] = Op{nullptr, it->second.kind, it->second.seq, it->second.count};
  ops.erase(it);
  --outstanding;
  changed.notify_all();
}

// Posts the oldest queued unit. REQUIRES: lock held, queued not empty.
void PluginCore::post_next(std::unique_lock<std::mutex>& lock) {
  Unit unit = std::move(queued.front());
  queued.pop_front();
  queued_size.store(queued.size(), std::memory_order_release);
  if (++next_op == 0) ++next_op;
  const uint32_t id = next_op;
  const Collective& first = unit.collectives.front();
  unit.work->mark_started();
  ops[id] = Op{unit.work, first.kind, first.seq, static_cast<uint32_t>(unit.collectives.size())};
  void* token = reinterpret_cast<void*>(static_cast<uintptr_t>((uint64_t{serial} << 32) | id));
  enter(lock, "post()", id);
  std::vector<Descriptor> descriptors(unit.collectives.size());
  std::vector<weftCollective_v1_t> described;
  described.reserve(unit.collectives.size());
  for (size_t i = 0; i < unit.collectives.size(); ++i) {
    described.push_back(describe(unit.collectives[i], descriptors[i]));
  }
  char error[kMessageSize] = {};
  void* request = nullptr;
  const auto num = static_cast<uint32_t>(described.size());
  const weft_result_t result =
      polling ? plugin->post(context, described.data(), num, nullptr, nullptr, &request, error,
                             sizeof error)
              : plugin->post(context, described.data(), num, &PluginCore::on_done, token, &request,
                             error, sizeof error);
  leave(lock);
  auto it = ops.find(id);
  Op& op = it->second;
  op.posting = false;
  if (result == WEFT_SUCCESS) {
    if (polling) {
      op.request = request;
      polled.push_back(id);
    } else if (op.done) {
      retire(it);  // done() ran inside post()
    }
    return;
  }
  const std::string message = text_of(error, sizeof error);
  if (op.done) {
    const std::string what = op.text();
    retire(it);
    lock.unlock();
    violation(
        fmt::format("post() of {} returned {} ({}) after calling done() for it: a failure "
                    "to queue is returned by post() and then nothing completes; the "
                    "operation keeps the result done() gave",
                    what, result_text(result), message.empty() ? "no message" : message));
    lock.lock();
    return;
  }
  std::shared_ptr<Work> work = std::move(op.work);
  retire(it);
  lock.unlock();
  if (work) finish(*work, result, message, "post()");
  lock.lock();
}

// Tests the oldest polled request; true when it finished. REQUIRES: lock held, polled not empty.
bool PluginCore::test_front(std::unique_lock<std::mutex>& lock) {
  const uint32_t id = polled.front();
  void* request = ops.at(id).request;
  enter(lock, "test()", id);
  int32_t done = 0;
  char error[kMessageSize] = {};
  const weft_result_t result = plugin->test(context, request, &done, error, sizeof error);
  leave(lock);
  if (!hung.empty()) return true;
  if (done == 0 && result == WEFT_SUCCESS) return false;
  if (plugin->release != nullptr) {
    enter(lock, "release()", id);
    plugin->release(context, request);
    leave(lock);
    if (!hung.empty()) return true;
  }
  polled.pop_front();
  auto it = ops.find(id);
  std::shared_ptr<Work> work = std::move(it->second.work);
  retire(it);
  lock.unlock();
  if (work) finish(*work, result, text_of(error, sizeof error), "test()");
  lock.lock();
  return true;
}

// ---- Completion.

void PluginCore::finish(Work& work, weft_result_t result, const std::string& message,
                        const char* call_name) {
  if (result == WEFT_SUCCESS) {
    work.complete();
  } else {
    work.fail(std::make_exception_ptr(
        Error(code_of(result), work.context(), failure_detail(name, call_name, result, message))));
  }
}

void PluginCore::violation(const std::string& what) const {
  WEFT_LOG_ERROR("{}: Internal: plugin {} broke its contract (plugin.h): {}", group.describe(),
                 name, what);
}

void PluginCore::on_done(void* arg, weft_result_t result, const char* message) {
  const auto token = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(arg));
  std::shared_ptr<PluginCore> core = PluginCores::get().find(static_cast<uint32_t>(token >> 32));
  if (core == nullptr) {
    WEFT_LOG_ERROR(
        "Internal: a backend plugin called done() with done_arg {:#x}, which belongs to no "
        "live process group (called after finalize(), or not an argument weft gave): ignored",
        token);
    return;
  }
  core->done(static_cast<uint32_t>(token), result, message);
}

void PluginCore::done(uint32_t id, weft_result_t result, const char* message) {
  std::string text = message == nullptr ? std::string() : text_of(message, 65536);
  std::shared_ptr<Work> work;
  {
    std::unique_lock<std::mutex> lock(mutex);
    auto it = ops.find(id);
    if (it == ops.end() || polling) {
      const size_t slot = id % kRecent;
      std::string what = recent_id[slot] == id
                             ? fmt::format(
                                   "done() was called for {}, which had already completed (done() "
                                   "called twice, or after post() failed it): ignored",
                                   recent[slot].text())
                             : fmt::format(
                                   "done() was called for an operation weft does not know (id {}: "
                                   "completed long ago, or never posted): ignored",
                                   id);
      lock.unlock();
      violation(what);
      return;
    }
    Op& op = it->second;
    if (op.done) {
      const std::string what = op.text();
      lock.unlock();
      violation(fmt::format("done() was called twice for {}: the second call is ignored", what));
      return;
    }
    op.done = true;
    work = std::move(op.work);
    if (!op.posting) retire(it);
  }
  if (work) finish(*work, result, text, "done()");
}

// ---- Giving up on a hung plugin.

// Declares the plugin hung in `what` (the watchdog, or abort() past its bound): fails every
// unfinished operation with Timeout and aborts the plugin; later posts fail at once.
// REQUIRES: lock held, hung empty. Unlocks and relocks.
void PluginCore::give_up(std::unique_lock<std::mutex>& lock,
                         const std::shared_ptr<PluginCore>& self, const std::string& what,
                         uint32_t id) {
  hung = fmt::format("plugin {} has not returned from {} within {} ms (the group's timeout)", name,
                     what, timeout.count());
  std::vector<std::pair<std::shared_ptr<Work>, bool>> works;  // (work, the one stuck)
  for (Unit& unit : queued) works.emplace_back(std::move(unit.work), false);
  outstanding -= static_cast<int64_t>(queued.size());
  queued.clear();
  queued_size.store(0, std::memory_order_release);
  for (auto& [op_id, op] : ops) {
    if (op.work) works.emplace_back(std::move(op.work), op_id == id);
  }
  changed.notify_all();
  const bool abort_now = !aborted;
  aborted = true;
  const std::string reason = hung;
  lock.unlock();
  WEFT_LOG_ERROR(
      "{}: Timeout: {}: weft gives up on it: its unfinished operations fail, later ones fail at "
      "once, abort() is called and the context will never be finalized",
      group.describe(), reason);
  for (auto& [work, stuck] : works) {
    const std::string detail =
        stuck ? fmt::format(
                    "{}: the plugin is hung; weft gave up on it and broke the group "
                    "(later operations fail at once)",
                    reason)
              : fmt::format("cannot complete: {}; weft gave up on the plugin", reason);
    work->fail(std::make_exception_ptr(Error(ErrorCode::Timeout, work->context(), detail)));
  }
  if (abort_now) start_abort(self, "weft gave up on the plugin: " + reason);
  lock.lock();
}

// Calls abort() on a thread of its own (it may block too). REQUIRES: mutex not held.
void PluginCore::start_abort(const std::shared_ptr<PluginCore>& core, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(core->mutex);
    core->abort_running = true;
  }
  auto body = [core, reason] {
    core->plugin->abort(core->context, reason.c_str());
    std::lock_guard<std::mutex> lock(core->mutex);
    core->abort_running = false;
    core->changed.notify_all();
  };
  try {
    std::thread(body).detach();
  } catch (const std::system_error&) {
    body();  // no thread to be had: call it here, unbounded
  }
}

void PluginCore::watchdog(const std::shared_ptr<PluginCore>& self) {
  const auto period = std::clamp<std::chrono::milliseconds>(
      timeout / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(250));
  std::unique_lock<std::mutex> lock(mutex);
  while (!watchdog_stop) {
    watch.wait_for(lock, period);
    if (watchdog_stop || !hung.empty() || call == nullptr) continue;
    if (std::string_view(call) == "finalize()") continue;  // the destructor bounds it
    if (Clock::now() - call_start < timeout) continue;
    auto it = ops.find(call_op);
    const std::string what =
        it == ops.end() ? std::string(call) : fmt::format("{} of {}", call, it->second.text());
    give_up(lock, self, what, call_op);
  }
}

PluginCores& PluginCores::get() {
  static PluginCores* cores = new PluginCores;
  return *cores;
}

uint32_t PluginCores::add(std::shared_ptr<PluginCore> core) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint32_t serial;
  do {
    serial = next_++;
  } while (serial == 0 || cores_.count(serial) != 0);
  cores_.emplace(serial, std::move(core));
  return serial;
}

void PluginCores::remove(uint32_t serial) {
  std::shared_ptr<PluginCore> gone;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cores_.find(serial);
  if (it == cores_.end()) return;
  gone = std::move(it->second);
  cores_.erase(it);
}

std::shared_ptr<PluginCore> PluginCores::find(uint32_t serial) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cores_.find(serial);
  return it == cores_.end() ? nullptr : it->second;
}

}  // namespace weft::plugin_detail
