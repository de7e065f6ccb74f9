// runtime/plugin_core.h: one context of a backend plugin (weft/plugin.h), driven from threads of
// weft's own so that no call into the plugin can hang the program. Internal to libweft: the
// PluginBackend (runtime/plugin_backend.cc) owns one.
//
// Every call into the context but abort() runs on the context's plugin thread (run()): init()
// first, then post() for each unit in issue order (and test()/release() for polling plugins),
// finalize() last. The caller's thread only queues a unit and returns its Work, so a plugin call
// that never returns cannot take the caller with it: the watchdog thread (watchdog()) sees a call
// running past the group's timeout and gives up on the plugin (give_up()): the Works fail with
// Timeout naming the plugin, the call and the operation, the plugin is aborted, and every later
// operation fails at once. init() is bounded by the backend's constructor, finalize() by its
// destructor and abort() by its caller, each with a timed wait on `changed`.
//
// A `done` callback's argument is a token, (serial << 32) | operation id, looked up in the
// process-wide table of live contexts (PluginCores), never a pointer to freed memory: a plugin
// that calls done() twice, or for an operation whose post() it failed, is reported (an Internal
// error in the log naming the plugin and the operation) and ignored.
//
// Lifetime: shared (std::shared_ptr) by the backend, the plugin thread, the watchdog, any abort()
// thread and the table. It outlives the backend when weft gives up on the plugin or leaks its
// context: the plugin may still call done(), the store and the log, so the context then stays in
// the table for good.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/backend.h"
#include "weft/plugin.h"
#include "weft/work.h"

#include "runtime/plugin_backend.h"
#include "runtime/plugin_bridge.h"

namespace weft::plugin_detail {

using Clock = std::chrono::steady_clock;

// One post_unit() of the backend, queued until the plugin thread posts it.
struct Unit {
  std::vector<Collective> collectives;
  std::shared_ptr<Work> work;
};

// A unit handed to post(), until the plugin has finished with it.
struct Op {
  std::shared_ptr<Work> work;  // null once settled (completed, or failed by weft)
  CollectiveKind kind = CollectiveKind::Barrier;
  uint64_t seq = 0;
  uint32_t count = 1;
  bool posting = true;      // post() has not returned yet
  bool done = false;        // done() was called (callback plugins)
  void* request = nullptr;  // polling plugins
  std::string text() const { return op_text(kind, seq, count); }
};

// What init() is given, kept at a fixed address while it runs.
struct InitStorage {
  std::string group_name;
  std::vector<std::string> keys, values;
  std::vector<const char*> key_ptrs, value_ptrs;
  std::vector<int32_t> global;
  weftInitArgs_v2_t args{};
  weftInitArgs_v1_t args_v1{};  // the same, with the v1 store table, for a v1 plugin
};

struct PluginCore {
  static constexpr size_t kRecent = 64;  // retired operations remembered, for messages
  // How long the plugin thread watches for the next unit, and a waiter for its operation, before
  // sleeping: a stream of posts, or a post/wait loop, then wakes no thread.
  static constexpr std::chrono::microseconds kSpin{50};

  PluginCore(const PluginTable* p, const BackendOptions& options);

  // ---- The plugin thread: init(), then posts and tests until stopped or finalized.
  void run(std::unique_ptr<InitStorage> init);

  // ---- Completion through `done`: the function given to post(), with a token as its argument.
  static void on_done(void* arg, weft_result_t result, const char* message);

  // ---- Giving up on a hung plugin.
  // Declares the plugin hung in `what` (the watchdog, or abort() past its bound): fails every
  // unfinished operation with Timeout (`id`'s as the one stuck) and aborts the plugin; later
  // posts fail at once. REQUIRES: lock held on mutex, hung empty. Unlocks and relocks.
  void give_up(std::unique_lock<std::mutex>& lock, const std::shared_ptr<PluginCore>& self,
               const std::string& what, uint32_t id);
  // Calls abort() on a thread of its own (it may block too); abort_running until it returns.
  // REQUIRES: mutex not held.
  static void start_abort(const std::shared_ptr<PluginCore>& core, const std::string& reason);
  // The watchdog thread: wakes every timeout / 8 (1 to 250 ms) until watchdog_stop.
  void watchdog(const std::shared_ptr<PluginCore>& self);

  const PluginTable* const table;
  const weftBackendPlugin_v2_t* const plugin;  // &table->v2
  const std::string name;
  const ErrorContext group;  // rank, size and group: how messages about the context start
  const std::chrono::milliseconds timeout;
  const bool polling;
  StoreBridge store;  // the plugin keeps pointers to these two until finalize()
  LogBridge log;
  void* context = nullptr;  // written by the plugin thread before init_done is set
  uint32_t serial = 0;      // set before the first unit is queued

  std::mutex mutex;
  std::condition_variable wake;     // the plugin thread waits here for work
  std::condition_variable changed;  // init returned, an operation retired, abort() or finalize()
                                    // returned, weft gave up
  std::condition_variable watch;    // the watchdog sleeps here
  // Guarded by mutex:
  std::deque<Unit> queued;               // not posted yet, in issue order
  std::unordered_map<uint32_t, Op> ops;  // handed to post(), not finished
  std::deque<uint32_t> polled;           // polling plugins: ids of posted units, oldest first
  std::array<Op, kRecent> recent;        // the last retired, by id % kRecent (work is null)
  std::array<uint32_t, kRecent> recent_id{};
  uint32_t next_op = 0;
  int64_t outstanding = 0;             // units accepted by the backend and not retired
  std::atomic<size_t> queued_size{0};  // queued.size(), read without the lock by spin()
  bool sleeping = false;               // the plugin thread waits on `wake`
  const char* call = nullptr;          // the call the plugin thread is in ("post()"), or null
  uint32_t call_op = 0;                // ... the operation it is for, or 0
  Clock::time_point call_start;
  std::string hung;  // non-empty once weft gave up on the plugin: why
  bool init_done = false, init_abandoned = false;
  weft_result_t init_result = WEFT_SUCCESS;
  std::string init_error;
  bool stop = false, finalize = false, finalized = false, watchdog_stop = false;
  bool aborted = false, abort_running = false;

 private:
  void spin(std::unique_lock<std::mutex>& lock);
  void enter(std::unique_lock<std::mutex>& lock, const char* what, uint32_t id);
  void leave(std::unique_lock<std::mutex>& lock);
  void retire(std::unordered_map<uint32_t, Op>::iterator it);
  void post_next(std::unique_lock<std::mutex>& lock);
  bool test_front(std::unique_lock<std::mutex>& lock);
  void finish(Work& work, weft_result_t result, const std::string& message, const char* call_name);
  void violation(const std::string& what) const;
  void done(uint32_t id, weft_result_t result, const char* message);
};

// The live contexts by serial, for done() tokens. Never destroyed: a plugin's own thread may call
// done() while the process exits. Thread safety: every function from any thread.
class PluginCores {
 public:
  static PluginCores& get();
  // Registers `core` and returns its serial (never 0, never one in use).
  uint32_t add(std::shared_ptr<PluginCore> core);
  void remove(uint32_t serial);
  std::shared_ptr<PluginCore> find(uint32_t serial);

 private:
  std::mutex mutex_;
  std::unordered_map<uint32_t, std::shared_ptr<PluginCore>> cores_;  // guarded by mutex_
  uint32_t next_ = 1;                                                // guarded by mutex_
};

}  // namespace weft::plugin_detail
