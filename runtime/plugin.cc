// runtime/plugin.cc: loading backend plugins (weft/plugin.h) and running them as weft Backends.
//
// Two parts. The loader finds libweft-backend-NAME.so (WEFT_PLUGIN_PATH, then the install's
// plugin directory, or a path), checks the exported struct and turns it into a Registry entry.
// PluginBackend is the Backend that entry's factory makes: it converts each Collective to the C
// descriptors, bridges the group's Store and weft's log to the plugin, and completes Works from
// the plugin's `done` callback or by polling its `test` on a thread of its own.
#include "weft/plugin.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/backend.h"

#include "runtime/log.h"

#ifndef WEFT_PLUGIN_DIR
#define WEFT_PLUGIN_DIR "/usr/local/lib/weft/plugins"
#endif

namespace weft {

namespace {

// The newest ABI version this weft implements, and how far beyond it to look for a plugin that
// is newer than this weft (only to say so).
constexpr int kAbiVersion = 1;
constexpr int kProbeNewerUpTo = 9;

constexpr size_t kMessageSize = 1024;

static_assert(WEFT_SUCCESS == 0 && WEFT_ERR_TIMEOUT == int(ErrorCode::Timeout) &&
              WEFT_ERR_PEER_LOST == int(ErrorCode::PeerLost) &&
              WEFT_ERR_INVALID_ARGUMENT == int(ErrorCode::InvalidArgument) &&
              WEFT_ERR_UNSUPPORTED == int(ErrorCode::Unsupported) &&
              WEFT_ERR_ABORTED == int(ErrorCode::Aborted) &&
              WEFT_ERR_DESYNC == int(ErrorCode::Desync) &&
              WEFT_ERR_PROTOCOL == int(ErrorCode::Protocol) && WEFT_ERR_IO == int(ErrorCode::Io));
static_assert(WEFT_COLL_RECV == int(CollectiveKind::Recv) &&
              WEFT_COLL_ALL_TO_ALL == int(CollectiveKind::AllToAll));
static_assert(WEFT_BOOL == int(DType::Bool) && WEFT_BXOR == int(ReduceOp::BXor));

// A plugin's failure as a weft error code: the C codes are ErrorCode's; Internal (and anything
// unknown) is reported as Protocol, the code for "the other side broke its contract".
ErrorCode code_of(weft_result_t result) {
  if (result >= WEFT_ERR_TIMEOUT && result <= WEFT_ERR_IO) return static_cast<ErrorCode>(result);
  return ErrorCode::Protocol;
}

weft_result_t result_of(const Error& e) { return static_cast<weft_result_t>(e.code()); }

std::string message_of(const char* buffer, weft_result_t result) {
  std::string text(buffer, strnlen(buffer, kMessageSize));
  if (text.empty())
    text = fmt::format("the plugin reported error {} without a message", static_cast<int>(result));
  return text;
}

// ---- The store and the logger, as the plugin sees them.

struct StoreBridge {
  std::shared_ptr<Store> store;
  std::chrono::milliseconds group_timeout;
  weftStore_v1_t table{};

  std::chrono::milliseconds timeout(int64_t ms) const {
    return ms < 0 ? group_timeout : std::chrono::milliseconds(ms);
  }

  template <typename F>
  weft_result_t call(F&& body) {
    try {
      body();
      return WEFT_SUCCESS;
    } catch (const Error& e) {
      WEFT_LOG_DEBUG("plugin store call failed: {}", e.what());
      return result_of(e);
    } catch (const std::exception& e) {
      WEFT_LOG_WARN("plugin store call failed: {}", e.what());
      return WEFT_ERR_INTERNAL;
    }
  }

  static StoreBridge& of(void* ctx) { return *static_cast<StoreBridge*>(ctx); }

  static weft_result_t set(void* ctx, const char* key, const void* value, size_t size) {
    if (key == nullptr || (value == nullptr && size > 0)) return WEFT_ERR_INVALID_ARGUMENT;
    auto* bytes = static_cast<const uint8_t*>(value);
    return of(ctx).call([&] { of(ctx).store->set(key, Bytes(bytes, bytes + size)); });
  }
  static weft_result_t get(void* ctx, const char* key, int64_t timeout_ms, void** value,
                           size_t* size) {
    if (key == nullptr || value == nullptr || size == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
    return of(ctx).call([&] {
      Bytes bytes = of(ctx).store->get(key, of(ctx).timeout(timeout_ms));
      *value = copy_out(bytes);
      *size = bytes.size();
    });
  }
  static void free_value(void*, void* value) { std::free(value); }
  static weft_result_t add(void* ctx, const char* key, int64_t delta, int64_t* result) {
    if (key == nullptr || result == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
    return of(ctx).call([&] { *result = of(ctx).store->add(key, delta); });
  }
  static weft_result_t wait(void* ctx, const char* const* keys, size_t num_keys,
                            int64_t timeout_ms) {
    if (keys == nullptr && num_keys > 0) return WEFT_ERR_INVALID_ARGUMENT;
    std::vector<std::string> list;
    for (size_t i = 0; i < num_keys; ++i) {
      if (keys[i] == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
      list.emplace_back(keys[i]);
    }
    return of(ctx).call([&] { of(ctx).store->wait(list, of(ctx).timeout(timeout_ms)); });
  }
  static weft_result_t check(void* ctx, const char* const* keys, size_t num_keys, int32_t* exists) {
    std::vector<std::string> list;
    if (!key_list(keys, num_keys, list) || exists == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
    return of(ctx).call([&] { *exists = of(ctx).store->check(list) ? 1 : 0; });
  }
  static weft_result_t multi_get(void* ctx, const char* const* keys, size_t num_keys,
                                 int64_t timeout_ms, void** values, size_t* sizes) {
    std::vector<std::string> list;
    if (!key_list(keys, num_keys, list) ||
        (num_keys > 0 && (values == nullptr || sizes == nullptr))) {
      return WEFT_ERR_INVALID_ARGUMENT;
    }
    return of(ctx).call([&] {
      std::vector<Bytes> got = of(ctx).store->multi_get(list, of(ctx).timeout(timeout_ms));
      for (size_t i = 0; i < got.size(); ++i) {
        values[i] = copy_out(got[i]);
        sizes[i] = got[i].size();
      }
    });
  }
  static weft_result_t compare_set(void* ctx, const char* key, const void* expected,
                                   size_t expected_size, const void* desired, size_t desired_size,
                                   void** current, size_t* current_size) {
    if (key == nullptr || (expected == nullptr && expected_size > 0) ||
        (desired == nullptr && desired_size > 0) || current == nullptr || current_size == nullptr) {
      return WEFT_ERR_INVALID_ARGUMENT;
    }
    auto* e = static_cast<const uint8_t*>(expected);
    auto* d = static_cast<const uint8_t*>(desired);
    return of(ctx).call([&] {
      Bytes now =
          of(ctx).store->compare_set(key, Bytes(e, e + expected_size), Bytes(d, d + desired_size));
      *current = copy_out(now);
      *current_size = now.size();
    });
  }

 private:
  static bool key_list(const char* const* keys, size_t num_keys, std::vector<std::string>& out) {
    if (keys == nullptr && num_keys > 0) return false;
    for (size_t i = 0; i < num_keys; ++i) {
      if (keys[i] == nullptr) return false;
      out.emplace_back(keys[i]);
    }
    return true;
  }
  static void* copy_out(const Bytes& bytes) {
    void* out = std::malloc(std::max<size_t>(bytes.size(), 1));
    if (out == nullptr) throw std::bad_alloc();
    std::memcpy(out, bytes.data(), bytes.size());
    return out;
  }
};

struct LogBridge {
  std::string prefix;  // "rank 2/4 group \"world\" plugin mpi"
  static void log(void* ctx, int32_t level, const char* message) {
    const std::string& prefix = static_cast<LogBridge*>(ctx)->prefix;
    const char* text = message == nullptr ? "" : message;
    switch (level) {
      case WEFT_LOG_ERROR:
        WEFT_LOG_ERROR("{}: {}", prefix, text);
        break;
      case WEFT_LOG_WARN:
        WEFT_LOG_WARN("{}: {}", prefix, text);
        break;
      case WEFT_LOG_INFO:
        WEFT_LOG_INFO("{}: {}", prefix, text);
        break;
      default:
        WEFT_LOG_DEBUG("{}: {}", prefix, text);
        break;
    }
  }
};

// ---- One posted unit, from post() to its Work's completion.

class PluginBackend;

struct Pending {
  std::shared_ptr<Work> work;
  ErrorContext context;
  void* request = nullptr;         // polling plugins
  PluginBackend* owner = nullptr;  // callback plugins: told when `done` ran
};

void finish(Pending& p, weft_result_t result, const std::string& message) {
  if (result == WEFT_SUCCESS) {
    p.work->complete();
  } else {
    p.work->fail(std::make_exception_ptr(Error(code_of(result), p.context, message)));
  }
}

class PluginBackend : public Backend {
 public:
  PluginBackend(const weftBackendPlugin_v1_t* plugin, const BackendOptions& options,
                DeviceKind kind)
      : plugin_(plugin), name_(plugin->name), timeout_(options.timeout) {
    store_.store = options.store;
    store_.group_timeout = options.timeout;
    store_.table = weftStore_v1_t{&store_,
                                  &StoreBridge::set,
                                  &StoreBridge::get,
                                  &StoreBridge::free_value,
                                  &StoreBridge::add,
                                  &StoreBridge::wait,
                                  &StoreBridge::check,
                                  &StoreBridge::multi_get,
                                  &StoreBridge::compare_set};
    log_.prefix = fmt::format("rank {}/{} group \"{}\" plugin {}", options.rank, options.size,
                              options.group_name, name_);
    std::vector<std::string> keys, values;
    for (const auto& [k, v] : options.settings) keys.push_back(k), values.push_back(v);
    std::vector<const char*> key_ptrs, value_ptrs;
    for (size_t i = 0; i < keys.size(); ++i) {
      key_ptrs.push_back(keys[i].c_str());
      value_ptrs.push_back(values[i].c_str());
    }
    std::vector<int32_t> global(options.global_ranks.begin(), options.global_ranks.end());
    if (global.empty()) {
      for (int r = 0; r < options.size; ++r) global.push_back(r);
    }
    weftInitArgs_v1_t args{};
    args.struct_size = sizeof args;
    args.rank = options.rank;
    args.size = options.size;
    args.device_kind = static_cast<int32_t>(kind);
    args.group_name = options.group_name.c_str();
    args.timeout_ms = options.timeout.count();
    args.store = &store_.table;
    args.log = &LogBridge::log;
    args.log_ctx = &log_;
    args.num_settings = static_cast<uint32_t>(keys.size());
    args.setting_keys = key_ptrs.data();
    args.setting_values = value_ptrs.data();
    args.global_ranks = global.data();
    char error[kMessageSize] = {};
    weft_result_t result = plugin_->init(&args, &context_, error, sizeof error);
    if (result != WEFT_SUCCESS) {
      throw Error(code_of(result),
                  ErrorContext{.rank = options.rank,
                               .size = options.size,
                               .group = options.group_name,
                               .op = fmt::format("plugin {} init", name_)},
                  message_of(error, result));
    }
  }

  // Finalizes the plugin once every operation it was given has completed, as plugin.h promises.
  // Operations still running get the group's timeout, then the plugin is aborted and given the
  // timeout again; a plugin that still has not completed them is leaked (never finalized) with
  // an error in the log, rather than hanging the caller.
  ~PluginBackend() override {
    std::unique_lock<std::mutex> lock(mutex_);
    auto drained = [&] { return outstanding_ == 0; };
    if (!drained_.wait_for(lock, timeout_, drained)) {
      lock.unlock();
      abort(
          fmt::format("the process group was destroyed with {} operation(s) of plugin {} "
                      "still running",
                      outstanding(), name_));
      lock.lock();
      if (!drained_.wait_for(lock, timeout_, drained)) {
        WEFT_LOG_ERROR(
            "{}: {} operation(s) never completed, even after abort(); the plugin's "
            "context is leaked, not finalized",
            log_.prefix, outstanding_);
        stopping_ = true;
        give_up_ = true;
        lock.unlock();
        wake_.notify_all();
        if (poller_.joinable()) poller_.detach();
        return;
      }
    }
    stopping_ = true;
    lock.unlock();
    wake_.notify_all();
    if (poller_.joinable()) poller_.join();
    plugin_->finalize(context_);
  }

  std::string_view name() const override { return name_; }

  std::shared_ptr<Work> post(Collective collective, ErrorContext context) override {
    std::vector<Collective> one;
    one.push_back(std::move(collective));
    return post_unit(one, std::move(context));
  }

  std::shared_ptr<Work> post_coalesced(std::vector<Collective> collectives,
                                       ErrorContext context) override {
    return post_unit(collectives, std::move(context));
  }

  void abort(const std::string& reason) override {
    if (aborted_.exchange(true)) return;
    plugin_->abort(context_, reason.c_str());
  }

 private:
  // The C view of one Collective; the vectors own what the pointers point into.
  struct Descriptor {
    std::vector<weftTensor_v1_t> inputs, outputs;
    std::vector<uint64_t> counts, send_counts, recv_counts;
  };

  static weftTensor_v1_t tensor_of(const Tensor& t) {
    return weftTensor_v1_t{
        t.data,         t.count, static_cast<int32_t>(t.dtype), static_cast<int32_t>(t.device.kind),
        t.device.index, 0};
  }

  static weftCollective_v1_t describe(const Collective& c, Descriptor& d) {
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

  static void on_done(void* arg, weft_result_t result, const char* message) {
    std::unique_ptr<Pending> p(static_cast<Pending*>(arg));
    finish(*p, result, message == nullptr ? "" : std::string(message, strnlen(message, 65536)));
    p->owner->retire();
  }

  int64_t outstanding() {
    std::lock_guard<std::mutex> lock(mutex_);
    return outstanding_;
  }

  // One operation fewer in flight.
  void retire() {
    // Notified under the lock: once the destructor sees zero, nothing here touches `this`.
    std::lock_guard<std::mutex> lock(mutex_);
    --outstanding_;
    drained_.notify_all();
  }

  std::shared_ptr<Work> post_unit(const std::vector<Collective>& collectives,
                                  ErrorContext context) {
    auto work = std::make_shared<Work>(context);
    std::vector<Descriptor> descriptors(collectives.size());
    std::vector<weftCollective_v1_t> ops;
    for (size_t i = 0; i < collectives.size(); ++i) {
      ops.push_back(describe(collectives[i], descriptors[i]));
    }
    auto pending = std::make_unique<Pending>(Pending{work, context, nullptr, this});
    const bool polling = plugin_->test != nullptr;
    char error[kMessageSize] = {};
    weft_result_t result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++outstanding_;  // before post(): `done` may run before it returns
    }
    if (polling) {
      result = plugin_->post(context_, ops.data(), static_cast<uint32_t>(ops.size()), nullptr,
                             nullptr, &pending->request, error, sizeof error);
    } else {
      Pending* arg = pending.get();
      void* request = nullptr;
      result = plugin_->post(context_, ops.data(), static_cast<uint32_t>(ops.size()), &on_done, arg,
                             &request, error, sizeof error);
      if (result == WEFT_SUCCESS) {
        pending.release();  // on_done owns it now (and may already have run)
        return work;
      }
    }
    if (result != WEFT_SUCCESS) {
      finish(*pending, result, message_of(error, result));
      retire();
      return work;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      polled_.push_back(std::move(pending));
      if (!poller_.joinable()) poller_ = std::thread([this] { poll_loop(); });
    }
    wake_.notify_all();
    return work;
  }

  // Polls the oldest requests first (they complete in order), pausing 20 us and doubling up to
  // 1 ms while nothing completes; sleeps on the condition while nothing is pending.
  void poll_loop() {
    auto pause = std::chrono::microseconds(20);
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !polled_.empty(); });
      if (polled_.empty() || give_up_) return;  // stopping
      std::unique_ptr<Pending> front = std::move(polled_.front());
      polled_.pop_front();
      lock.unlock();
      int32_t done = 0;
      char error[kMessageSize] = {};
      weft_result_t result = plugin_->test(context_, front->request, &done, error, sizeof error);
      bool finished = done != 0 || result != WEFT_SUCCESS;
      if (finished) {
        finish(*front, result, message_of(error, result));
        if (plugin_->release != nullptr) plugin_->release(context_, front->request);
        retire();
        pause = std::chrono::microseconds(20);
      }
      lock.lock();
      if (!finished) {
        polled_.push_front(std::move(front));
        wake_.wait_for(lock, pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
      }
    }
  }

  const weftBackendPlugin_v1_t* plugin_;
  std::string name_;
  void* context_ = nullptr;
  StoreBridge store_;
  LogBridge log_;
  std::atomic<bool> aborted_{false};

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable drained_;
  std::deque<std::unique_ptr<Pending>> polled_;  // guarded by mutex_
  int64_t outstanding_ = 0;                      // posted, not yet completed; guarded by mutex_
  bool stopping_ = false;                        // guarded by mutex_
  bool give_up_ = false;                         // guarded by mutex_
  std::chrono::milliseconds timeout_;
  std::thread poller_;
};

// ---- Loading.

std::vector<std::string> search_dirs() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("WEFT_PLUGIN_PATH")) {
    std::string_view rest = path;
    while (!rest.empty()) {
      size_t colon = rest.find(':');
      std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) dirs.emplace_back(dir);
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  dirs.emplace_back(WEFT_PLUGIN_DIR);
  return dirs;
}

// Checks one opened library; returns its struct or throws with why it is refused.
const weftBackendPlugin_v1_t* check_plugin(void* handle, const std::string& file,
                                           std::string_view expected_name) {
  const weftBackendPlugin_v1_t* plugin = nullptr;
  for (int version = kAbiVersion; version >= 1 && plugin == nullptr; --version) {
    plugin = static_cast<const weftBackendPlugin_v1_t*>(
        dlsym(handle, fmt::format("weftBackendPlugin_v{}", version).c_str()));
  }
  auto refuse = [&](std::string_view why) {
    throw_error(ErrorCode::InvalidArgument, "backend plugin", fmt::format("{}: {}", file, why));
  };
  if (plugin == nullptr) {
    std::vector<std::string> newer;
    for (int version = kAbiVersion + 1; version <= kProbeNewerUpTo; ++version) {
      std::string symbol = fmt::format("weftBackendPlugin_v{}", version);
      if (dlsym(handle, symbol.c_str()) != nullptr) newer.push_back(symbol);
    }
    if (!newer.empty()) {
      refuse(
          fmt::format("it exports only {}, newer than this weft, which loads "
                      "weftBackendPlugin_v1 up to v{}: rebuild it against this weft's "
                      "plugin.h, or upgrade weft",
                      fmt::join(newer, ", "), kAbiVersion));
    }
    refuse(
        fmt::format("exports no weftBackendPlugin_vN symbol (this weft loads v1 up to v{}); "
                    "is it a weft backend plugin?",
                    kAbiVersion));
  }
  if (plugin->abi_version != 1) {
    refuse(fmt::format("weftBackendPlugin_v1 says abi_version {}, not 1", plugin->abi_version));
  }
  if (plugin->struct_size != sizeof(weftBackendPlugin_v1_t)) {
    refuse(
        fmt::format("weftBackendPlugin_v1 has struct_size {}, this weft's plugin.h defines {} "
                    "bytes: it was built against a different plugin.h",
                    plugin->struct_size, sizeof(weftBackendPlugin_v1_t)));
  }
  if (plugin->name == nullptr || plugin->name[0] == '\0') refuse("its name is empty");
  if (!expected_name.empty() && expected_name != plugin->name) {
    refuse(fmt::format("it calls itself \"{}\", not \"{}\"", plugin->name, expected_name));
  }
  if (plugin->init == nullptr || plugin->post == nullptr || plugin->abort == nullptr ||
      plugin->finalize == nullptr) {
    refuse("init, post, abort and finalize are required and one is NULL");
  }
  if ((plugin->devices & ((1u << WEFT_DEVICE_CPU) | (1u << WEFT_DEVICE_CUDA))) == 0) {
    refuse(fmt::format("it serves no device kind weft knows (devices = {:#x})", plugin->devices));
  }
  return plugin;
}

Registry::Entry entry_for(const weftBackendPlugin_v1_t* plugin) {
  Registry::Entry entry;
  entry.name = plugin->name;
  if (plugin->devices & (1u << WEFT_DEVICE_CPU)) entry.devices.push_back(DeviceKind::Cpu);
  if (plugin->devices & (1u << WEFT_DEVICE_CUDA)) entry.devices.push_back(DeviceKind::Cuda);
  // The group makes one backend per device kind it maps to this plugin; a context serves one.
  DeviceKind kind = entry.devices.front();
  entry.factory = [plugin, kind](const BackendOptions& options) -> std::unique_ptr<Backend> {
    return std::make_unique<PluginBackend>(plugin, options, kind);
  };
  return entry;
}

// Opens `file` (a path); never closed: a plugin may keep threads and statics until exit.
const weftBackendPlugin_v1_t* open_plugin(const std::string& file, std::string_view expected_name) {
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw_error(ErrorCode::InvalidArgument, "backend plugin",
                fmt::format("{}: dlopen failed: {}", file, why ? why : "unknown error"));
  }
  try {
    return check_plugin(handle, file, expected_name);
  } catch (...) {
    dlclose(handle);
    throw;
  }
}

}  // namespace

std::string Registry::load_plugin(const std::string& path) {
  const weftBackendPlugin_v1_t* plugin = open_plugin(path, "");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry& known : entries_) {
      if (known.name == plugin->name) return known.name;  // loaded before (or a built-in)
    }
  }
  add(entry_for(plugin));
  WEFT_LOG_INFO("loaded backend plugin \"{}\" from {}", plugin->name, path);
  return plugin->name;
}

Registry::Entry Registry::resolve(std::string_view name) {
  if (name.find('/') != std::string_view::npos) return find(load_plugin(std::string(name)));
  if (contains(name)) return find(name);
  const std::string file = fmt::format("libweft-backend-{}.so", name);
  std::vector<std::string> tried;
  for (const std::string& dir : search_dirs()) {
    std::string path = (std::filesystem::path(dir) / file).string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      tried.push_back(fmt::format("{}: not there", path));
      continue;
    }
    try {
      const weftBackendPlugin_v1_t* plugin = open_plugin(path, name);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const Entry& known : entries_) {
          if (known.name == name) return known;  // another thread loaded it meanwhile
        }
      }
      add(entry_for(plugin));
      WEFT_LOG_INFO("loaded backend plugin \"{}\" from {}", name, path);
      return find(name);
    } catch (const Error& e) {
      // Refused or unloadable: say why, and go on with the next directory.
      WEFT_LOG_WARN("{}", e.what());
      tried.push_back(e.what());
    }
  }
  throw_error(
      ErrorCode::InvalidArgument, "backend registry",
      fmt::format("unknown backend \"{}\"; known backends: {}; no usable plugin {} in "
                  "WEFT_PLUGIN_PATH or {}:\n  {}",
                  name, fmt::join(names(), ", "), file, WEFT_PLUGIN_DIR, fmt::join(tried, "\n  ")));
}

}  // namespace weft
