// A plugin that breaks its contract (tests/plugin/misbehave_plugin.cc, one way per group) must
// cost the program a clear error, bounded by the group's timeout, never a hang or a crash:
//
//   - a call that never returns (init, post, test, abort, finalize): Error(Timeout) or a logged
//     error naming the plugin and the call, within about the group's timeout;
//   - done() called twice, or done() and then a failure from post(): an Internal error in the
//     log naming the plugin and the operation; the operation keeps its first result;
//   - a failure without a message: a message naming the plugin, the call and the code;
//   - a FIFO (or any file that is not a regular one) where a plugin is looked for: refused
//     without opening it.
//
// Each case is a one-rank group in this process over a HashStore (no peers needed: the plugin
// does no communication), with a short timeout. Meson runs each case in a process of its own
// (plugin_misbehave_* in tests/plugin/meson.build); WEFT_TEST_PLUGIN_DIR is the plugins' folder.
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/backend.h"
#include "weft/error.h"
#include "weft/hash_store.h"
#include "weft/process_group.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{300};

std::string plugin_dir() {
  const char* dir = std::getenv("WEFT_TEST_PLUGIN_DIR");
  REQUIRE(dir != nullptr);
  return dir;
}

// Sends this process's stderr (weft's log) to a file until text() or the destructor.
class CaptureStderr {
 public:
  CaptureStderr() {
    path_ = (std::filesystem::temp_directory_path() /
             fmt::format("weft-misbehave-{}.log", static_cast<int>(getpid())))
                .string();
    std::fflush(stderr);
    saved_ = dup(2);
    int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    dup2(fd, 2);
    close(fd);
  }
  ~CaptureStderr() {
    restore();
    std::filesystem::remove(path_);
  }
  // Everything logged so far (restores stderr, and echoes it there for the test's log).
  std::string text() {
    restore();
    std::ifstream in(path_);
    std::stringstream all;
    all << in.rdbuf();
    std::fprintf(stderr, "%s", all.str().c_str());
    return all.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

std::shared_ptr<ProcessGroup> group(const std::string& mode, const std::string& backend) {
  setenv("WEFT_PLUGIN_PATH", plugin_dir().c_str(), 1);
  ProcessGroupOptions options;
  options.store = std::make_shared<HashStore>();
  options.rank = 0;
  options.world_size = 1;
  options.timeout = kTimeout;
  options.backend = "cpu:" + backend;
  options.backend_settings = {{"mode", mode}};
  return init_process_group(options);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The error `work` fails with (it must fail).
Error failure(const std::shared_ptr<Work>& work) {
  try {
    work->wait();
  } catch (const Error& e) {
    return e;
  }
  FAIL("the operation succeeded");
  return Error(ErrorCode::Protocol, "unreachable");
}

std::shared_ptr<Work> all_reduce(ProcessGroup& g, float& x) {
  return g.all_reduce(Tensor::of(&x, 1));
}

// ---- Calls that never return.

TEST_CASE("an init() that never returns fails the group with Timeout", "[init_block]") {
  const std::string backend = GENERATE(as<std::string>{}, "misbehave", "misbehave_poll");
  CaptureStderr log;
  const auto start = Clock::now();
  try {
    group("init_block", backend);
    FAIL("init_process_group succeeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Timeout);
    CHECK_THAT(e.what(), Catch::Contains("rank 0/1 group \"world\" plugin " + backend + " init"));
    CHECK_THAT(e.what(), Catch::Contains("did not return from init() within"));
  }
  // The group's timeout plus init's margin (1 s), and some slack for a loaded machine.
  CHECK(seconds_since(start) < 4.0);
  CHECK_THAT(log.text(), Catch::Contains("init() has not returned"));
}

void check_post_block(const std::string& backend) {
  CaptureStderr log;
  auto world = group("post_block", backend);
  float a = 1, b = 2, c = 3;
  auto first = all_reduce(*world, a);
  auto second = all_reduce(*world, b);  // queued behind the stuck one
  const Error stuck = failure(first);
  CHECK(stuck.code() == ErrorCode::Timeout);
  CHECK_THAT(stuck.what(),
             Catch::StartsWith("rank 0/1 group \"world\" all_reduce #1 (float32 x 1, sum)"));
  CHECK_THAT(stuck.what(), Catch::Contains(fmt::format(
                               "plugin {} has not returned from post() of all_reduce #1 within "
                               "300 ms (the group's timeout)",
                               backend)));
  // (The message says the watchdog failed it, at the timeout: the Work's own wait() would have
  // given up only at the timeout + 1 s, saying no more than "did not complete".)
  const Error queued = failure(second);
  CHECK(queued.code() == ErrorCode::Timeout);
  CHECK_THAT(queued.what(), Catch::StartsWith("rank 0/1 group \"world\" all_reduce #2"));
  CHECK_THAT(queued.what(), Catch::Contains("cannot complete: plugin"));
  // Later operations fail at once (waiting, they would take the timeout + 1 s).
  const auto later_start = Clock::now();
  const Error later = failure(all_reduce(*world, c));
  CHECK(later.code() == ErrorCode::Timeout);
  CHECK_THAT(later.what(), Catch::Contains("weft gave up on the plugin"));
  CHECK(seconds_since(later_start) < 1.0);
  // Destroying the group does not wait for the stuck call.
  const auto destroy_start = Clock::now();
  world.reset();
  CHECK(seconds_since(destroy_start) < 2.0);
  const std::string text = log.text();
  CHECK_THAT(text, Catch::Contains("Timeout: plugin " + backend +
                                   " has not returned from post() of all_reduce #1"));
  CHECK_THAT(text, Catch::Contains("the plugin's context is not finalized"));
}

TEST_CASE(
    "a post() that never returns fails its operation with Timeout, and the group's later "
    "ones at once",
    "[post_block]") {
  check_post_block("misbehave");
}

TEST_CASE("a polling plugin's post() that never returns is bounded the same way",
          "[post_block_poll]") {
  check_post_block("misbehave_poll");
}

TEST_CASE("a post() that returns only after weft gave up on it and aborted it", "[post_late]") {
  CaptureStderr log;
  auto world = group("post_block_abort", "misbehave");
  float a = 1;
  const Error stuck = failure(all_reduce(*world, a));
  CHECK(stuck.code() == ErrorCode::Timeout);
  // abort() (called by the watchdog) lets post() return with a failure, for an operation weft has
  // already failed: nothing is completed twice, nothing crashes. Wait for that return.
  void* handle =
      dlopen((plugin_dir() + "/libweft-backend-misbehave.so").c_str(), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(handle != nullptr);
  auto wait_unblocked =
      reinterpret_cast<int (*)(int, int)>(dlsym(handle, "misbehave_wait_unblocked_posts"));
  REQUIRE(wait_unblocked != nullptr);
  CHECK(wait_unblocked(1, 10000) == 1);
  dlclose(handle);
  float b = 2;
  CHECK(failure(all_reduce(*world, b)).code() == ErrorCode::Timeout);
  world.reset();
  CHECK_THAT(log.text(), Catch::Contains("has not returned from post() of all_reduce #1"));
}

TEST_CASE("a test() that never returns fails its operation with Timeout", "[test_block]") {
  CaptureStderr log;
  auto world = group("test_block", "misbehave_poll");
  float a = 1;
  const Error stuck = failure(all_reduce(*world, a));
  CHECK(stuck.code() == ErrorCode::Timeout);
  CHECK_THAT(stuck.what(), Catch::Contains("plugin misbehave_poll has not returned from test() "
                                           "of all_reduce #1 within 300 ms"));
  world.reset();
  log.text();
}

TEST_CASE("an abort() that never returns is left behind after the group's timeout",
          "[abort_block]") {
  CaptureStderr log;
  auto world = group("abort_block", "misbehave");
  float a = 1;
  all_reduce(*world, a)->wait();
  // abort() waits the group's timeout for the plugin's, then gives up on it.
  const auto start = Clock::now();
  world->abort("test abort");
  CHECK(seconds_since(start) < 2.0);
  CHECK(failure(all_reduce(*world, a)).code() == ErrorCode::Aborted);
  const auto destroy_start = Clock::now();
  world.reset();
  CHECK(seconds_since(destroy_start) < 2.0);
  CHECK_THAT(log.text(),
             Catch::Contains("plugin misbehave has not returned from abort() within 300 ms"));
}

TEST_CASE("a finalize() that never returns is left behind after the group's timeout",
          "[finalize_block]") {
  CaptureStderr log;
  auto world = group("finalize_block", "misbehave");
  float a = 1;
  all_reduce(*world, a)->wait();
  // Destroying the group waits the group's timeout for finalize(), then leaves it.
  const auto start = Clock::now();
  world.reset();
  CHECK(seconds_since(start) < 2.0);
  CHECK_THAT(log.text(), Catch::Contains("plugin misbehave: Timeout: finalize() has not returned "
                                         "within 300 ms"));
}

// ---- Broken completion.

TEST_CASE("done() called twice is logged as the plugin's Internal error, not a crash",
          "[done_twice]") {
  CaptureStderr log;
  auto world = group("done_twice", "misbehave");
  float a = 1;
  for (int i = 0; i < 3; ++i) all_reduce(*world, a)->wait();
  world.reset();
  const std::string text = log.text();
  CHECK_THAT(text, Catch::Contains("rank 0/1 group \"world\": Internal: plugin misbehave broke "
                                   "its contract (plugin.h): done() was called twice for "
                                   "all_reduce #1"));
  CHECK_THAT(text, Catch::Contains("done() was called twice for all_reduce #3"));
}

TEST_CASE("done() for an operation long completed is logged, not a use after free",
          "[done_stale]") {
  CaptureStderr log;
  auto world = group("done_stale", "misbehave");
  float a = 1;
  for (int i = 0; i < 3; ++i) all_reduce(*world, a)->wait();
  world.reset();
  const std::string text = log.text();
  CHECK_THAT(text, Catch::Contains("Internal: plugin misbehave broke its contract (plugin.h): "
                                   "done() was called for all_reduce #1, which had already "
                                   "completed"));
  CHECK_THAT(text, Catch::Contains("done() was called for all_reduce #2, which had already "
                                   "completed"));
}

TEST_CASE("done(SUCCESS) and then a failure from post() is logged; the operation succeeded",
          "[done_then_error]") {
  CaptureStderr log;
  auto world = group("done_then_error", "misbehave");
  float a = 1;
  for (int i = 0; i < 2; ++i) all_reduce(*world, a)->wait();  // done()'s result stands
  world.reset();
  CHECK_THAT(log.text(),
             Catch::Contains("Internal: plugin misbehave broke its contract (plugin.h): post() of "
                             "all_reduce #1 returned WEFT_ERR_INTERNAL (9) (misbehave: "
                             "done_then_error: failing after done()) after calling done() for "
                             "it"));
}

// ---- Failures without a message.

TEST_CASE("a failure without a message names the plugin, the call and the code", "[no_message]") {
  float a = 1;
  {
    const Error e = failure(all_reduce(*group("done_null", "misbehave"), a));
    CHECK(e.code() == ErrorCode::Protocol);
    CHECK_THAT(e.what(), Catch::EndsWith("Protocol: plugin misbehave failed done() with "
                                         "WEFT_ERR_INTERNAL (9) and gave no message"));
  }
  {
    const Error e = failure(all_reduce(*group("post_fail_null", "misbehave"), a));
    CHECK(e.code() == ErrorCode::Protocol);
    CHECK_THAT(e.what(), Catch::EndsWith("plugin misbehave failed post() with "
                                         "WEFT_ERR_INTERNAL (9) and gave no message"));
  }
  {
    const Error e = failure(all_reduce(*group("test_fail_null", "misbehave_poll"), a));
    CHECK(e.code() == ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::EndsWith("Io: plugin misbehave_poll failed test() with "
                                         "WEFT_ERR_IO (8) and gave no message"));
  }
  try {
    group("init_fail_null", "misbehave");
    FAIL("init_process_group succeeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::EndsWith("plugin misbehave init: Io: plugin misbehave failed "
                                         "init() with WEFT_ERR_IO (8) and gave no message"));
  }
}

// ---- Files that are not plugins.

// Resolves `name` on a thread of its own, so that a hang fails the test instead of stopping it.
std::string resolve_refusal(const std::string& name) {
  auto future = std::async(std::launch::async, [name]() -> std::string {
    try {
      Registry::global().resolve(name);
    } catch (const Error& e) {
      return e.what();
    }
    return "resolved";
  });
  if (future.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    std::fprintf(stderr, "resolving %s hangs\n", name.c_str());
    std::_Exit(1);
  }
  return future.get();
}

TEST_CASE("a FIFO or a directory named like a plugin is refused without opening it", "[fifo]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("weft-plugin-fifo-{}", static_cast<int>(getpid()));
  std::filesystem::create_directories(dir);
  REQUIRE(mkfifo((dir / "libweft-backend-fifo.so").c_str(), 0600) == 0);
  REQUIRE(mkfifo((dir / "libweft-backend-forward.so").c_str(), 0600) == 0);
  std::filesystem::create_directories(dir / "libweft-backend-adir.so");
  setenv("WEFT_PLUGIN_PATH", (dir.string() + ":" + plugin_dir()).c_str(), 1);

  std::string message = resolve_refusal("fifo");
  CHECK_THAT(message, Catch::Contains("unknown backend \"fifo\""));
  CHECK_THAT(message, Catch::Contains((dir / "libweft-backend-fifo.so").string() +
                                      ": a FIFO, not a regular file: refused without opening it"));
  message = resolve_refusal("adir");
  CHECK_THAT(message, Catch::Contains("libweft-backend-adir.so: a directory, not a regular file"));
  // As a path, the same.
  message = resolve_refusal((dir / "libweft-backend-fifo.so").string());
  CHECK_THAT(message, Catch::Contains("a FIFO, not a regular file"));
  // A FIFO ahead of the real plugin does not stop the search.
  CHECK(resolve_refusal("forward") == "resolved");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace weft
