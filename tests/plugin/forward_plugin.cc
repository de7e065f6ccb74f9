// A backend plugin for the tests: every call goes through weft's plugin C ABI (plugin.h) and is
// forwarded to weft's own tcp backend, so that the conformance suite covers the ABI path (the
// loader, the descriptors, the store bridge, both ways of completing) on any machine.
//
// Built three times: libweft-backend-forward.so (ABI v2) completes through the `done` callback;
// with FORWARD_POLLING, libweft-backend-forward_poll.so (v2) sets `test` and is polled; with
// FORWARD_V1, libweft-backend-forward_v1.so exports the old layout only (weftBackendPlugin_v1,
// whose store table has no delete_key), so that the tests see a v1 plugin still load and run.
//
// The backend setting store_check=1 makes init() try the store's delete_key first (v2 only): set
// a key, delete it (deleted = 1), delete it again (deleted = 0), check it is gone; init() fails
// with a message saying which step went wrong.
//
// FORWARD_UNSUPPORTED=KIND (an environment variable; KIND as collective_name() prints it, e.g.
// all_to_all) makes post() refuse every operation of that kind with WEFT_ERR_UNSUPPORTED, as a
// partial plugin would: weft-conformance's test reports it as unsupported.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/backend.h"
#include "weft/error.h"
#include "weft/plugin.h"

namespace {

using weft::Bytes;
using weft::Error;
using weft::ErrorCode;

#if defined(FORWARD_POLLING)
constexpr const char* kName = "forward_poll";
#elif defined(FORWARD_V1)
constexpr const char* kName = "forward_v1";
#else
constexpr const char* kName = "forward";
#endif

#ifdef FORWARD_V1
using StoreTable = weftStore_v1_t;
using InitArgs = weftInitArgs_v1_t;
#else
using StoreTable = weftStore_v2_t;
using InitArgs = weftInitArgs_v2_t;
#endif

void ok(weft_result_t result, const char* what) {
  if (result != WEFT_SUCCESS) {
    throw Error(static_cast<ErrorCode>(result),
                fmt::format("forward plugin: store {} failed (code {})", what, int(result)));
  }
}

// The store table weft gave init(), as the weft::Store the tcp backend expects. The table has
// what a backend needs to connect; the rest is not part of the ABI.
class TableStore : public weft::Store {
 public:
  explicit TableStore(const StoreTable* table) : t_(table) {}

  void set(const std::string& key, const Bytes& value) override {
    ok(t_->set(t_->ctx, key.c_str(), value.data(), value.size()), "set");
  }
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    void* value = nullptr;
    size_t size = 0;
    ok(t_->get(t_->ctx, key.c_str(), ms(timeout), &value, &size), "get");
    return take(value, size);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    ok(t_->add(t_->ctx, key.c_str(), delta, &result), "add");
    return result;
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    void* value = nullptr;
    size_t size = 0;
    ok(t_->compare_set(t_->ctx, key.c_str(), expected.data(), expected.size(), desired.data(),
                       desired.size(), &value, &size),
       "compare_set");
    return take(value, size);
  }
  bool check(const std::vector<std::string>& keys) override {
    std::vector<const char*> list = c_keys(keys);
    int32_t exists = 0;
    ok(t_->check(t_->ctx, list.data(), list.size(), &exists), "check");
    return exists != 0;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<const char*> list = c_keys(keys);
    ok(t_->wait(t_->ctx, list.data(), list.size(), ms(timeout)), "wait");
  }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) override {
    std::vector<const char*> list = c_keys(keys);
    std::vector<void*> values(keys.size());
    std::vector<size_t> sizes(keys.size());
    ok(t_->multi_get(t_->ctx, list.data(), list.size(), ms(timeout), values.data(), sizes.data()),
       "multi_get");
    std::vector<Bytes> out;
    for (size_t i = 0; i < keys.size(); ++i) out.push_back(take(values[i], sizes[i]));
    return out;
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
  }
#ifdef FORWARD_V1
  bool delete_key(const std::string&) override { unsupported("delete_key"); }
#else
  bool delete_key(const std::string& key) override {
    int32_t deleted = -1;
    ok(t_->delete_key(t_->ctx, key.c_str(), &deleted), "delete_key");
    return deleted != 0;
  }
#endif
  int64_t num_keys() override { unsupported("num_keys"); }
  void append(const std::string&, const Bytes&) override { unsupported("append"); }
  void queue_push(const std::string&, const Bytes&) override { unsupported("queue_push"); }
  Bytes queue_pop(const std::string&, bool, std::chrono::milliseconds) override {
    unsupported("queue_pop");
  }
  int64_t queue_len(const std::string&) override { unsupported("queue_len"); }

 private:
  int64_t ms(std::chrono::milliseconds timeout) const {
    return timeout == kDefaultTimeout ? -1 : timeout.count();
  }
  Bytes take(void* value, size_t size) {
    Bytes out(static_cast<uint8_t*>(value), static_cast<uint8_t*>(value) + size);
    t_->free_value(t_->ctx, value);
    return out;
  }
  static std::vector<const char*> c_keys(const std::vector<std::string>& keys) {
    std::vector<const char*> out;
    for (const auto& k : keys) out.push_back(k.c_str());
    return out;
  }
  [[noreturn]] static void unsupported(const char* what) {
    throw Error(ErrorCode::Unsupported, fmt::format("forward plugin: store {} is not in the "
                                                    "plugin ABI's store table",
                                                    what));
  }
  const StoreTable* t_;
};

struct Context {
  std::unique_ptr<weft::Backend> backend;
  int rank = 0, size = 1;
  std::string group;
};

struct Request {
  std::shared_ptr<weft::Work> work;
};

void write_error(char* error, size_t error_size, const std::string& text) {
  if (error == nullptr || error_size == 0) return;
  size_t n = std::min(text.size(), error_size - 1);
  std::memcpy(error, text.data(), n);
  error[n] = '\0';
}

weft_result_t result_of(std::exception_ptr e, std::string& message) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& error) {
    message = error.what();
    return static_cast<weft_result_t>(error.code());
  } catch (const std::exception& error) {
    message = error.what();
    return WEFT_ERR_INTERNAL;
  }
}

weft::Tensor tensor_of(const weftTensor_v1_t& t) {
  return weft::Tensor{t.data, t.count, static_cast<weft::DType>(t.dtype),
                      weft::Device{static_cast<weft::DeviceKind>(t.device_kind), t.device_index}};
}

weft::Collective collective_of(const weftCollective_v1_t& c, int size) {
  weft::Collective out;
  out.kind = static_cast<weft::CollectiveKind>(c.kind);
  out.seq = c.seq;
  for (uint32_t i = 0; i < c.num_inputs; ++i) out.inputs.push_back(tensor_of(c.inputs[i]));
  for (uint32_t i = 0; i < c.num_outputs; ++i) out.outputs.push_back(tensor_of(c.outputs[i]));
  out.op = weft::ReduceOp(static_cast<weft::ReduceOp::Kind>(c.op));
  out.op.factor = c.op_factor;
  out.root = c.root;
  out.peer = c.peer;
  out.tag = c.tag;
  if (c.counts) out.counts.assign(c.counts, c.counts + size);
  if (c.send_counts) out.send_counts.assign(c.send_counts, c.send_counts + size);
  if (c.recv_counts) out.recv_counts.assign(c.recv_counts, c.recv_counts + size);
  return out;
}

// store_check=1 (see the top): throws naming the step that went wrong.
void check_store_delete(weft::Store& store, int rank) {
  const std::string key = fmt::format("forward/store_check/{}", rank);
  store.set(key, Bytes{1, 2, 3});
  if (!store.delete_key(key))
    throw Error(ErrorCode::Protocol,
                "store_check: delete_key of a key just set said it did not exist");
  if (store.delete_key(key))
    throw Error(ErrorCode::Protocol, "store_check: a second delete_key of the key said it existed");
  if (store.check({key}))
    throw Error(ErrorCode::Protocol, "store_check: check() still finds the deleted key");
}

weft_result_t forward_init(const InitArgs* args, void** context, char* error, size_t error_size) {
  if (args == nullptr || args->struct_size != sizeof(InitArgs) || context == nullptr) {
    write_error(error, error_size, "forward plugin: bad init arguments");
    return WEFT_ERR_INVALID_ARGUMENT;
  }
  try {
    weft::BackendOptions options;
    options.store = std::make_shared<TableStore>(args->store);
    options.rank = args->rank;
    options.size = args->size;
    options.group_name = args->group_name ? args->group_name : "";
    options.timeout = std::chrono::milliseconds(args->timeout_ms);
    for (int r = 0; r < args->size; ++r) options.global_ranks.push_back(args->global_ranks[r]);
    for (uint32_t i = 0; i < args->num_settings; ++i) {
      options.settings[args->setting_keys[i]] = args->setting_values[i];
    }
    if (auto it = options.settings.find("store_check"); it != options.settings.end()) {
      if (it->second == "1") check_store_delete(*options.store, args->rank);
      options.settings.erase(it);  // the plugin's own setting, not the tcp backend's
    }
    auto ctx = std::make_unique<Context>();
    ctx->backend = weft::Registry::global().find("tcp").factory(options);
    ctx->rank = args->rank;
    ctx->size = args->size;
    ctx->group = options.group_name;
    args->log(args->log_ctx, WEFT_LOG_DEBUG, "forward plugin: connected through the tcp backend");
    *context = ctx.release();
    return WEFT_SUCCESS;
  } catch (...) {
    std::string message;
    weft_result_t result = result_of(std::current_exception(), message);
    write_error(error, error_size, message);
    return result;
  }
}

weft_result_t forward_post(void* context, const weftCollective_v1_t* ops, uint32_t num,
                           weftDone_v1_t done, void* done_arg, void** request, char* error,
                           size_t error_size) {
  auto* ctx = static_cast<Context*>(context);
  try {
    std::vector<weft::Collective> collectives;
    for (uint32_t i = 0; i < num; ++i) collectives.push_back(collective_of(ops[i], ctx->size));
    if (const char* refused = std::getenv("FORWARD_UNSUPPORTED")) {
      for (const weft::Collective& c : collectives) {
        if (weft::collective_name(c.kind) == refused) {
          write_error(
              error, error_size,
              fmt::format("forward plugin: {} is not implemented (FORWARD_UNSUPPORTED)", refused));
          return WEFT_ERR_UNSUPPORTED;
        }
      }
    }
    weft::ErrorContext where{.rank = ctx->rank,
                             .size = ctx->size,
                             .group = ctx->group,
                             .op = std::string(weft::collective_name(collectives[0].kind)),
                             .seq = collectives[0].seq};
    std::shared_ptr<weft::Work> work =
        num == 1 ? ctx->backend->post(std::move(collectives[0]), where)
                 : ctx->backend->post_coalesced(std::move(collectives), where);
    if (done != nullptr) {
      work->on_complete([done, done_arg](const weft::Work& w) {
        if (w.is_success()) {
          done(done_arg, WEFT_SUCCESS, "");
          return;
        }
        std::string message;
        weft_result_t result = result_of(w.exception(), message);
        done(done_arg, result, message.c_str());
      });
      if (request != nullptr) *request = nullptr;
    } else {
      *request = new Request{std::move(work)};
    }
    return WEFT_SUCCESS;
  } catch (...) {
    std::string message;
    weft_result_t result = result_of(std::current_exception(), message);
    write_error(error, error_size, message);
    return result;
  }
}

[[maybe_unused]] weft_result_t forward_test(void*, void* request, int32_t* done, char* error,
                                            size_t error_size) {
  auto* r = static_cast<Request*>(request);
  if (!r->work->is_completed()) {
    *done = 0;
    return WEFT_SUCCESS;
  }
  *done = 1;
  if (r->work->is_success()) return WEFT_SUCCESS;
  std::string message;
  weft_result_t result = result_of(r->work->exception(), message);
  write_error(error, error_size, message);
  return result;
}

[[maybe_unused]] void forward_release(void*, void* request) {
  delete static_cast<Request*>(request);
}

void forward_abort(void* context, const char* reason) {
  static_cast<Context*>(context)->backend->abort(reason ? reason : "aborted");
}

void forward_finalize(void* context) { delete static_cast<Context*>(context); }

}  // namespace

extern "C" {

// The polling build sets `test` (and `release`); the callback build leaves them NULL.
#ifdef FORWARD_POLLING
#define FORWARD_TEST forward_test
#define FORWARD_RELEASE forward_release
#else
#define FORWARD_TEST nullptr
#define FORWARD_RELEASE nullptr
#endif

#ifdef FORWARD_V1
__attribute__((visibility("default"))) extern const weftBackendPlugin_v1_t weftBackendPlugin_v1;
const weftBackendPlugin_v1_t weftBackendPlugin_v1 = {kName,
                                                     WEFT_PLUGIN_ABI_VERSION,
                                                     sizeof(weftBackendPlugin_v1_t),
#else
__attribute__((visibility("default"))) extern const weftBackendPlugin_v2_t weftBackendPlugin_v2;
const weftBackendPlugin_v2_t weftBackendPlugin_v2 = {kName,
                                                     WEFT_PLUGIN_ABI_V2,
                                                     sizeof(weftBackendPlugin_v2_t),
#endif
                                                     1u << WEFT_DEVICE_CPU,
                                                     0,
                                                     forward_init,
                                                     forward_post,
                                                     FORWARD_TEST,
                                                     FORWARD_RELEASE,
                                                     forward_abort,
                                                     forward_finalize};

}  // extern "C"
