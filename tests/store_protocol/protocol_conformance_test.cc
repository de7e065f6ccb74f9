// Byte-level conformance of the TCPStore server to PyTorch's wire protocol: hand-built frames in,
// exact reply bytes out (docs/store-protocol.md; PyTorch's TCPStoreLibUvBackend.cpp).
#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "weft/tcp_store_server.h"

#include "runtime/store_protocol.h"
#include "tests/store_protocol/raw_client.h"

namespace weft::test {
namespace {

// Query type bytes, spelled as PyTorch names them.
constexpr uint8_t SET = 1, COMPARE_SET = 2, GET = 3, ADD = 4, CHECK = 5, WAIT = 6, GETNUMKEYS = 7,
                  DELETE_KEY = 8, APPEND = 9, MULTI_GET = 10, MULTI_SET = 11, CANCEL_WAIT = 12,
                  PING = 13, QUEUE_PUSH = 14, QUEUE_POP = 15, QUEUE_LEN = 16;
const std::string kStopWaiting(1, '\0');
const std::string kWaitCanceled(1, '\1');

TcpStoreServerOptions loopback() {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.token = "";
  return options;
}

Frame set(std::string_view key, std::string_view value) {
  return Frame().u8(SET).str(key).str(value);
}
Frame get(std::string_view key) { return Frame().u8(GET).str(key); }
Frame wait1(std::string_view key) { return Frame().u8(WAIT).u64(1).str(key); }

}  // namespace

TEST_CASE("SET then GET replies the value as u64 length and bytes", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(set("/k", std::string("v\0x", 3)));
  c.send(get("/k"));
  CHECK(c.read(11) == reply_bytes(std::string("v\0x", 3)));
  c.send(set("/k", ""));
  c.send(get("/k"));
  CHECK(c.read(8) == le_u64(0));
}

TEST_CASE("GET of a missing key replies an empty value, as PyTorch's libuv server does",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(get("/missing"));
  CHECK(c.read(8) == le_u64(0));
}

TEST_CASE("ADD stores decimal text and replies the sum as i64", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(Frame().u8(ADD).str("/n").i64(5));
  CHECK(c.read(8) == le_i64(5));
  c.send(Frame().u8(ADD).str("/n").i64(-7));
  CHECK(c.read(8) == le_i64(-2));
  c.send(get("/n"));
  CHECK(c.read(10) == reply_bytes("-2"));
  // The stored value is read as std::stoll reads it: spaces, sign, digits, trailing bytes ignored.
  c.send(set("/t", " +41xyz"));
  c.send(Frame().u8(ADD).str("/t").i64(1));
  CHECK(c.read(8) == le_i64(42));
  c.send(get("/t"));
  CHECK(c.read(10) == reply_bytes("42"));
}

TEST_CASE("COMPARE_SET follows PyTorch's three cases", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  SECTION("absent key and empty expected: stores desired and replies it") {
    c.send(Frame().u8(COMPARE_SET).str("/c").str("").str("new"));
    CHECK(c.read(11) == reply_bytes("new"));
    c.send(get("/c"));
    CHECK(c.read(11) == reply_bytes("new"));
  }
  SECTION("absent key and non-empty expected: stores nothing and replies expected") {
    c.send(Frame().u8(COMPARE_SET).str("/c").str("exp").str("new"));
    CHECK(c.read(11) == reply_bytes("exp"));
    c.send(Frame().u8(GETNUMKEYS));
    CHECK(c.read(8) == le_i64(0));
  }
  SECTION("present key: replaces iff equal, replies the value now stored") {
    c.send(set("/c", "old"));
    c.send(Frame().u8(COMPARE_SET).str("/c").str("other").str("new"));
    CHECK(c.read(11) == reply_bytes("old"));
    c.send(Frame().u8(COMPARE_SET).str("/c").str("old").str("new!"));
    CHECK(c.read(12) == reply_bytes("new!"));
    c.send(get("/c"));
    CHECK(c.read(12) == reply_bytes("new!"));
  }
}

TEST_CASE("WAIT is answered only after another connection sets every key", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient waiter(server.port());
  RawClient setter(server.port());
  waiter.send(Frame().u8(WAIT).u64(2).str("/a").str("/b"));
  setter.send(set("/a", "1"));
  setter.send(Frame().u8(PING).u32(1));
  setter.read(4);  // the SET of /a has been handled
  CHECK(waiter.silent_for(std::chrono::milliseconds(100)));
  CHECK(server.stats().parked_waits == 1);
  setter.send(set("/b", "2"));
  CHECK(waiter.read(1) == kStopWaiting);
  CHECK(server.stats().parked_waits == 0);
}

TEST_CASE("WAIT on keys that exist replies STOP_WAITING at once", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(set("/a", "1"));
  c.send(Frame().u8(WAIT).u64(2).str("/a").str("/a"));
  CHECK(c.read(1) == kStopWaiting);
  c.send(Frame().u8(WAIT).u64(0));
  CHECK(c.read(1) == kStopWaiting);
}

TEST_CASE("CANCEL_WAIT drops the parked wait and replies WAIT_CANCELED", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient waiter(server.port());
  RawClient setter(server.port());
  waiter.send(wait1("/late"));
  waiter.send(Frame().u8(CANCEL_WAIT));
  CHECK(waiter.read(1) == kWaitCanceled);
  setter.send(set("/late", "x"));
  setter.send(Frame().u8(PING).u32(7));
  setter.read(4);
  // The canceled wait is gone: the SET sends nothing, and the connection serves the next query.
  CHECK(waiter.silent_for(std::chrono::milliseconds(50)));
  waiter.send(Frame().u8(PING).u32(9));
  CHECK(waiter.read(4) == le_u32(9));
  CHECK(server.stats().parked_waits == 0);
}

TEST_CASE("CANCEL_WAIT that races the answer gets WAIT_CANCELED after STOP_WAITING",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient waiter(server.port());
  RawClient setter(server.port());
  waiter.send(wait1("/k"));
  setter.send(set("/k", "v"));
  CHECK(waiter.read(1) == kStopWaiting);
  waiter.send(Frame().u8(CANCEL_WAIT));
  CHECK(waiter.read(1) == kWaitCanceled);
}

TEST_CASE("queries sent behind a parked WAIT are answered after it, in order", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient waiter(server.port());
  RawClient setter(server.port());
  waiter.send(wait1("/k").then(get("/k")).then(Frame().u8(PING).u32(3)));
  CHECK(waiter.silent_for(std::chrono::milliseconds(50)));
  setter.send(set("/k", "val"));
  CHECK(waiter.read(1 + 11 + 4) == kStopWaiting + reply_bytes("val") + le_u32(3));
}

TEST_CASE("closing a connection drops its parked wait", "[store_protocol]") {
  TcpStoreServer server(loopback());
  {
    RawClient waiter(server.port());
    waiter.send(wait1("/never"));
    RawClient probe(server.port());
    probe.send(Frame().u8(PING).u32(1));
    probe.read(4);
    CHECK(server.stats().parked_waits == 1);
  }
  RawClient c(server.port());
  c.send(set("/never", "now"));
  c.send(Frame().u8(PING).u32(2));
  CHECK(c.read(4) == le_u32(2));
  CHECK(server.stats().parked_waits == 0);
  CHECK(server.stats().connections == 1);
}

TEST_CASE("CHECK replies 0 when every key exists and 1 otherwise", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(set("/a", ""));
  c.send(Frame().u8(CHECK).u64(1).str("/a"));
  CHECK(c.read(1) == std::string(1, '\0'));
  c.send(Frame().u8(CHECK).u64(2).str("/a").str("/b"));
  CHECK(c.read(1) == std::string(1, '\1'));
  c.send(Frame().u8(CHECK).u64(0));
  CHECK(c.read(1) == std::string(1, '\0'));
}

TEST_CASE("PING echoes its u32", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(Frame().u8(PING).u32(0xDEADBEEF));
  CHECK(c.read(4) == le_u32(0xDEADBEEF));
}

TEST_CASE("GETNUMKEYS counts keys and DELETE_KEY replies 1 then 0", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(set("/a", "1").then(set("/b", "2")).then(set("/a", "3")));
  c.send(Frame().u8(GETNUMKEYS));
  CHECK(c.read(8) == le_i64(2));
  c.send(Frame().u8(DELETE_KEY).str("/a"));
  CHECK(c.read(8) == le_i64(1));
  c.send(Frame().u8(DELETE_KEY).str("/a"));
  CHECK(c.read(8) == le_i64(0));
  c.send(Frame().u8(GETNUMKEYS));
  CHECK(c.read(8) == le_i64(1));
  CHECK(server.stats().keys == 1);
}

TEST_CASE("APPEND creates and extends a value and answers a waiter", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient waiter(server.port());
  RawClient c(server.port());
  waiter.send(wait1("/log"));
  c.send(Frame().u8(APPEND).str("/log").str("ab"));
  CHECK(waiter.read(1) == kStopWaiting);
  c.send(Frame().u8(APPEND).str("/log").str("cd"));
  c.send(get("/log"));
  CHECK(c.read(12) == reply_bytes("abcd"));
}

TEST_CASE("MULTI_SET stores every pair and MULTI_GET replies each value in order",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(Frame().u8(MULTI_SET).u64(3).str("/x").str("1").str("/y").str("22").str("/z").str(""));
  c.send(Frame().u8(MULTI_GET).u64(4).str("/z").str("/y").str("/x").str("/absent"));
  CHECK(c.read(8 + 10 + 9 + 8) ==
        reply_bytes("") + reply_bytes("22") + reply_bytes("1") + reply_bytes(""));
  c.send(Frame().u8(MULTI_GET).u64(0));
  c.send(Frame().u8(PING).u32(5));
  CHECK(c.read(4) == le_u32(5));  // an empty MULTI_GET replies nothing at all
}

TEST_CASE("QUEUE_POP replies the length before the pop, then the value when non-empty",
          "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  c.send(Frame().u8(QUEUE_POP).str("/q"));
  CHECK(c.read(8) == le_i64(0));
  c.send(Frame().u8(QUEUE_PUSH).str("/q").str("first"));
  c.send(Frame().u8(QUEUE_PUSH).str("/q").str("second"));
  c.send(Frame().u8(QUEUE_LEN).str("/q"));
  CHECK(c.read(8) == le_i64(2));
  c.send(Frame().u8(QUEUE_POP).str("/q"));
  CHECK(c.read(8 + 13) == le_i64(2) + reply_bytes("first"));
  c.send(Frame().u8(QUEUE_POP).str("/q"));
  CHECK(c.read(8 + 14) == le_i64(1) + reply_bytes("second"));
  c.send(Frame().u8(QUEUE_LEN).str("/q"));
  CHECK(c.read(8) == le_i64(0));
  // Queues are not keys.
  c.send(Frame().u8(GETNUMKEYS));
  CHECK(c.read(8) == le_i64(0));
}

TEST_CASE("one QUEUE_PUSH answers one of the WAITs parked on that queue", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient first(server.port());
  RawClient second(server.port());
  RawClient pusher(server.port());
  // A PING round trip after each WAIT fixes the order in which the server parked them.
  first.send(wait1("/q"));
  pusher.send(Frame().u8(PING).u32(0));
  pusher.read(4);
  second.send(wait1("/q"));
  pusher.send(Frame().u8(PING).u32(0));
  pusher.read(4);
  pusher.send(Frame().u8(QUEUE_PUSH).str("/q").str("job"));
  CHECK(first.read(1) == kStopWaiting);
  CHECK(second.silent_for(std::chrono::milliseconds(50)));
  pusher.send(Frame().u8(QUEUE_PUSH).str("/q").str("job2"));
  CHECK(second.read(1) == kStopWaiting);
}

TEST_CASE("a query split into single bytes gets the same reply", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port(), /*send_validate=*/false);
  c.send_bytewise(validate_frame().data());
  c.send_bytewise(Frame().u8(MULTI_SET).u64(2).str("/a").str("xy").str("/b").str("").data());
  c.send_bytewise(Frame().u8(MULTI_GET).u64(2).str("/a").str("/b").data());
  CHECK(c.read(10 + 8) == reply_bytes("xy") + reply_bytes(""));
  c.send_bytewise(Frame().u8(ADD).str("/n").i64(-3).data());
  CHECK(c.read(8) == le_i64(-3));
}

TEST_CASE("several queries in one write are all answered in order", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port(), /*send_validate=*/false);
  Frame all = validate_frame();
  all.then(set("/a", "A")).then(Frame().u8(PING).u32(1)).then(get("/a"));
  all.then(Frame().u8(ADD).str("/n").i64(2)).then(Frame().u8(CHECK).u64(1).str("/n"));
  all.then(Frame().u8(GETNUMKEYS)).then(Frame().u8(CANCEL_WAIT));
  c.send(all);
  CHECK(c.read(4 + 9 + 8 + 1 + 8 + 1) == le_u32(1) + reply_bytes("A") + le_i64(2) +
                                             std::string(1, '\0') + le_i64(2) + kWaitCanceled);
}

TEST_CASE("a value of 8 MiB, the limit, is stored and read back whole", "[store_protocol]") {
  TcpStoreServer server(loopback());
  RawClient c(server.port());
  std::string big(store_protocol::kMaxValueBytes, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  c.send(set("/big", big));
  c.send(get("/big"));
  CHECK(c.read(8 + big.size()) == reply_bytes(big));
}

}  // namespace weft::test
