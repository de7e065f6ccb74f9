// The store's authentication extension: HMAC-SHA256 challenge-response after VALIDATE, required
// before any query when the server has a token (docs/store-protocol.md).
#include <string>

#include <catch2/catch.hpp>

#include "weft/tcp_store_server.h"

#include "runtime/store_auth.h"
#include "runtime/store_protocol.h"
#include "tests/store_protocol/raw_client.h"

namespace weft::test {
namespace {

constexpr uint8_t SET = 1, GET = 3, GETNUMKEYS = 7, PING = 13, AUTH_CHALLENGE = 0xC0,
                  AUTH_PROOF = 0xC1;
const std::string kToken = "s3cret-token-that-must-not-leak";

TcpStoreServerOptions with_token(std::string token) {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.token = std::move(token);
  return options;
}

store_auth::Nonce challenge(RawClient& c) {
  c.send(Frame().u8(AUTH_CHALLENGE));
  std::string bytes = c.read(store_protocol::kAuthNonceBytes);
  store_auth::Nonce nonce{};
  std::copy(bytes.begin(), bytes.end(), nonce.begin());
  return nonce;
}

void prove(RawClient& c, const store_auth::Nonce& nonce, const std::string& token) {
  store_auth::Mac mac = store_auth::prove(token, nonce);
  c.send(Frame().u8(AUTH_PROOF).raw(std::string(mac.begin(), mac.end())));
}

}  // namespace

TEST_CASE("a client that proves the token is accepted and served", "[store_protocol][auth]") {
  TcpStoreServer server(with_token(kToken));
  RawClient c(server.port());
  prove(c, challenge(c), kToken);
  CHECK(c.read(1) == std::string(1, '\1'));
  c.send(Frame().u8(SET).str("/k").str("v"));
  c.send(Frame().u8(GET).str("/k"));
  CHECK(c.read(9) == reply_bytes("v"));
  // Neither direction carried the token itself.
  CHECK(c.sent().find(kToken) == std::string::npos);
  CHECK(c.received().find(kToken) == std::string::npos);
}

TEST_CASE("a wrong token is answered 0 and the connection closed", "[store_protocol][auth]") {
  TcpStoreServer server(with_token(kToken));
  RawClient c(server.port());
  prove(c, challenge(c), "not-the-token");
  CHECK(c.read(1) == std::string(1, '\0'));
  CHECK(c.closed_by_server());
  CHECK(server.stats().closed_for_violation == 1);
}

TEST_CASE("a proof for another connection's nonce is refused", "[store_protocol][auth]") {
  TcpStoreServer server(with_token(kToken));
  RawClient first(server.port());
  RawClient second(server.port());
  store_auth::Nonce first_nonce = challenge(first);
  store_auth::Nonce second_nonce = challenge(second);
  CHECK(first_nonce != second_nonce);
  prove(second, first_nonce, kToken);  // a replayed proof
  CHECK(second.read(1) == std::string(1, '\0'));
  CHECK(second.closed_by_server());
}

TEST_CASE("a query before authentication closes the connection before it runs",
          "[store_protocol][auth]") {
  TcpStoreServer server(with_token(kToken));
  {
    RawClient unauthenticated(server.port());
    unauthenticated.send(Frame().u8(SET).str("/stolen").str("x"));
    CHECK(unauthenticated.closed_by_server());
  }
  {
    RawClient skips_challenge(server.port());
    skips_challenge.send(Frame().u8(AUTH_PROOF).raw(std::string(32, 'a')));
    CHECK(skips_challenge.closed_by_server());
  }
  {
    RawClient stops_halfway(server.port());
    challenge(stops_halfway);
    stops_halfway.send(Frame().u8(PING).u32(1));
    CHECK(stops_halfway.closed_by_server());
  }
  RawClient good(server.port());
  prove(good, challenge(good), kToken);
  REQUIRE(good.read(1) == std::string(1, '\1'));
  good.send(Frame().u8(GETNUMKEYS));
  CHECK(good.read(8) == le_i64(0));  // the unauthenticated SET never ran
  CHECK(server.stats().closed_for_violation == 3);
}

TEST_CASE("a server without a token treats the auth queries as unknown", "[store_protocol][auth]") {
  TcpStoreServer server(with_token(""));
  RawClient c(server.port());
  c.send(Frame().u8(AUTH_CHALLENGE));
  CHECK(c.closed_by_server());
  RawClient plain(server.port());
  plain.send(Frame().u8(PING).u32(4));
  CHECK(plain.read(4) == le_u32(4));
}

}  // namespace weft::test
