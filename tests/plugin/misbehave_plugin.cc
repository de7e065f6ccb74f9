// A backend plugin that breaks plugin.h's contract on purpose, one way per group, for the tests
// of how weft bounds and reports it (plugin_misbehave_test.cc). Plain C ABI, nothing of weft's
// but plugin.h. The group's backend setting "mode" picks the behaviour:
//
//   ok                  every operation completes at once (no data moves: use one rank, in place)
//   init_block          init() never returns (ignores args->timeout_ms)
//   init_fail_null      init() fails with WEFT_ERR_IO and writes no message
//   post_block          post() never returns, not even after abort()
//   post_block_abort    post() blocks until abort() is called, then fails with WEFT_ERR_ABORTED
//   post_fail_null      post() fails with WEFT_ERR_INTERNAL and writes no message
//   done_twice          post() calls done(SUCCESS) twice, then returns success
//   done_stale          post() completes its own operation, then calls done() again for the
//                       previous post()'s operation (long completed)
//   done_then_error     post() calls done(SUCCESS), then returns WEFT_ERR_INTERNAL
//   done_null           post() calls done(WEFT_ERR_INTERNAL, NULL)
//   abort_block         abort() never returns
//   finalize_block      finalize() never returns
//   test_block          (polling build) test() never returns
//   test_fail_null      (polling build) test() reports done with WEFT_ERR_IO and no message
//
// Built twice (tests/plugin/meson.build): libweft-backend-misbehave.so completes through `done`;
// with MISBEHAVE_POLLING, libweft-backend-misbehave_poll.so sets `test` and `release`.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "weft/plugin.h"

namespace {

#ifdef MISBEHAVE_POLLING
constexpr const char* kName = "misbehave_poll";
#else
constexpr const char* kName = "misbehave";
#endif

struct Context {
  std::string mode;
  std::atomic<bool> aborted{false};
  weftDone_v1_t previous_done = nullptr;  // done_stale: the last post()'s callback and argument
  void* previous_arg = nullptr;
};

struct Request {
  weft_result_t result = WEFT_SUCCESS;
};

// post_block_abort: a post() blocks until abort(); the test waits until it has returned.
// Never destroyed: a watchdog thread may still call abort() while the process exits, and a
// static mutex would be torn down under it.
struct AbortState {
  std::mutex mutex;
  std::condition_variable changed;
  int unblocked_posts = 0;  // guarded by mutex
};

AbortState& abort_state() {
  static AbortState* state = new AbortState;
  return *state;
}

// A call that never returns: what a hung plugin does.
[[noreturn]] void block_forever() {
  for (;;) pause();
}

void write_error(char* error, size_t size, const char* text) {
  if (error != nullptr && size > 0) std::snprintf(error, size, "%s", text);
}

weft_result_t misbehave_init(const weftInitArgs_v1_t* args, void** context, char* error,
                             size_t error_size) {
  auto* c = new Context;
  for (uint32_t i = 0; i < args->num_settings; ++i) {
    if (std::strcmp(args->setting_keys[i], "mode") == 0) c->mode = args->setting_values[i];
  }
  if (c->mode == "init_block") block_forever();
  if (c->mode == "init_fail_null") {
    delete c;
    if (error != nullptr && error_size > 0) error[0] = '\0';
    return WEFT_ERR_IO;
  }
  *context = c;
  return WEFT_SUCCESS;
}

weft_result_t misbehave_post(void* context, const weftCollective_v1_t*, uint32_t,
                             weftDone_v1_t done, void* done_arg, void** request, char* error,
                             size_t error_size) {
  auto* c = static_cast<Context*>(context);
  const std::string& mode = c->mode;
  if (mode == "post_block") block_forever();
  if (mode == "post_block_abort") {
    AbortState& state = abort_state();
    {
      std::unique_lock<std::mutex> lock(state.mutex);
      state.changed.wait(lock, [&] { return c->aborted.load(); });
      ++state.unblocked_posts;
    }
    state.changed.notify_all();
    write_error(error, error_size, "misbehave: post_block_abort: aborted while blocked in post()");
    return WEFT_ERR_ABORTED;
  }
  if (mode == "post_fail_null") {
    if (error != nullptr && error_size > 0) error[0] = '\0';
    return WEFT_ERR_INTERNAL;
  }
  if (done == nullptr) {  // the polling build
    *request = new Request;
    return WEFT_SUCCESS;
  }
  if (mode == "done_twice") {
    done(done_arg, WEFT_SUCCESS, "");
    done(done_arg, WEFT_SUCCESS, "");
    return WEFT_SUCCESS;
  }
  if (mode == "done_stale") {
    done(done_arg, WEFT_SUCCESS, "");
    if (c->previous_done != nullptr) c->previous_done(c->previous_arg, WEFT_SUCCESS, "");
    c->previous_done = done;
    c->previous_arg = done_arg;
    return WEFT_SUCCESS;
  }
  if (mode == "done_then_error") {
    done(done_arg, WEFT_SUCCESS, "");
    write_error(error, error_size, "misbehave: done_then_error: failing after done()");
    return WEFT_ERR_INTERNAL;
  }
  if (mode == "done_null") {
    done(done_arg, WEFT_ERR_INTERNAL, nullptr);
    return WEFT_SUCCESS;
  }
  done(done_arg, WEFT_SUCCESS, nullptr);
  return WEFT_SUCCESS;
}

[[maybe_unused]] weft_result_t misbehave_test(void* context, void* request, int32_t* done,
                                              char* error, size_t error_size) {
  auto* c = static_cast<Context*>(context);
  if (c->mode == "test_block") block_forever();
  *done = 1;
  if (c->mode == "test_fail_null") {
    if (error != nullptr && error_size > 0) error[0] = '\0';
    return WEFT_ERR_IO;
  }
  return static_cast<Request*>(request)->result;
}

[[maybe_unused]] void misbehave_release(void*, void* request) {
  delete static_cast<Request*>(request);
}

void misbehave_abort(void* context, const char*) {
  auto* c = static_cast<Context*>(context);
  if (c->mode == "abort_block") block_forever();
  AbortState& state = abort_state();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    c->aborted.store(true);
  }
  state.changed.notify_all();
}

void misbehave_finalize(void* context) {
  auto* c = static_cast<Context*>(context);
  if (c->mode == "finalize_block") block_forever();
  delete c;
}

}  // namespace

extern "C" {

// For the test: how many post() calls of mode post_block_abort have returned, once at least
// `at_least` have or after `timeout_ms`.
__attribute__((visibility("default"))) int misbehave_wait_unblocked_posts(int at_least,
                                                                          int timeout_ms) {
  AbortState& state = abort_state();
  std::unique_lock<std::mutex> lock(state.mutex);
  state.changed.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                         [&] { return state.unblocked_posts >= at_least; });
  return state.unblocked_posts;
}

#ifdef MISBEHAVE_POLLING
#define MISBEHAVE_TEST misbehave_test
#define MISBEHAVE_RELEASE misbehave_release
#else
#define MISBEHAVE_TEST nullptr
#define MISBEHAVE_RELEASE nullptr
#endif

__attribute__((visibility("default"))) extern const weftBackendPlugin_v1_t weftBackendPlugin_v1;
const weftBackendPlugin_v1_t weftBackendPlugin_v1 = {kName,
                                                     WEFT_PLUGIN_ABI_VERSION,
                                                     sizeof(weftBackendPlugin_v1_t),
                                                     1u << WEFT_DEVICE_CPU,
                                                     0,
                                                     misbehave_init,
                                                     misbehave_post,
                                                     MISBEHAVE_TEST,
                                                     MISBEHAVE_RELEASE,
                                                     misbehave_abort,
                                                     misbehave_finalize};

}  // extern "C"
