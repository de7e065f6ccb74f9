// weft/tcp_store.h: TCPStore, a client of a TCPStore server speaking PyTorch's wire protocol.
//
// It talks to weft's TcpStoreServer (weft/tcp_store_server.h, weft-store, weftrun) or to
// PyTorch's own server (torchrun's agent store, torch.distributed.TCPStore), byte for byte.
// As PyTorch's client does, it prefixes every user key with "/" on the wire, so the two see the
// same keys. docs/store-protocol.md gives the protocol.
//
// Thread safety: calls from several threads are serialised on the one connection.
// Errors: a dead server is Error(PeerLost); a call that outlives its timeout Error(Timeout)
// naming the keys; a reply that breaks the protocol Error(Protocol).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "weft/store.h"

namespace weft {

struct TCPStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  // How long to keep trying to connect, and the store's default timeout for blocking calls.
  // 0: WEFT_TIMEOUT (default 300 s).
  std::chrono::milliseconds timeout{0};
  // Shared secret for the server's authentication extension. Unset: WEFT_STORE_TOKEN.
  // Empty: no authentication.
  std::optional<std::string> token = std::nullopt;
};

class TCPStore : public Store {
 public:
  // Connects (retrying with backoff and jitter until the timeout), sends VALIDATE, authenticates
  // when a token is set, and checks the server answers a PING.
  explicit TCPStore(TCPStoreOptions options);
  ~TCPStore() override;

  void set(const std::string& key, const Bytes& value) override;
  using Store::set;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = kDefaultTimeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout = kDefaultTimeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void queue_push(const std::string& key, const Bytes& value) override;
  Bytes queue_pop(const std::string& key, bool block = true,
                  std::chrono::milliseconds timeout = kDefaultTimeout) override;
  int64_t queue_len(const std::string& key) override;
  // The local end of the connection to the server (numeric, as getsockname gives it).
  std::string local_address() const override { return local_address_; }

  // Round trip to the server; returns the time it took.
  std::chrono::nanoseconds ping();

  const std::string& host() const { return options_.host; }
  uint16_t port() const { return options_.port; }

 private:
  class Connection;
  TCPStoreOptions options_;
  std::mutex mutex_;  // serialises whole request/reply exchanges on connection_
  std::unique_ptr<Connection> connection_;
  std::string local_address_;
};

}  // namespace weft
