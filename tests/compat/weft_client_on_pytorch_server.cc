// weft's TCPStore client against PyTorch 2.x's TCPStore server (tests/compat/
// weft_client_on_pytorch_server.sh starts the server in the PyTorch chroot and runs this).
//
// Usage: weft_client_on_pytorch_server PORT
// Runs every operation the classic PyTorch server supports (it has no queues) and checks each
// result against the value c10d's semantics give, then writes values for the PyTorch side to read
// back and reads back what it wrote. Exits 0 when every check passed, 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/tcp_store.h"

namespace {

using weft::Bytes;
using weft::to_bytes;

int failures = 0;

#define EXPECT(cond, ...)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      ++failures;                                                                      \
      std::fprintf(stderr, "%s:%d: EXPECT(%s) failed %s\n", __FILE__, __LINE__, #cond, \
                   fmt::format("" __VA_ARGS__).c_str());                               \
    }                                                                                  \
  } while (0)

weft::TCPStore connect(uint16_t port, std::optional<std::string> token = std::string()) {
  return weft::TCPStore({.host = "127.0.0.1",
                         .port = port,
                         .timeout = std::chrono::seconds(30),
                         .token = std::move(token)});
}

Bytes pattern(size_t size, int seed) {
  Bytes b(size);
  for (size_t i = 0; i < size; ++i) b[i] = static_cast<uint8_t>((i * 131 + seed) & 0xff);
  return b;
}

void check_operations(weft::TCPStore& store, uint16_t port) {
  using namespace std::chrono_literals;
  EXPECT(store.ping().count() > 0);

  store.set("c/a", "alpha");
  EXPECT(store.get_string("c/a") == "alpha");
  store.set("c/a", "beta");
  EXPECT(store.get_string("c/a") == "beta", "overwrite");

  EXPECT(store.add("c/n", 5) == 5);
  EXPECT(store.add("c/n", -12) == -7);
  EXPECT(store.get_string("c/n") == "-7", "add stores decimal text, got {}",
         store.get_string("c/n"));

  // compare_set's three cases.
  EXPECT(weft::to_string(store.compare_set("c/cas_new", {}, to_bytes("v1"))) == "v1");
  EXPECT(store.get_string("c/cas_new") == "v1");
  EXPECT(weft::to_string(store.compare_set("c/cas_absent", to_bytes("x"), to_bytes("y"))) == "x");
  EXPECT(!store.check({"c/cas_absent"}), "absent key with non-empty expected stores nothing");
  EXPECT(weft::to_string(store.compare_set("c/cas_new", to_bytes("v1"), to_bytes("v2"))) == "v2");
  EXPECT(weft::to_string(store.compare_set("c/cas_new", to_bytes("zz"), to_bytes("v3"))) == "v2");

  EXPECT(store.check({"c/a", "c/n"}));
  EXPECT(!store.check({"c/a", "c/missing"}));

  EXPECT(store.delete_key("c/a"));
  EXPECT(!store.delete_key("c/a"));
  EXPECT(!store.check({"c/a"}));

  int64_t before = store.num_keys();
  store.set("c/count_me", "1");
  EXPECT(store.num_keys() == before + 1, "{} then {}", before, store.num_keys());

  store.append("c/app", to_bytes("ab"));
  store.append("c/app", to_bytes("cd"));
  EXPECT(store.get_string("c/app") == "abcd");

  store.multi_set({"c/m1", "c/m2", "c/m3"}, {to_bytes("1"), {}, pattern(1000, 3)});
  auto values = store.multi_get({"c/m3", "c/m1", "c/m2"});
  EXPECT(values.size() == 3 && values[0] == pattern(1000, 3) && weft::to_string(values[1]) == "1" &&
         values[2].empty());

  store.set("c/empty", Bytes{});
  EXPECT(store.get("c/empty").empty());
  auto big = pattern(8 << 20, 7);
  store.set("c/big", big);
  EXPECT(store.get("c/big") == big, "8 MiB value round trip");

  // A wait that times out names the key as the user wrote it, and leaves the store usable.
  try {
    store.get("c/never", 200ms);
    EXPECT(false, "get of a missing key returned");
  } catch (const weft::Error& e) {
    std::string what = e.what();
    EXPECT(e.code() == weft::ErrorCode::Timeout, "{}", what);
    EXPECT(what.find("\"c/never\"") != std::string::npos, "{}", what);
    EXPECT(what.find("\"/c/never\"") == std::string::npos, "{}", what);
    EXPECT(what.find(fmt::format("127.0.0.1:{}", port)) != std::string::npos, "{}", what);
  }
  EXPECT(store.get_string("c/empty").empty(), "store usable after a wait timeout");

  // A key set by another client while this one waits.
  auto other = connect(port);
  std::thread setter([&] {
    other.wait({"c/go"});
    other.set("c/late", "arrived");
  });
  store.set("c/go", "1");
  EXPECT(store.get_string("c/late", 10s) == "arrived");
  setter.join();

  // CANCEL_WAIT racing a set: every outcome must leave the connection in step.
  for (int i = 0; i < 30; ++i) {
    std::string key = fmt::format("c/race_{}", i);
    std::thread racer([&] { other.set(key, "x"); });
    try {
      store.wait({key}, std::chrono::milliseconds(i % 3));
    } catch (const weft::Error& e) {
      EXPECT(e.code() == weft::ErrorCode::Timeout, "{}", e.what());
    }
    racer.join();
    EXPECT(store.get_string(key) == "x", "iteration {}", i);
  }

  // weft's authentication extension: PyTorch's server drops the connection at AUTH_CHALLENGE.
  try {
    auto with_token = connect(port, std::string("secret"));
    EXPECT(false, "a token was accepted by PyTorch's server");
  } catch (const weft::Error& e) {
    std::string what = e.what();
    EXPECT(what.find("authentication") != std::string::npos, "{}", what);
  }
}

void check_interop(weft::TCPStore& store) {
  using namespace std::chrono_literals;
  store.set("weft/text", "written by weft");
  Bytes binary;
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 256; ++i) binary.push_back(static_cast<uint8_t>(i));
  store.set("weft/binary", binary);
  store.set("weft/empty", Bytes{});
  store.add("weft/counter", 40);
  store.add("weft/counter", 2);
  store.append("weft/appended", to_bytes("abc"));
  store.append("weft/appended", to_bytes("def"));
  store.multi_set({"weft/multi_1", "weft/multi_2"}, {to_bytes("one"), to_bytes("two")});
  store.set("weft/cas", "old");
  store.set("weft/deleted", "x");
  store.delete_key("weft/deleted");
  store.set("weft/done", "1");

  store.wait({"torch/done"}, 30s);
  EXPECT(store.get_string("torch/text") == "written by pytorch");
  Bytes reversed;
  for (int r = 0; r < 3; ++r)
    for (int i = 255; i >= 0; --i) reversed.push_back(static_cast<uint8_t>(i));
  EXPECT(store.get("torch/binary") == reversed);
  EXPECT(store.get("torch/empty").empty());
  EXPECT(store.get_string("torch/counter") == "5");
  EXPECT(store.add("torch/counter", 1) == 6);
  EXPECT(store.get_string("torch/appended") == "xyz");
  auto multi = store.multi_get({"torch/multi_1", "torch/multi_2"});
  EXPECT(multi.size() == 2 && weft::to_string(multi[0]) == "uno" &&
         weft::to_string(multi[1]) == "dos");
  store.set("weft/verified", "1");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PORT\n", argv[0]);
    return 2;
  }
  auto port = static_cast<uint16_t>(std::atoi(argv[1]));
  try {
    auto store = connect(port);
    check_operations(store, port);
    check_interop(store);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft side: unexpected exception: %s\n", e.what());
    return 1;
  }
  if (failures > 0) {
    std::fprintf(stderr, "weft side: %d checks failed\n", failures);
    return 1;
  }
  std::printf("weft side: all checks passed\n");
  return 0;
}
