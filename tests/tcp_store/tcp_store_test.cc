// TCPStore against weft's TcpStoreServer, in process on 127.0.0.1 (port 0): the Store contract
// (tests/store/store_contract.h) and what only a networked store has: waits parked on the server,
// the CANCEL_WAIT race, a server dying mid-wait, authentication, many threads on one connection
// and many processes on one server.
#include "weft/tcp_store.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/hash_store.h"
#include "weft/prefix_store.h"
#include "weft/tcp_store_server.h"

#include "tests/store/store_contract.h"
#include "tests/support/multiproc.h"

namespace weft {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TcpStoreServerOptions server_options(std::string token = "") {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.token = std::move(token);
  return options;
}

TCPStoreOptions client_options(uint16_t port, std::string token = "") {
  return {.host = "127.0.0.1", .port = port, .timeout = 10s, .token = std::move(token)};
}

// One fresh server per test; client() connects a new TCPStore to it.
struct TcpStoreFixture {
  TcpStoreServer server{server_options()};
  std::shared_ptr<Store> client() {
    return std::make_shared<TCPStore>(client_options(server.port()));
  }
};

// Waits (bounded) until the server holds `count` parked WAITs: proof that a client is blocked
// server-side rather than polling, and the moment to wake it.
void await_parked(const TcpStoreServer& server, size_t count) {
  auto deadline = Clock::now() + 10s;
  while (server.stats().parked_waits < count) {
    REQUIRE(Clock::now() < deadline);
    std::this_thread::yield();
  }
}

template <typename F>
Error thrown_by(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no weft::Error was thrown");
  throw std::logic_error("unreachable");
}

}  // namespace

WEFT_STORE_CONTRACT_TESTS(TcpStoreFixture, "TCPStore", "[tcp_store][threaded]")
// Two of weft's input rules apply to the client itself; the third (add on a non-integer is
// InvalidArgument) cannot: the server sees the value, and it closes the connection instead.
WEFT_STORE_CONTRACT_TEST(TcpStoreFixture, "TCPStore", "[tcp_store]", zero_and_negative_timeouts,
                         "a zero timeout looks once and a negative one is InvalidArgument")
WEFT_STORE_CONTRACT_TEST(TcpStoreFixture, "TCPStore", "[tcp_store]", multi_set_refuses_mismatch,
                         "multi_set with fewer values than keys throws and sets nothing")

namespace {

TEST_CASE("TCPStore names the local address it reaches the server by; wrappers pass it on",
          "[tcp_store]") {
  // What the tcp backend publishes so that peers on other hosts reach this rank.
  TcpStoreFixture f;
  auto store = f.client();
  CHECK(store->local_address() == "127.0.0.1");
  PrefixStore prefixed("group", store);
  CHECK(prefixed.local_address() == "127.0.0.1");
  CHECK(HashStore().local_address().empty());
}

TEST_CASE("TCPStore get parks a WAIT on the server and returns when another client sets the key",
          "[tcp_store][threaded]") {
  TcpStoreFixture f;
  TCPStore reader(client_options(f.server.port()));
  TCPStore writer(client_options(f.server.port()));
  auto got = std::async(std::launch::async, [&] { return reader.get_string("late", 10s); });
  await_parked(f.server, 1);
  writer.set("late", std::string_view("value"));
  CHECK(got.get() == "value");
  CHECK(f.server.stats().parked_waits == 0);
}

TEST_CASE("TCPStore stays in step when keys are set right around the wait's timeout",
          "[tcp_store][threaded]") {
  TcpStoreFixture f;
  TCPStore waiter(client_options(f.server.port()));
  TCPStore setter(client_options(f.server.port()));
  int timed_out = 0;
  constexpr int kIterations = 200;
  for (int i = 0; i < kIterations; ++i) {
    std::string key = fmt::format("race_{}", i);
    // The set lands 0 to ~40 round trips after the WAIT went out, spread across the 1 ms
    // timeout, so that some waits succeed, some time out, and some see both replies.
    std::thread racer([&] {
      for (int k = 0; k < i % 40; ++k) setter.ping();
      setter.set(key, std::string_view(key));
    });
    try {
      waiter.wait({key}, 1ms);
    } catch (const Error& e) {
      REQUIRE(e.code() == ErrorCode::Timeout);
      ++timed_out;
    }
    racer.join();
    // The next exchange reads its own reply, not a leftover STOP_WAITING or WAIT_CANCELED.
    REQUIRE(waiter.get_string(key, 10s) == key);
  }
  INFO(timed_out << " of " << kIterations << " waits timed out");
  CHECK(f.server.stats().parked_waits == 0);
}

TEST_CASE("TCPStore wait timeout names the keys as written, the server and the timeout",
          "[tcp_store]") {
  TcpStoreFixture f;
  TCPStore store(client_options(f.server.port()));
  store.set("present", std::string_view("1"));
  auto start = Clock::now();
  auto e = thrown_by([&] { store.wait({"present", "absent/a", "absent/b"}, 150ms); });
  CHECK(Clock::now() - start >= 150ms);
  CHECK(e.code() == ErrorCode::Timeout);
  std::string what = e.what();
  INFO(what);
  CHECK_THAT(what, Catch::Contains(fmt::format("store 127.0.0.1:{} wait", f.server.port())));
  CHECK_THAT(what, Catch::Contains("150 ms"));
  CHECK_THAT(what, Catch::Contains("(missing: keys \"absent/a\", \"absent/b\")"));
  CHECK_THAT(what, !Catch::Contains("\"/absent"));
  CHECK(store.get_string("present") == "1");
}

TEST_CASE("TCPStore blocking queue_pop is woken by another client's push",
          "[tcp_store][threaded]") {
  TcpStoreFixture f;
  TCPStore popper(client_options(f.server.port()));
  TCPStore pusher(client_options(f.server.port()));
  auto got =
      std::async(std::launch::async, [&] { return to_string(popper.queue_pop("q", true, 10s)); });
  await_parked(f.server, 1);
  pusher.queue_push("q", to_bytes("first"));
  pusher.queue_push("q", to_bytes("second"));
  CHECK(got.get() == "first");
  CHECK(popper.queue_len("q") == 1);
  CHECK(to_string(popper.queue_pop("q", false)) == "second");
}

TEST_CASE("TCPStore: 8 processes pass 5 barriers built on add and wait, in order",
          "[tcp_store][multiproc][threaded]") {
  constexpr int kRanks = 8;
  constexpr int kRounds = 5;
  const uint16_t port = test::free_port();
  test::run_ranks_ok(
      kRanks,
      [port](int rank) {
        // The server lives in rank 0's process (a TcpStoreServer must not cross a fork).
        std::unique_ptr<TcpStoreServer> server;
        if (rank == 0) {
          auto options = server_options();
          options.port = port;
          server = std::make_unique<TcpStoreServer>(options);
        }
        TCPStore store(client_options(port));
        for (int round = 0; round < kRounds; ++round) {
          store.set(fmt::format("arrived/{}/{}", round, rank), std::string_view("1"));
          int64_t count = store.add(fmt::format("barrier/{}", round), 1);
          RANK_CHECK(count >= 1 && count <= kRanks, "count {}", count);
          if (count == kRanks)
            store.set(fmt::format("barrier/{}/open", round), std::string_view(""));
          store.wait({fmt::format("barrier/{}/open", round)}, 30s);
          // Past the barrier, every rank has arrived at this round.
          std::vector<std::string> arrived;
          for (int r = 0; r < kRanks; ++r)
            arrived.push_back(fmt::format("arrived/{}/{}", round, r));
          RANK_CHECK(store.check(arrived), "round {}: a rank passed before all arrived", round);
          RANK_CHECK(store.get_string(fmt::format("barrier/{}", round)) == std::to_string(kRanks));
        }
        // Rank 0 keeps the server up until every rank is done with it.
        if (store.add("done", 1) == kRanks) store.set("all done", std::string_view(""));
        if (rank == 0) store.wait({"all done"}, 30s);
      },
      60s);
}

TEST_CASE("TCPStore: 8 threads sharing one client get their own replies", "[tcp_store][threaded]") {
  TcpStoreFixture f;
  TCPStore store(client_options(f.server.port()));
  constexpr int kThreads = 8;
  constexpr int kOps = 200;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        std::string key = fmt::format("t{}/{}", t, i);
        store.set(key, std::string_view(key));
        if (store.get_string(key) != key) ++wrong;
        store.add("total", 1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(wrong == 0);
  CHECK(store.get_string("total") == std::to_string(kThreads * kOps));
}

TEST_CASE("TCPStore round-trips values of 0 bytes and of 8 MiB, the server's limit",
          "[tcp_store]") {
  TcpStoreFixture f;
  TCPStore store(client_options(f.server.port()));
  Bytes big = test::store_contract::pattern(8 << 20, 11);
  store.set("empty", Bytes{});
  store.set("big", big);
  CHECK(store.get("empty").empty());
  CHECK(store.get("big") == big);
  CHECK(store.multi_get({"big", "empty"}) == std::vector<Bytes>{big, Bytes{}});
}

TEST_CASE("TCPStore fails a pending get with PeerLost naming the server when it stops",
          "[tcp_store][threaded]") {
  auto server = std::make_unique<TcpStoreServer>(server_options());
  const uint16_t port = server->port();
  TCPStore store(client_options(port));
  auto got =
      std::async(std::launch::async, [&] { return thrown_by([&] { store.get("k", 30s); }); });
  await_parked(*server, 1);
  auto start = Clock::now();
  server->stop();
  Error e = got.get();
  CHECK(Clock::now() - start < 5s);
  CHECK(e.code() == ErrorCode::PeerLost);
  CHECK_THAT(e.what(), Catch::Contains(fmt::format("127.0.0.1:{}", port)));
  // Later calls fail at once with the same code.
  CHECK(thrown_by([&] { store.num_keys(); }).code() == ErrorCode::PeerLost);
}

TEST_CASE("TCPStore with the server's token works; a wrong or missing one is refused",
          "[tcp_store][auth]") {
  TcpStoreServer server(server_options("s3cret"));
  TCPStore good(client_options(server.port(), "s3cret"));
  good.set("k", std::string_view("v"));
  CHECK(good.get_string("k") == "v");

  auto wrong = thrown_by([&] { TCPStore store(client_options(server.port(), "guess")); });
  CHECK(wrong.code() == ErrorCode::InvalidArgument);
  CHECK_THAT(wrong.what(), Catch::Contains("refused the token"));

  auto missing = thrown_by([&] { TCPStore store(client_options(server.port(), "")); });
  CHECK(missing.code() == ErrorCode::PeerLost);
  CHECK_THAT(missing.what(), Catch::Contains("WEFT_STORE_TOKEN"));
  // The refusals did not disturb the authenticated client.
  CHECK(good.get_string("k") == "v");
}

}  // namespace
}  // namespace weft
