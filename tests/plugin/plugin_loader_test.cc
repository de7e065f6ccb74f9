// Loading backend plugins (plugin.h, Registry::resolve / load_plugin): by name through
// WEFT_PLUGIN_PATH, by path, and each way a plugin is refused, with the message it gets; then a
// process group on the forwarding plugins (callback and polling) across real processes.
//
// Meson runs each case in its own process (a loaded plugin stays registered until exit).
// WEFT_TEST_PLUGIN_DIR is the build folder holding the plugins (tests/plugin/meson.build).
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/backend.h"
#include "weft/error.h"
#include "weft/plugin.h"
#include "weft/process_group.h"

#include "tests/support/multiproc.h"

namespace weft {
namespace {

std::string plugin_dir() {
  const char* dir = std::getenv("WEFT_TEST_PLUGIN_DIR");
  REQUIRE(dir != nullptr);
  return dir;
}

std::string plugin_file(const std::string& name) {
  return plugin_dir() + "/libweft-backend-" + name + ".so";
}

// The message of the Error(InvalidArgument) that resolving `name` throws.
std::string refusal(const std::string& name) {
  try {
    Registry::global().resolve(name);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    return e.what();
  }
  FAIL("resolving " << name << " did not fail");
  return {};
}

TEST_CASE("a plugin is found by name in WEFT_PLUGIN_PATH", "[by_name]") {
  setenv("WEFT_PLUGIN_PATH", ("/nonexistent/dir:" + plugin_dir()).c_str(), 1);
  REQUIRE_FALSE(Registry::global().contains("forward"));
  Registry::Entry entry = Registry::global().resolve("forward");
  CHECK(entry.name == "forward");
  CHECK(entry.devices == std::vector<DeviceKind>{DeviceKind::Cpu});
  CHECK(Registry::global().contains("forward"));
  // The backend map resolves it the same way, and the built-ins are still there.
  auto map = parse_backend_map("cpu:forward", Registry::global());
  REQUIRE(map.size() == 1);
  CHECK(map[0].second == "forward");
  CHECK(Registry::global().contains("tcp"));
}

TEST_CASE("a plugin is loaded by path, once", "[by_path]") {
  unsetenv("WEFT_PLUGIN_PATH");
  CHECK(Registry::global().load_plugin(plugin_file("forward_poll")) == "forward_poll");
  CHECK(Registry::global().load_plugin(plugin_file("forward_poll")) == "forward_poll");
  CHECK(Registry::global().resolve(plugin_file("forward_poll")).name == "forward_poll");
  // A backend string with a '/' is a path, in a backend map too.
  // A host plugin serves cpu tensors, and cuda tensors by staging them (docs/cuda.md).
  auto map = parse_backend_map(plugin_file("forward"), Registry::global());
  REQUIRE(map.size() == 2);
  CHECK(map[0] == std::make_pair(DeviceKind::Cpu, std::string("forward")));
  CHECK(map[1] == std::make_pair(DeviceKind::Cuda, std::string("forward")));
}

TEST_CASE("a plugin of a newer ABI is refused, saying so", "[future]") {
  setenv("WEFT_PLUGIN_PATH", plugin_dir().c_str(), 1);
  std::string message = refusal("future");
  CHECK_THAT(message, Catch::Contains("libweft-backend-future.so"));
  CHECK_THAT(message, Catch::Contains("exports only weftBackendPlugin_v3, newer than this weft"));
  CHECK_FALSE(Registry::global().contains("future"));
}

TEST_CASE("a library without the plugin symbol is refused", "[no_symbol]") {
  setenv("WEFT_PLUGIN_PATH", plugin_dir().c_str(), 1);
  std::string message = refusal("nosymbol");
  CHECK_THAT(message, Catch::Contains("exports no weftBackendPlugin_vN symbol"));
}

TEST_CASE("a struct of another size is refused", "[bad_size]") {
  setenv("WEFT_PLUGIN_PATH", plugin_dir().c_str(), 1);
  std::string message = refusal("badsize");
  CHECK_THAT(message, Catch::Contains(fmt::format("has struct_size {}, this weft's plugin.h "
                                                  "defines {} bytes",
                                                  sizeof(weftBackendPlugin_v1_t) - 8,
                                                  sizeof(weftBackendPlugin_v1_t))));
}

TEST_CASE("a plugin whose own dependency is missing fails with dlopen's message", "[gone_dep]") {
  setenv("WEFT_PLUGIN_PATH", plugin_dir().c_str(), 1);
  std::string message = refusal("gonedep");
  CHECK_THAT(message, Catch::Contains("dlopen failed"));
  CHECK_THAT(message, Catch::Contains("libweft_test_gone.so"));
  // weft goes on: other backends still resolve.
  CHECK(Registry::global().resolve("forward").name == "forward");
  CHECK(Registry::global().resolve("tcp").name == "tcp");
}

TEST_CASE("an unknown backend lists the known ones and every place searched", "[unknown]") {
  setenv("WEFT_PLUGIN_PATH", "/nonexistent/a:/nonexistent/b", 1);
  std::string message = refusal("nosuch");
  CHECK_THAT(message, Catch::Contains("unknown backend \"nosuch\""));
  CHECK_THAT(message, Catch::Contains("known backends: tcp"));
  CHECK_THAT(message, Catch::Contains("/nonexistent/a/libweft-backend-nosuch.so: not there"));
  CHECK_THAT(message, Catch::Contains("/nonexistent/b/libweft-backend-nosuch.so: not there"));
  CHECK_THAT(message, Catch::Contains("weft/plugins"));
}

TEST_CASE("a refused candidate does not stop the search", "[next_candidate]") {
  // The first directory holds a broken libweft-backend-forward.so (a copy of the no-symbol
  // library), the second the real one.
  auto broken = std::filesystem::temp_directory_path() /
                fmt::format("weft-plugin-test-{}", static_cast<int>(getpid()));
  std::filesystem::create_directories(broken);
  std::filesystem::copy_file(plugin_file("nosymbol"), broken / "libweft-backend-forward.so",
                             std::filesystem::copy_options::overwrite_existing);
  setenv("WEFT_PLUGIN_PATH", (broken.string() + ":" + plugin_dir()).c_str(), 1);
  CHECK(Registry::global().resolve("forward").name == "forward");
  std::filesystem::remove_all(broken);
}

// All of the group's API runs through the plugin; tests/conformance runs the whole suite on it.
TEST_CASE("process groups on the forwarding plugins, callback and polling", "[group]") {
  const uint16_t port = test::free_port();
  const std::string dir = plugin_dir();
  test::run_ranks_ok(3, [&](int rank) {
    setenv("WEFT_PLUGIN_PATH", dir.c_str(), 1);
    ProcessGroupOptions options;
    options.url = fmt::format("tcp://127.0.0.1:{}", port);
    options.rank = rank;
    options.world_size = 3;
    options.timeout = std::chrono::seconds(20);
    options.backend = "cpu:forward";
    auto world = init_process_group(options);
    RANK_CHECK(world->backend_name() == "forward", "{}", world->backend_name());
    auto poll = world->new_group({0, 1, 2}, {.name = "polled", .backend = "forward_poll"});
    RANK_CHECK(poll->backend_name() == "forward_poll");
    for (auto* group : {world.get(), poll.get()}) {
      std::vector<float> v(1000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = float(rank * 1000 + i);
      std::vector<float> gathered(3 * v.size());
      auto a = group->all_reduce(Tensor::of(v.data(), v.size()));
      auto b = group->all_gather_into_tensor(Tensor::of(gathered.data(), gathered.size()),
                                             Tensor::of(v.data(), v.size()));
      b->wait();
      RANK_CHECK(a->is_completed());
      for (size_t i = 0; i < v.size(); ++i) {
        float sum = float(3000 + 3 * i);  // (0 + 1 + 2) * 1000 + 3i
        RANK_CHECK(v[i] == sum, "{} all_reduce[{}] = {}", group->name(), i, v[i]);
        for (int r = 0; r < 3; ++r) {
          RANK_CHECK(gathered[r * v.size() + i] == sum, "{} all_gather", group->name());
        }
      }
    }
    // abort() reaches the plugin and later work fails with Aborted.
    try {
      world->abort("test abort");
      std::vector<int32_t> x(4, 1);
      world->all_reduce(Tensor::of(x.data(), x.size()))->wait();
      throw std::runtime_error("all_reduce after abort() succeeded");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::Aborted, "{}", e.what());
    }
    poll->barrier()->wait();
  });
}

// The ABI's versioning rule: a plugin built against v1 of plugin.h (weftBackendPlugin_v1, whose
// store table has no delete_key) loads into this weft and runs; a v2 plugin's init() gets a store
// whose delete_key works on the group's keys.
TEST_CASE("a v1 plugin still loads and runs; a v2 plugin's store deletes keys", "[versions]") {
  const uint16_t port = test::free_port();
  const std::string dir = plugin_dir();
  test::run_ranks_ok(2, [&](int rank) {
    setenv("WEFT_PLUGIN_PATH", dir.c_str(), 1);
    ProcessGroupOptions options;
    options.url = fmt::format("tcp://127.0.0.1:{}", port);
    options.rank = rank;
    options.world_size = 2;
    options.timeout = std::chrono::seconds(20);
    options.backend = "cpu:forward_v1";
    auto world = init_process_group(options);
    RANK_CHECK(world->backend_name() == "forward_v1", "{}", world->backend_name());
    // v2, with the plugin's own check of delete_key in init() (forward_plugin.cc).
    auto checked = world->new_group(
        {0, 1}, {.name = "v2", .backend = "forward", .backend_settings = {{"store_check", "1"}}});
    RANK_CHECK(checked->backend_name() == "forward");
    for (auto* group : {world.get(), checked.get()}) {
      std::vector<int64_t> v(257);
      for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(rank + 1) * int64_t(i) - 7;
      group->all_reduce(Tensor::of(v.data(), v.size()))->wait();
      for (size_t i = 0; i < v.size(); ++i) {
        const int64_t expected = 3 * int64_t(i) - 14;  // (1 + 2) i - 2 * 7
        RANK_CHECK(v[i] == expected, "{} all_reduce[{}] = {}, expected {}", group->name(), i, v[i],
                   expected);
      }
    }
    // The v1 plugin's store has no delete_key: the same check fails its init() on every rank.
    try {
      world->new_group({0, 1}, {.name = "v1-check", .backend_settings = {{"store_check", "1"}}});
      throw std::runtime_error("store_check on the v1 plugin succeeded");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::Unsupported, "{}", e.what());
      RANK_CHECK(std::string_view(e.what()).find("store delete_key is not in the plugin ABI's "
                                                 "store table") != std::string_view::npos,
                 "{}", e.what());
    }
  });
}

}  // namespace
}  // namespace weft
