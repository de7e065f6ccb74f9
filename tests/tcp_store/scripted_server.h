// tests/tcp_store/scripted_server.h: a one-connection fake TCPStore server that plays a script,
// so that tests can check the client's exact bytes and its handling of replies a real server
// sends only by chance (a STOP_WAITING racing a CANCEL_WAIT) or never (garbage, refusals).
//
// The script runs on the server's own thread against the accepted connection; its failures
// (a byte the client should not have sent, a timeout) are kept and reported by finish().
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/socket.h"
#include "runtime/store_protocol.h"
#include "runtime/store_wire.h"

namespace weft::test {

// The server's side of one connection.
class ScriptedPeer {
 public:
  explicit ScriptedPeer(net::Socket socket) : socket_(std::move(socket)) {}

  // Reads exactly the bytes `expected` encodes and fails unless the client sent exactly them.
  void expect(const store_wire::Request& expected, std::string_view what) {
    std::vector<uint8_t> got(expected.data().size());
    net::read_exact(socket_.fd(), got.data(), got.size(), deadline(), "scripted server");
    if (got != expected.data()) {
      throw std::runtime_error(
          fmt::format("{}: the client sent {} bytes that differ from the {} "
                      "expected",
                      what, got.size(), expected.data().size()));
    }
  }
  std::vector<uint8_t> read(size_t size) {
    std::vector<uint8_t> got(size);
    net::read_exact(socket_.fd(), got.data(), size, deadline(), "scripted server");
    return got;
  }
  template <typename T>
  void send_value(T v) {
    net::write_all(socket_.fd(), &v, sizeof(v), deadline(), "scripted server");
  }
  void send_bytes(const std::vector<uint8_t>& bytes) {
    net::write_all(socket_.fd(), bytes.data(), bytes.size(), deadline(), "scripted server");
  }
  // A string or byte value: u64 length, then the bytes.
  void send_string(std::string_view s) {
    send_value<uint64_t>(s.size());
    net::write_all(socket_.fd(), s.data(), s.size(), deadline(), "scripted server");
  }
  void close() { socket_.close(); }

  // The opening every client sends: VALIDATE, then PING whose nonce is echoed.
  void accept_handshake() {
    expect(store_wire::Request(store_protocol::QueryType::Validate)
               .value<uint32_t>(store_protocol::kValidationMagic),
           "VALIDATE");
    answer_ping();
  }
  void answer_ping() {
    expect(store_wire::Request(store_protocol::QueryType::Ping), "PING type");
    auto nonce = read(4);
    send_bytes(nonce);
  }

 private:
  static net::Clock::time_point deadline() { return net::Clock::now() + std::chrono::seconds(10); }
  net::Socket socket_;
};

class ScriptedServer {
 public:
  // Plays script on each of the next `connections` connections, one after the other.
  explicit ScriptedServer(std::function<void(ScriptedPeer&)> script, int connections = 1)
      : listener_(net::listen_on("127.0.0.1", 0, &port_)) {
    thread_ = std::thread([this, connections, script = std::move(script)] {
      try {
        for (int i = 0; i < connections; ++i) {
          pollfd p{listener_.fd(), POLLIN, 0};
          if (::poll(&p, 1, 10'000) != 1) throw std::runtime_error("no client connected in 10 s");
          ScriptedPeer peer(net::Socket(::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC)));
          script(peer);
        }
      } catch (const std::exception& e) {
        failure_ = e.what();
      }
    });
  }
  ~ScriptedServer() {
    if (thread_.joinable()) thread_.join();
  }

  uint16_t port() const { return port_; }

  // Waits for the script to end; its failure text, or "" when it ran to the end.
  std::string finish() {
    if (thread_.joinable()) thread_.join();
    return failure_;
  }

 private:
  uint16_t port_ = 0;
  net::Socket listener_;
  std::thread thread_;
  std::string failure_;
};

}  // namespace weft::test
