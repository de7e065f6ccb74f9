// weft/tcp_store_server.h: TcpStoreServer, a TCPStore server speaking PyTorch's wire protocol.
//
// One event-loop thread (epoll) serves every client: no thread per connection, so thousands of
// clients are fine. Requests may arrive in pieces or several per packet; each is answered when
// complete. WAIT and GET-style waits are parked server-side and answered when their keys are set.
// A client that breaks a limit (key, value, keys per query, bytes buffered) or the protocol has
// its connection closed with a log line naming its address; the server goes on.
//
// Thread safety: the constructor starts the loop; port() may be read from any thread; the
// destructor (or stop()) ends it and closes every connection.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace weft {

struct TcpStoreServerOptions {
  // Address to bind: an interface's address, "0.0.0.0" (all IPv4), "::" (all). Binding a
  // loopback address keeps the store off the network.
  std::string host = "0.0.0.0";
  // 0: the kernel picks a free port; read it back with port().
  uint16_t port = 0;
  // Shared secret for the authentication extension. Unset: WEFT_STORE_TOKEN. Empty: off.
  std::optional<std::string> token = std::nullopt;
  // Limits; a connection that breaks one is closed.
  size_t max_key_bytes = 8 * 1024;
  size_t max_value_bytes = 8 * 1024 * 1024;
  size_t max_keys_per_query = 131072;
  // Bytes of one connection's partial request held while waiting for the rest.
  size_t max_buffered_bytes_per_connection = 64 * 1024 * 1024;
  // Replies queued for a client that does not read them.
  size_t max_pending_reply_bytes_per_connection = 64 * 1024 * 1024;
  size_t max_connections = 65536;
  // Request + reply bytes held for all connections together: the connection whose buffering
  // crosses it is closed, so the server's memory beyond the stored data stays bounded.
  size_t max_total_buffered_bytes = size_t{1} << 30;
};

class TcpStoreServer {
 public:
  // Binds, listens and starts the event loop. Throws Error(Io) naming the address when the port
  // cannot be bound.
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  const std::string& host() const;

  // Stops the loop and closes every connection. Idempotent.
  void stop();

  // For tests and monitoring; read from the loop thread's counters.
  struct Stats {
    size_t connections = 0;   // open now
    size_t keys = 0;          // stored now
    size_t parked_waits = 0;  // WAITs not yet answered
    size_t closed_for_violation = 0;
    size_t buffered_bytes = 0;  // request + reply bytes held for all connections
  };
  Stats stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft
