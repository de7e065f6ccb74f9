// libFuzzer target: the TCPStore server's connection state machine (handshake, authentication,
// queries, parked waits, limits) on arbitrary bytes from two clients at once, through real
// sockets to one server that lives for the whole run. After every input the server must still
// serve a well-behaved client (set, get, add, wait), so a malformed packet may close its own
// connection but never crash the server, hang it, or lose another client's data.
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "weft/store.h"
#include "weft/tcp_store.h"
#include "weft/tcp_store_server.h"

#include "runtime/socket.h"

namespace {

using namespace std::chrono_literals;

weft::TcpStoreServer& server() {
  static weft::TcpStoreServer* s = [] {
    weft::TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.token = "";  // the unauthenticated state machine; the token's is fuzzed below
    options.max_key_bytes = 64;
    options.max_value_bytes = 4096;
    options.max_keys_per_query = 64;
    options.max_buffered_bytes_per_connection = 64 * 1024;
    options.max_pending_reply_bytes_per_connection = 64 * 1024;
    return new weft::TcpStoreServer(options);
  }();
  return *s;
}

weft::TcpStoreServer& token_server() {
  static weft::TcpStoreServer* s = [] {
    weft::TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.token = "fuzz-token";
    return new weft::TcpStoreServer(options);
  }();
  return *s;
}

weft::TCPStore& witness() {
  static weft::TCPStore* s = new weft::TCPStore(
      {.host = "127.0.0.1", .port = server().port(), .timeout = 10s, .token = ""});
  return *s;
}

// Sends `bytes`, closes the write side, and drains replies until the server closes or is quiet
// for a moment (a parked WAIT stays parked until the connection goes).
void send_and_drain(uint16_t port, const uint8_t* data, size_t size) {
  auto deadline = weft::net::deadline_after(2000ms);
  weft::net::Socket s = weft::net::connect_with_retry("127.0.0.1", port, deadline, "fuzz client");
  size_t at = 0;
  while (at < size) {
    ssize_t n = ::send(s.fd(), data + at, size - at, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed on a violation: fine
    at += static_cast<size_t>(n);
  }
  ::shutdown(s.fd(), SHUT_WR);
  char buffer[4096];
  for (;;) {
    pollfd p{s.fd(), POLLIN, 0};
    if (::poll(&p, 1, 5) <= 0) break;
    if (::recv(s.fd(), buffer, sizeof(buffer), 0) <= 0) break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t round = 0;
  ++round;
  // The first byte picks the server and where the input splits between two clients.
  if (size == 0) return 0;
  weft::TcpStoreServer& target = (data[0] & 1) ? token_server() : server();
  const size_t split = size > 1 ? 1 + (data[0] >> 1) % size : size;
  send_and_drain(target.port(), data + 1, std::min(split, size) - 1);
  if (split < size) send_and_drain(target.port(), data + split, size - split);

  // The server still answers, and keeps what a well-behaved client stored. The key is fresh each
  // round (and unguessable enough) so that the fuzzed clients cannot have touched it.
  static const uint64_t salt = std::random_device{}();
  const std::string key = "witness/" + std::to_string(salt) + "/" + std::to_string(round);
  witness().set(key, std::string_view("kept"));
  if (weft::to_string(witness().get(key, 2000ms)) != "kept") std::abort();
  if (witness().add(key + "/n", 2) != 2) std::abort();
  witness().wait({key, key + "/n"}, 2000ms);
  return 0;
}
