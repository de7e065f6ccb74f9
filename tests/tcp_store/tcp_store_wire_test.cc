// TCPStore's bytes on the wire and its handling of rare or hostile replies, against a scripted
// fake server (scripted_server.h): nothing here needs weft's or PyTorch's server.
#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/tcp_store.h"

#include "runtime/store_protocol.h"
#include "runtime/store_wire.h"
#include "tests/tcp_store/scripted_server.h"

namespace weft {
namespace {

using namespace std::chrono_literals;
using store_protocol::QueryType;
using store_wire::Request;
using test::ScriptedPeer;
using test::ScriptedServer;

TCPStoreOptions options_for(uint16_t port, std::string token = "") {
  return {.host = "127.0.0.1", .port = port, .timeout = 5s, .token = std::move(token)};
}

constexpr auto kStopWaiting = static_cast<uint8_t>(store_protocol::WaitResponse::StopWaiting);
constexpr auto kWaitCanceled = static_cast<uint8_t>(store_protocol::WaitResponse::WaitCanceled);

// Runs f, which must throw weft::Error; returns it.
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

TEST_CASE("TCPStore sends PyTorch's exact bytes: VALIDATE, PING, then '/'-prefixed keys",
          "[tcp_store][wire]") {
  ScriptedServer server([](ScriptedPeer& peer) {
    peer.accept_handshake();
    peer.expect(Request(QueryType::Set).string("/a").string("xyz"), "SET");
    // get is WAIT (u64 count, keys) then GET.
    peer.expect(Request(QueryType::Wait).value<uint64_t>(1).string("/a"), "WAIT of get");
    peer.send_value<uint8_t>(kStopWaiting);
    peer.expect(Request(QueryType::Get).string("/a"), "GET");
    peer.send_string("xyz");
    peer.expect(Request(QueryType::Add).string("/n").value<int64_t>(-3), "ADD");
    peer.send_value<int64_t>(-3);
    peer.expect(Request(QueryType::MultiSet)
                    .value<int64_t>(2)
                    .string("/k1")
                    .string("v1")
                    .string("/k2")
                    .string(""),
                "MULTI_SET");
    peer.expect(Request(QueryType::Check).value<uint64_t>(2).string("/k1").string("/k2"), "CHECK");
    peer.send_value<uint8_t>(static_cast<uint8_t>(store_protocol::CheckResponse::NotReady));
    // QUEUE_POP's reply: the length before the pop, then the value.
    peer.expect(Request(QueryType::QueuePop).string("/q"), "QUEUE_POP");
    peer.send_value<int64_t>(2);
    peer.send_string("first");
    peer.expect(Request(QueryType::QueuePop).string("/q"), "QUEUE_POP of an empty queue");
    peer.send_value<int64_t>(0);
    peer.answer_ping();
  });
  TCPStore store(options_for(server.port()));
  store.set("a", std::string_view("xyz"));
  CHECK(store.get_string("a") == "xyz");
  CHECK(store.add("n", -3) == -3);
  store.multi_set({"k1", "k2"}, {to_bytes("v1"), {}});
  CHECK_FALSE(store.check({"k1", "k2"}));
  CHECK(to_string(store.queue_pop("q", /*block=*/false)) == "first");
  auto empty = thrown_by([&] { store.queue_pop("q", /*block=*/false); });
  CHECK(empty.code() == ErrorCode::Timeout);
  CHECK_THAT(empty.what(), Catch::Contains("queue \"q\" is empty"));
  store.ping();
  CHECK(server.finish().empty());
}

TEST_CASE("a STOP_WAITING that races CANCEL_WAIT is consumed and the connection stays in step",
          "[tcp_store][wire]") {
  ScriptedServer server([](ScriptedPeer& peer) {
    peer.accept_handshake();
    peer.expect(Request(QueryType::Wait).value<uint64_t>(1).string("/late"), "WAIT");
    // No answer until the client gives up; then both replies, the raced one first.
    peer.expect(Request(QueryType::CancelWait), "CANCEL_WAIT");
    peer.send_value<uint8_t>(kStopWaiting);
    peer.send_value<uint8_t>(kWaitCanceled);
    // Next, the plain order: only WAIT_CANCELED.
    peer.expect(Request(QueryType::Wait).value<uint64_t>(1).string("/later"), "WAIT");
    peer.expect(Request(QueryType::CancelWait), "CANCEL_WAIT");
    peer.send_value<uint8_t>(kWaitCanceled);
    peer.answer_ping();
  });
  TCPStore store(options_for(server.port()));
  auto start = std::chrono::steady_clock::now();
  auto e = thrown_by([&] { store.wait({"late"}, 50ms); });
  CHECK(std::chrono::steady_clock::now() - start >= 50ms);
  CHECK(e.code() == ErrorCode::Timeout);
  CHECK_THAT(e.what(), Catch::Contains("key \"late\"") && Catch::Contains("50 ms") &&
                           Catch::Contains(fmt::format("127.0.0.1:{}", server.port())));
  CHECK(thrown_by([&] { store.wait({"later"}, 10ms); }).code() == ErrorCode::Timeout);
  store.ping();
  CHECK(server.finish().empty());
}

TEST_CASE("a server that closes after PING is reported as maybe requiring WEFT_STORE_TOKEN",
          "[tcp_store][wire][auth]") {
  // The client retries a closed handshake (a full listen backlog looks the same) up to three
  // times: close each attempt the same way.
  ScriptedServer server(
      [](ScriptedPeer& peer) {
        peer.expect(Request(QueryType::Validate).value<uint32_t>(store_protocol::kValidationMagic),
                    "VALIDATE");
        peer.read(5);  // PING + nonce
        peer.close();
      },
      /*connections=*/3);
  auto e = thrown_by([&] { TCPStore store(options_for(server.port())); });
  CHECK(e.code() == ErrorCode::PeerLost);
  CHECK_THAT(e.what(), Catch::Contains("WEFT_STORE_TOKEN") && Catch::Contains("authentication"));
  CHECK(server.finish().empty());
}

TEST_CASE("a refused token is InvalidArgument naming the store", "[tcp_store][wire][auth]") {
  ScriptedServer server([](ScriptedPeer& peer) {
    peer.expect(Request(QueryType::Validate).value<uint32_t>(store_protocol::kValidationMagic),
                "VALIDATE");
    peer.expect(Request(QueryType::AuthChallenge), "AUTH_CHALLENGE");
    peer.send_bytes(std::vector<uint8_t>(store_protocol::kAuthNonceBytes, 7));
    peer.expect(Request(QueryType::AuthProof), "AUTH_PROOF type");
    peer.read(store_protocol::kAuthMacBytes);
    peer.send_value<uint8_t>(0);
  });
  auto e = thrown_by([&] { TCPStore store(options_for(server.port(), "wrong")); });
  CHECK(e.code() == ErrorCode::InvalidArgument);
  CHECK_THAT(e.what(), Catch::Contains(
                           fmt::format("store at 127.0.0.1:{} refused the token", server.port())));
  CHECK(server.finish().empty());
}

TEST_CASE("a reply that breaks the protocol is Error(Protocol) and later calls fail fast",
          "[tcp_store][wire]") {
  ScriptedServer server([](ScriptedPeer& peer) {
    peer.accept_handshake();
    peer.expect(Request(QueryType::Wait).value<uint64_t>(1).string("/k"), "WAIT");
    peer.send_value<uint8_t>(9);  // neither STOP_WAITING nor WAIT_CANCELED
    peer.read(1);                 // hold the connection open until the client closes it
  });
  TCPStore store(options_for(server.port()));
  auto first = thrown_by([&] { store.get("k"); });
  CHECK(first.code() == ErrorCode::Protocol);
  CHECK_THAT(first.what(), Catch::Contains("WAIT answered 9"));
  auto later = thrown_by([&] { store.set("k", std::string_view("v")); });
  CHECK(later.code() == ErrorCode::Protocol);
  CHECK_THAT(later.what(), Catch::Contains("unusable after an earlier error"));
  // The scripted server's last read fails when the client closed: that is the point.
  CHECK_THAT(server.finish(), Catch::Contains("closed"));
}

TEST_CASE("a reply length too large to be a value is refused, not allocated", "[tcp_store][wire]") {
  ScriptedServer server([](ScriptedPeer& peer) {
    peer.accept_handshake();
    peer.expect(Request(QueryType::CompareSet).string("/k").string("").string("v"), "COMPARE_SET");
    peer.send_value<uint64_t>(uint64_t{1} << 62);
    peer.read(1);
  });
  TCPStore store(options_for(server.port()));
  auto e = thrown_by([&] { store.compare_set("k", {}, to_bytes("v")); });
  CHECK(e.code() == ErrorCode::Protocol);
  CHECK_THAT(server.finish(), Catch::Contains("closed"));
}

TEST_CASE("keys and values over the store's limits are refused before anything is sent",
          "[tcp_store][wire]") {
  ScriptedServer server([](ScriptedPeer& peer) {
    peer.accept_handshake();
    peer.answer_ping();
  });
  TCPStore store(options_for(server.port()));
  auto long_key = std::string(store_protocol::kMaxKeyBytes, 'k');
  CHECK(thrown_by([&] { store.set(long_key, std::string_view("v")); }).code() ==
        ErrorCode::InvalidArgument);
  Bytes big(store_protocol::kMaxValueBytes + 1);
  auto e = thrown_by([&] { store.set("k", big); });
  CHECK(e.code() == ErrorCode::InvalidArgument);
  CHECK_THAT(e.what(), Catch::Contains("8388609 bytes"));
  CHECK(thrown_by([&] {
          store.multi_set({"a", "b"}, {Bytes{}});
        }).code() == ErrorCode::InvalidArgument);
  store.ping();  // the connection was not disturbed
  CHECK(server.finish().empty());
}

TEST_CASE("connecting to a port nobody listens on fails with Timeout after the timeout",
          "[tcp_store][wire]") {
  uint16_t port = 0;
  { net::listen_on("127.0.0.1", 0, &port); }  // bound and closed: refused from now on
  auto start = std::chrono::steady_clock::now();
  auto e = thrown_by(
      [&] { TCPStore store({.host = "127.0.0.1", .port = port, .timeout = 300ms, .token = ""}); });
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(e.code() == ErrorCode::Timeout);
  CHECK_THAT(e.what(), Catch::Contains(fmt::format("127.0.0.1:{}", port)));
  CHECK(took >= 300ms);
  CHECK(took < 3s);
}

}  // namespace
}  // namespace weft
