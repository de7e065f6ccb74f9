// The UCX backend as a module found by name: what a user sees when it cannot be loaded, and that
// it loads and serves "ucx" and "cpu:ucx" when it can. Cases run in this order in one process (the
// registry is process-wide): the failures first, while "ucx" is not registered yet.
//
// WEFT_TEST_UCX_DIR (set by meson) is the folder holding the built libweft-backend-ucx.so;
// meson also sets WEFT_BACKEND=ucx, which the group of one at the end takes.
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/backend.h"
#include "weft/error.h"
#include "weft/hash_store.h"
#include "weft/process_group.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the build's temporary directory, removed at the end of the case.
struct TempDir {
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "weft-ucx-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

std::string resolve_error(const std::string& name) {
  try {
    Registry::global().resolve(name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_CASE(
    "a libweft-backend-ucx.so that does not load: not available, dlopen's reason, what to install",
    "[ucx]") {
  TempDir dir;
  {
    std::ofstream out(dir.path / "libweft-backend-ucx.so");
    out << "not a shared library\n";
  }
  REQUIRE(setenv("WEFT_PLUGIN_PATH", dir.path.c_str(), 1) == 0);
  const std::string what = resolve_error("ucx");
  INFO(what);
  CHECK(what.find("backend \"ucx\" is not available: ") != std::string::npos);
  CHECK(what.find("dlopen failed") != std::string::npos);
  CHECK(what.find((dir.path / "libweft-backend-ucx.so").string()) != std::string::npos);
  CHECK(what.find("apt-get install libucx0") != std::string::npos);
  CHECK(what.find("libucx-dev") != std::string::npos);
  // The same through a backend map, as init_process_group and WEFT_BACKEND meet it.
  try {
    parse_backend_map("cpu:ucx", Registry::global());
    FAIL("cpu:ucx resolved");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("backend \"ucx\" is not available: ") != std::string::npos);
  }
  CHECK_FALSE(Registry::global().contains("ucx"));
}

TEST_CASE("no libweft-backend-ucx.so anywhere: not available, built without it", "[ucx]") {
  TempDir dir;
  REQUIRE(setenv("WEFT_PLUGIN_PATH", dir.path.c_str(), 1) == 0);
  const std::string what = resolve_error("ucx");
  if (what.empty()) {
    WARN("an installed weft's plugin folder holds libweft-backend-ucx.so: not checked here");
    return;
  }
  INFO(what);
  CHECK(what.find("backend \"ucx\" is not available: this weft was built without it") !=
        std::string::npos);
  CHECK(what.find("apt-get install libucx0") != std::string::npos);
}

TEST_CASE("the built module loads by name and serves cpu", "[ucx]") {
  const char* built = std::getenv("WEFT_TEST_UCX_DIR");
  REQUIRE(built != nullptr);
  REQUIRE(setenv("WEFT_PLUGIN_PATH", built, 1) == 0);
  const auto map = parse_backend_map("cpu:ucx", Registry::global());
  REQUIRE(map.size() == 1);
  CHECK(map[0].first == DeviceKind::Cpu);
  CHECK(map[0].second == "ucx");
  const Registry::Entry entry = Registry::global().find("ucx");
  CHECK(entry.name == "ucx");
  REQUIRE(entry.devices.size() == 1);
  CHECK(entry.devices[0] == DeviceKind::Cpu);
  // An unknown name is still an unknown backend, not "not available".
  const std::string what = resolve_error("no-such-backend");
  CHECK(what.find("unknown backend \"no-such-backend\"") != std::string::npos);
}

// A group of one's options, with the built module on WEFT_PLUGIN_PATH; no backend named.
ProcessGroupOptions group_of_one() {
  const char* built = std::getenv("WEFT_TEST_UCX_DIR");
  REQUIRE(built != nullptr);
  REQUIRE(setenv("WEFT_PLUGIN_PATH", built, 1) == 0);
  ProcessGroupOptions options;
  options.store = std::make_shared<HashStore>();
  options.rank = 0;
  options.world_size = 1;
  options.timeout = std::chrono::seconds(20);
  return options;
}

TEST_CASE("a group of one over WEFT_BACKEND=ucx runs collectives", "[ucx]") {
  // meson sets WEFT_BACKEND=ucx for this program; the options name no backend.
  auto pg = init_process_group(group_of_one());
  CHECK(pg->backend_name() == "ucx");
  std::vector<int32_t> x = {1, -2, 3, 1 << 30};
  const std::vector<int32_t> expected = x;
  pg->all_reduce(Tensor::of(x.data(), x.size()))->wait();
  CHECK(x == expected);
  std::vector<float> gathered(3, -1.0f);
  float mine = 2.5f;
  pg->all_gather_into_tensor(Tensor::of(gathered.data(), 1), Tensor::of(&mine, 1))->wait();
  CHECK(gathered[0] == 2.5f);
  CHECK(gathered[1] == -1.0f);
  pg->barrier()->wait();
}

// A group of one over ucx with `settings`; UCX_TLS as given ("" unsets it).
std::shared_ptr<ProcessGroup> ucx_group_of_one(std::map<std::string, std::string> settings,
                                               const char* tls) {
  if (*tls == '\0') {
    REQUIRE(unsetenv("UCX_TLS") == 0);
  } else {
    REQUIRE(setenv("UCX_TLS", tls, 1) == 0);
  }
  ProcessGroupOptions options = group_of_one();
  options.backend = "ucx";
  options.backend_settings = std::move(settings);
  auto pg = init_process_group(options);
  REQUIRE(unsetenv("UCX_TLS") == 0);
  return pg;
}

// allocate_symmetric's Unsupported message, or "" when it succeeds.
std::string symmetric_refusal(ProcessGroup& pg) {
  try {
    auto buffer = pg.allocate_symmetric(4096);
    REQUIRE(buffer != nullptr);
    return "";
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Unsupported);
    return e.what();
  }
}

TEST_CASE("host memory over ucx: on by default, off by setting or by UCX_TLS, bad values refused",
          "[ucx]") {
  // On: symmetric buffers (and the bounce region, shared slots) come with it.
  auto pg = ucx_group_of_one({}, "");
  CHECK(symmetric_refusal(*pg) == "");
  pg = ucx_group_of_one({{"host_memory", "1"}}, "tcp");  // forced on over UCX_TLS=tcp
  CHECK(symmetric_refusal(*pg) == "");
  pg = ucx_group_of_one({}, "^tcp");
  CHECK(symmetric_refusal(*pg) == "");
  // Off: the group says why.
  pg = ucx_group_of_one({{"host_memory", "0"}}, "");
  std::string why = symmetric_refusal(*pg);
  CHECK(why.find("host memory is off for this group (the setting host_memory=0)") !=
        std::string::npos);
  pg = ucx_group_of_one({}, "tcp");
  why = symmetric_refusal(*pg);
  CHECK(why.find("UCX_TLS=\"tcp\" rules out shared memory") != std::string::npos);
  pg = ucx_group_of_one({}, "^posix,sysv,cma");
  why = symmetric_refusal(*pg);
  CHECK(why.find("rules out shared memory") != std::string::npos);
  // Collectives run either way.
  int64_t x = 7;
  pg->all_reduce(Tensor::of(&x, 1))->wait();
  CHECK(x == 7);
  pg.reset();
  try {
    ucx_group_of_one({{"host_memory", "sometimes"}}, "");
    FAIL("host_memory=sometimes was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find(
              "the setting host_memory=\"sometimes\": expected 0, 1 or auto") != std::string::npos);
  }
}

}  // namespace
}  // namespace weft
