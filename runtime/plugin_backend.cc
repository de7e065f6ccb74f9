// runtime/plugin_backend.cc: PluginBackend, the Backend over one context of a plugin: the group's
// side of runtime/plugin_core.h (it queues units, waits for init() and abort() with a bound, and
// drains, finalizes or leaks the context when the group goes).
#include "runtime/plugin_backend.h"

#include <pthread.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/flight_recorder.h"
#include "runtime/log.h"
#include "runtime/plugin_core.h"

namespace weft {

namespace {

using plugin_detail::Clock;
using plugin_detail::code_of;
using plugin_detail::failure_detail;
using plugin_detail::InitStorage;
using plugin_detail::LogBridge;
using plugin_detail::PluginCore;
using plugin_detail::PluginCores;
using plugin_detail::Unit;

void name_thread(std::thread& thread, const std::string& name) {
  pthread_setname_np(thread.native_handle(), name.substr(0, 15).c_str());
}

class PluginBackend : public Backend {
 public:
  PluginBackend(const PluginTable* plugin, const BackendOptions& options, DeviceKind kind)
      : core_(std::make_shared<PluginCore>(plugin, options)),
        // A Work's default wait() gives the watchdog (at the group's timeout, counted from the
        // call's start) a margin to fire first: its Timeout names the plugin and the call.
        work_timeout_(options.timeout + margin(options.timeout)) {
    PluginCore& c = *core_;
    auto init = std::make_unique<InitStorage>();
    init->group_name = options.group_name;
    for (const auto& [k, v] : options.settings) init->keys.push_back(k), init->values.push_back(v);
    for (size_t i = 0; i < init->keys.size(); ++i) {
      init->key_ptrs.push_back(init->keys[i].c_str());
      init->value_ptrs.push_back(init->values[i].c_str());
    }
    init->global.assign(options.global_ranks.begin(), options.global_ranks.end());
    if (init->global.empty()) {
      for (int r = 0; r < options.size; ++r) init->global.push_back(r);
    }
    weftInitArgs_v2_t& args = init->args;
    args.struct_size = sizeof args;
    args.rank = options.rank;
    args.size = options.size;
    args.device_kind = static_cast<int32_t>(kind);
    args.group_name = init->group_name.c_str();
    args.timeout_ms = options.timeout.count();
    args.store = &c.store.table;
    args.log = &LogBridge::log;
    args.log_ctx = &c.log;
    args.num_settings = static_cast<uint32_t>(init->keys.size());
    args.setting_keys = init->key_ptrs.data();
    args.setting_values = init->value_ptrs.data();
    args.global_ranks = init->global.data();
    // The same for a v1 plugin, with the store table of its version.
    init->args_v1 =
        weftInitArgs_v1_t{sizeof(weftInitArgs_v1_t), args.rank,         args.size,
                          args.device_kind,          args.group_name,   args.timeout_ms,
                          &c.store.table_v1,         args.log,          args.log_ctx,
                          args.num_settings,         args.setting_keys, args.setting_values,
                          args.global_ranks};

    ErrorContext where = c.group;
    where.op = fmt::format("plugin {} init", c.name);
    thread_ = std::thread(
        [core = core_, init = std::move(init)]() mutable { core->run(std::move(init)); });
    name_thread(thread_, "wplug-" + options.group_name);
    std::unique_lock<std::mutex> lock(c.mutex);
    // init() may take the group's timeout and then fail with WEFT_ERR_TIMEOUT itself (its message
    // says more than ours): it gets the margin on top.
    const auto limit = options.timeout + margin(options.timeout);
    if (!c.changed.wait_for(lock, limit, [&] { return c.init_done; })) {
      c.init_abandoned = true;
      lock.unlock();
      thread_.detach();
      WEFT_LOG_ERROR("{}: init() has not returned within {} ms; weft gives up on it", c.log.prefix,
                     limit.count());
      throw Error(ErrorCode::Timeout, where,
                  fmt::format("plugin {} did not return from init() within {} ms (the group's "
                              "timeout, {} ms, and a margin): weft gave up on it; the call is "
                              "left running on a thread of its own",
                              c.name, limit.count(), options.timeout.count()));
    }
    if (c.init_result != WEFT_SUCCESS) {
      const weft_result_t result = c.init_result;
      const std::string message = c.init_error;
      lock.unlock();
      thread_.join();
      throw Error(code_of(result), where, failure_detail(c.name, "init()", result, message));
    }
    c.serial = PluginCores::get().add(core_);
    lock.unlock();
    try {
      watchdog_ = std::thread([core = core_] { core->watchdog(core); });
      name_thread(watchdog_, "wwatch-" + options.group_name);
    } catch (...) {
      close();
      throw;
    }
  }

  // Finalizes the context once every operation given to it has completed, as plugin.h promises.
  // Operations still running get the group's timeout, then the plugin is aborted and given the
  // timeout again; a plugin that still has not completed them, or that weft gave up on, is
  // leaked (never finalized) with an error in the log, rather than hanging the caller. finalize()
  // itself gets the timeout too.
  ~PluginBackend() override { close(); }

  std::string_view name() const override { return core_->name; }

  std::shared_ptr<Work> post(Collective collective, ErrorContext context) override {
    std::vector<Collective> one;
    one.push_back(std::move(collective));
    return post_unit(std::move(one), std::move(context));
  }

  std::shared_ptr<Work> post_coalesced(std::vector<Collective> collectives,
                                       ErrorContext context) override {
    return post_unit(std::move(collectives), std::move(context));
  }

  // Calls the plugin's abort() (once) and waits for it up to the group's timeout; past it, weft
  // gives up on the plugin (its operations fail with Timeout).
  void abort(const std::string& reason) override {
    PluginCore& c = *core_;
    {
      std::lock_guard<std::mutex> lock(c.mutex);
      if (c.aborted) return;
      c.aborted = true;
    }
    PluginCore::start_abort(core_, reason);
    std::unique_lock<std::mutex> lock(c.mutex);
    if (!c.changed.wait_for(lock, c.timeout, [&] { return !c.abort_running; }) && c.hung.empty()) {
      c.give_up(lock, core_, "abort()", 0);
    }
  }

 private:
  static std::chrono::milliseconds margin(std::chrono::milliseconds timeout) {
    return std::max<std::chrono::milliseconds>(std::chrono::seconds(1), timeout / 10);
  }

  std::shared_ptr<Work> post_unit(std::vector<Collective> collectives, ErrorContext context) {
    auto work = std::make_shared<Work>(std::move(context), work_timeout_);
    work->set_trace(unit_trace(collectives));
    // A caller that waits watches for the completion a moment before it sleeps: an operation of a
    // prompt plugin then costs it no wake-up (the plugin thread posts it meanwhile).
    work->set_wait_helper([w = work.get()] {
      const auto until = Clock::now() + PluginCore::kSpin;
      while (!w->is_completed() && Clock::now() < until) std::this_thread::yield();
    });
    PluginCore& c = *core_;
    std::unique_lock<std::mutex> lock(c.mutex);
    if (!c.hung.empty()) {
      std::string detail = fmt::format(
          "{}; weft gave up on the plugin: the group's operations fail at once", c.hung);
      lock.unlock();
      work->fail(
          std::make_exception_ptr(Error(ErrorCode::Timeout, work->context(), std::move(detail))));
      return work;
    }
    c.queued.push_back(Unit{std::move(collectives), work});
    c.queued_size.store(c.queued.size(), std::memory_order_release);
    ++c.outstanding;
    const bool wake = c.sleeping;
    lock.unlock();
    if (wake) c.wake.notify_one();
    return work;
  }

  void close() {
    PluginCore& c = *core_;
    std::unique_lock<std::mutex> lock(c.mutex);
    auto drained = [&] { return c.outstanding == 0 || !c.hung.empty(); };
    if (!c.changed.wait_for(lock, c.timeout, drained)) {
      const int64_t left = c.outstanding;
      lock.unlock();
      abort(
          fmt::format("the process group was destroyed with {} operation(s) of plugin {} "
                      "still running",
                      left, c.name));
      lock.lock();
      c.changed.wait_for(lock, c.timeout, drained);
    }
    c.watchdog_stop = true;
    c.watch.notify_all();
    if (!c.hung.empty() || c.outstanding > 0 || c.abort_running) {
      if (c.hung.empty()) {
        WEFT_LOG_ERROR(
            "{}: {} operation(s) never completed{}; the plugin's context is leaked, not finalized",
            c.log.prefix, c.outstanding,
            c.abort_running ? " and abort() has not returned" : ", even after abort()");
      } else {
        WEFT_LOG_WARN("{}: the plugin's context is not finalized: {}", c.log.prefix, c.hung);
      }
      c.stop = true;
      c.wake.notify_all();
      const bool in_call = c.call != nullptr;
      lock.unlock();
      if (watchdog_.joinable()) watchdog_.join();
      // The plugin thread may be inside the plugin for good; the context stays registered, so
      // that the plugin may still call done(), the store and the log.
      if (in_call || on_plugin_thread()) {
        thread_.detach();
      } else {
        thread_.join();
      }
      return;
    }
    if (on_plugin_thread()) {
      // Destroyed by a Work's callback on the plugin thread (the last reference to the group
      // dropped there): that thread finalizes the context when it gets back to its loop.
      c.finalize = true;
      lock.unlock();
      if (watchdog_.joinable()) watchdog_.join();
      thread_.detach();
      return;
    }
    c.finalize = true;
    c.wake.notify_all();
    const bool finalized = c.changed.wait_for(lock, c.timeout, [&] { return c.finalized; });
    lock.unlock();
    if (watchdog_.joinable()) watchdog_.join();
    if (!finalized) {
      WEFT_LOG_ERROR(
          "{}: Timeout: finalize() has not returned within {} ms (the group's timeout): weft "
          "gives up on it and leaves it running on a thread of its own",
          c.log.prefix, c.timeout.count());
      thread_.detach();
      return;
    }
    thread_.join();
  }

  bool on_plugin_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

  std::shared_ptr<PluginCore> core_;
  std::chrono::milliseconds work_timeout_;
  std::thread thread_;    // the plugin thread: init(), post(), test(), release(), finalize()
  std::thread watchdog_;  // sees a call past the group's timeout
};

}  // namespace

std::unique_ptr<Backend> make_plugin_backend(const PluginTable* plugin,
                                             const BackendOptions& options, DeviceKind kind) {
  return std::make_unique<PluginBackend>(plugin, options, kind);
}

}  // namespace weft
