// Hostile and broken clients: each gets its connection closed (counted in closed_for_violation)
// while the server stays up, keeps serving others, and holds bounded memory.
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/tcp_store_server.h"

#include "runtime/store_protocol.h"
#include "tests/store_protocol/raw_client.h"
#include "tests/support/multiproc.h"

namespace weft::test {
namespace {

constexpr uint8_t SET = 1, GET = 3, WAIT = 6, MULTI_SET = 11, PING = 13;
// stats() is published just before replies are sent, so the last probe's reply may still count.
constexpr size_t kSmall = 1024;

TcpStoreServerOptions loopback() {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.token = "";
  return options;
}

// A well-formed client still gets served: SET, GET and PING round trips with exact replies.
void check_serves_a_good_client(TcpStoreServer& server) {
  RawClient good(server.port());
  good.send(Frame().u8(SET).str("/ok").str("fine"));
  good.send(Frame().u8(GET).str("/ok"));
  REQUIRE(good.read(12) == reply_bytes("fine"));
  good.send(Frame().u8(PING).u32(77));
  REQUIRE(good.read(4) == le_u32(77));
}

// stats() after a probe's round trip: every connection closed before it is gone from the counts
// (the server handles events in arrival order); the probe itself is not counted.
TcpStoreServer::Stats settled_stats(TcpStoreServer& server) {
  RawClient probe(server.port());
  probe.send(Frame().u8(PING).u32(0));
  probe.read(4);
  TcpStoreServer::Stats stats = server.stats();
  stats.connections -= 1;
  return stats;
}

// The violation counter reaches `count`: the close was deliberate, not an accident of EOF.
void require_violations(TcpStoreServer& server, size_t count) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.stats().closed_for_violation < count &&
         std::chrono::steady_clock::now() < deadline) {
    RawClient probe(server.port());  // a round trip lets the loop run a turn
    probe.send(Frame().u8(PING).u32(0));
    probe.read(4);
  }
  REQUIRE(server.stats().closed_for_violation == count);
}

}  // namespace

TEST_CASE("a length of 2^63 for a key or a value closes the connection", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient bad_key(server.port());
  bad_key.send(Frame().u8(SET).u64(uint64_t{1} << 63));
  CHECK(bad_key.closed_by_server());
  RawClient bad_value(server.port());
  bad_value.send(Frame().u8(SET).str("/k").u64(uint64_t{1} << 63).raw("xx"));
  CHECK(bad_value.closed_by_server());
  require_violations(server, 2);
  check_serves_a_good_client(server);
  CHECK(server.stats().keys == 1);  // only the good client's key
}

TEST_CASE("a key one byte over the limit closes the connection; one at the limit is stored",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  std::string at_limit(store_protocol::kMaxKeyBytes, 'k');
  RawClient c(server.port());
  c.send(Frame().u8(SET).str(at_limit).str("v"));
  c.send(Frame().u8(GET).str(at_limit));
  CHECK(c.read(9) == reply_bytes("v"));
  c.send(Frame().u8(SET).str(at_limit + "k").str("v"));
  CHECK(c.closed_by_server());
  require_violations(server, 1);
  check_serves_a_good_client(server);
}

TEST_CASE("a value over 8 MiB closes the connection before its bytes are buffered",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(Frame().u8(SET).str("/k").u64(store_protocol::kMaxValueBytes + 1));
  CHECK(c.closed_by_server());
  require_violations(server, 1);
  CHECK(server.stats().buffered_bytes < kSmall);
}

TEST_CASE("a WAIT or MULTI_SET with more keys than the limit closes the connection",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient w(server.port());
  w.send(Frame().u8(WAIT).u64(store_protocol::kMaxKeysPerQuery + 1));
  CHECK(w.closed_by_server());
  RawClient m(server.port());
  m.send(Frame().u8(MULTI_SET).u64(~uint64_t{0}));
  CHECK(m.closed_by_server());
  require_violations(server, 2);
  check_serves_a_good_client(server);
}

TEST_CASE("an unknown query type closes the connection", "[store_protocol]") {
  TcpStoreServer server(loopback());
  for (uint8_t type : {uint8_t{17}, uint8_t{0xC0}, uint8_t{0xC1}, uint8_t{0xFF}, uint8_t{0}}) {
    RawClient c(server.port());
    c.send(Frame().u8(type).u64(0));
    CHECK(c.closed_by_server());
  }
  require_violations(server, 5);
  check_serves_a_good_client(server);
}

TEST_CASE("a first message that is not VALIDATE, or a wrong magic, closes the connection",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient no_validate(server.port(), /*send_validate=*/false);
  no_validate.send(Frame().u8(PING).u32(1));
  CHECK(no_validate.closed_by_server());
  RawClient wrong_magic(server.port(), /*send_validate=*/false);
  wrong_magic.send(Frame().u8(0).u32(0x12345678));
  CHECK(wrong_magic.closed_by_server());
  require_violations(server, 2);
  check_serves_a_good_client(server);
}

TEST_CASE("an ADD to a value that is not an integer closes the connection, as PyTorch's does",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(Frame().u8(SET).str("/text").str("abc"));
  c.send(Frame().u8(4).str("/text").i64(1));
  CHECK(c.closed_by_server());
  RawClient overflow(server.port());
  overflow.send(Frame().u8(SET).str("/max").str("9223372036854775807"));
  overflow.send(Frame().u8(4).str("/max").i64(1));
  CHECK(overflow.closed_by_server());
  require_violations(server, 2);
  RawClient check(server.port());
  check.send(Frame().u8(GET).str("/max"));
  CHECK(check.read(27) == reply_bytes("9223372036854775807"));  // unchanged
}

TEST_CASE("random bytes never crash the server", "[store_protocol]") {
  TcpStoreServer server(loopback());
  std::mt19937_64 rng(20261202);
  for (int round = 0; round < 50; ++round) {
    RawClient c(server.port(), /*send_validate=*/round % 2 == 0);
    std::string junk(1 + rng() % 4096, '\0');
    for (char& b : junk) b = static_cast<char>(rng());
    c.send(junk);
    c.shutdown_write();  // a query left incomplete ends with the stream
    CHECK(c.closed_by_server());
  }
  check_serves_a_good_client(server);
  CHECK(settled_stats(server).connections == 0);
  CHECK(settled_stats(server).buffered_bytes < kSmall);
}

TEST_CASE("a client that sends half a query and goes silent does not delay others",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient stalled(server.port());
  stalled.send(Frame().u8(SET).str("/half").u64(1000).raw("only some bytes"));
  for (int i = 0; i < 20; ++i) check_serves_a_good_client(server);
  CHECK(stalled.silent_for(std::chrono::milliseconds(0)));
  CHECK(server.stats().closed_for_violation == 0);
  CHECK(settled_stats(server).connections == 1);  // the stalled one, still open
  // Finishing the query later completes it.
  stalled.send(std::string(1000 - 15, 'x'));
  stalled.send(Frame().u8(GET).str("/half"));
  CHECK(stalled.read(8 + 1000).size() == 1008);
}

TEST_CASE("2,000 connections opened at once are all served", "[store_protocol]") {
  TcpStoreServer server(loopback());
  size_t rss_before = resident_bytes();
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 2000; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    clients.back()->send(Frame().u8(PING).u32(static_cast<uint32_t>(i)));
  }
  for (int i = 0; i < 2000; ++i) REQUIRE(clients[i]->read(4) == le_u32(static_cast<uint32_t>(i)));
  CHECK(server.stats().connections == 2000);
  clients.clear();
  CHECK(settled_stats(server).connections == 0);
  // Per-connection state is small: 2,000 clients cost the process well under 64 MiB.
  CHECK(resident_bytes() < rss_before + (size_t{64} << 20));
}

TEST_CASE("connections beyond max_connections are refused and the others served",
          "[store_protocol]") {
  TcpStoreServerOptions options = loopback();
  options.max_connections = 3;
  TcpStoreServer server(options);
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    clients.back()->send(Frame().u8(PING).u32(1));
    REQUIRE(clients.back()->read(4) == le_u32(1));
  }
  RawClient extra(server.port());
  CHECK(extra.closed_by_server());
  clients[0]->send(Frame().u8(PING).u32(2));
  CHECK(clients[0]->read(4) == le_u32(2));
}

TEST_CASE("a client that never reads its replies is closed when they pass the limit",
          "[store_protocol]") {
  TcpStoreServerOptions options = loopback();
  options.max_pending_reply_bytes_per_connection = 1 << 20;
  TcpStoreServer server(options);
  RawClient reader_not(server.port());
  reader_not.send(Frame().u8(SET).str("/big").str(std::string(256 << 10, 'b')));
  Frame gets;
  for (int i = 0; i < 400; ++i) gets.u8(GET).str("/big");  // 100 MiB of replies
  reader_not.send(gets);
  require_violations(server, 1);
  CHECK(server.stats().buffered_bytes < kSmall);
  check_serves_a_good_client(server);
}

TEST_CASE("memory stays bounded when many clients declare large values and stall",
          "[store_protocol]") {
  TcpStoreServerOptions options = loopback();
  options.max_total_buffered_bytes = 64 << 20;
  TcpStoreServer server(options);
  size_t rss_before = resident_bytes();
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 40; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    // Each declares an 8 MiB value and sends 256 KiB of it.
    clients.back()->send(Frame().u8(SET).str("/v").u64(8 << 20).raw(std::string(256 << 10, 'x')));
  }
  check_serves_a_good_client(server);
  // At most 64 MiB of declared values are held: 7 stall, the rest are closed.
  require_violations(server, 33);
  CHECK(server.stats().buffered_bytes <= options.max_total_buffered_bytes);
  CHECK(resident_bytes() < rss_before + (size_t{96} << 20));
  clients.clear();
}

TEST_CASE("a server out of file descriptors refuses new connections and keeps serving",
          "[store_protocol][multiproc]") {
  uint16_t port = free_port();
  // Rank 0's own connection must reach the server before rank 1 uses up its descriptors, so
  // rank 1 waits for a byte on this pipe first.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  run_ranks_ok(2, [port, ready](int rank) {
    if (rank == 0) {
      // Room for a few dozen connections only; the rest hit EMFILE in accept.
      rlimit limit{48, 48};
      RANK_CHECK(::setrlimit(RLIMIT_NOFILE, &limit) == 0);
      TcpStoreServerOptions options = loopback();
      options.port = port;
      TcpStoreServer server(options);
      // Serve until rank 1 says it is done.
      RawClient self(port);
      self.send(Frame().u8(WAIT).u64(1).str("/done"));
      RANK_CHECK(::write(ready[1], "r", 1) == 1);
      RANK_CHECK(self.read(1, std::chrono::seconds(50)) == std::string(1, '\0'));
      return;
    }
    pollfd wait_ready{ready[0], POLLIN, 0};
    RANK_CHECK(::poll(&wait_ready, 1, 30'000) == 1, "rank 0 did not start its server");
    std::vector<std::unique_ptr<RawClient>> clients;
    for (int i = 0; i < 100; ++i) {
      clients.push_back(std::make_unique<RawClient>(port));
      clients.back()->send(Frame().u8(PING).u32(static_cast<uint32_t>(i)));
    }
    int served = 0, refused = 0;
    for (int i = 0; i < 100; ++i) {
      try {
        RANK_CHECK(clients[i]->read(4) == le_u32(static_cast<uint32_t>(i)));
        ++served;
      } catch (const std::runtime_error& e) {
        RANK_CHECK(std::string(e.what()).find("connection closed") != std::string::npos,
                   "client {}: {}", i, e.what());
        ++refused;
      }
    }
    RANK_CHECK(served >= 10 && refused >= 40, "served {} refused {}", served, refused);
    clients.clear();
    // Once the server has seen those closes, its descriptors are back and new clients are
    // served (a client racing the closes may still be refused, so try until the deadline).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      RawClient after(port);
      after.send(Frame().u8(PING).u32(1234));
      try {
        RANK_CHECK(after.read(4) == le_u32(1234));
      } catch (const std::runtime_error&) {
        RANK_CHECK(std::chrono::steady_clock::now() < deadline, "never served again");
        continue;
      }
      // No reply to wait for: this SET lets rank 0 stop its server.
      after.send(Frame().u8(SET).str("/done").str("1"));
      break;
    }
  });
  ::close(ready[0]);
  ::close(ready[1]);
}

}  // namespace weft::test
