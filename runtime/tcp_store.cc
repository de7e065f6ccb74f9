// TCPStore: the client side of PyTorch's TCPStore protocol. The wire exchanges live in
// runtime/tcp_store_connection.{h,cc}; this file maps the Store API onto them the way PyTorch's
// client does: get is WAIT then GET, multi_get is WAIT then MULTI_GET, a blocking queue_pop is
// WAIT then QUEUE_POP, and every user key travels with a "/" prefix.
#include "weft/tcp_store.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"

#include "runtime/socket.h"
#include "runtime/store_protocol.h"
#include "runtime/store_wire.h"
#include "runtime/tcp_store_connection.h"

namespace weft {
namespace {

using store_protocol::QueryType;
using store_wire::Request;
using Clock = net::Clock;
using tcp_store_detail::format_duration;
using tcp_store_detail::next_ping_nonce;

// Handshake attempts: a server whose listen backlog overflowed accepts and then resets, which
// PyTorch's client also survives by reconnecting.
constexpr int kHandshakeAttempts = 3;

TCPStoreOptions resolve_options(TCPStoreOptions options) {
  if (options.timeout.count() <= 0) options.timeout = config().timeout;
  if (!options.token) options.token = config().store_token;
  return options;
}

}  // namespace

TCPStore::TCPStore(TCPStoreOptions options) : options_(resolve_options(std::move(options))) {
  set_timeout(options_.timeout);
  const std::string address = fmt::format("{}:{}", options_.host, options_.port);
  const auto deadline = net::deadline_after(options_.timeout);
  for (int attempt = 1;; ++attempt) {
    auto socket = net::connect_with_retry(options_.host, options_.port, deadline,
                                          fmt::format("store {} connect", address));
    local_address_ = net::local_host(socket.fd());
    connection_ = std::make_unique<Connection>(std::move(socket), address);
    try {
      connection_->handshake(*options_.token, deadline);
      return;
    } catch (const Error& e) {
      // Only a connection closed under us is worth another try; a refused token, a bad PING
      // echo or a timeout will not change.
      bool retry = e.code() == ErrorCode::PeerLost && attempt < kHandshakeAttempts &&
                   Clock::now() + std::chrono::milliseconds(100) < deadline;
      if (!retry) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(20 + next_ping_nonce() % 40) * attempt);
    }
  }
}

TCPStore::~TCPStore() = default;

void TCPStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "set");
  c.check_value(value, "set");
  c.check_usable("set");
  c.send(Request(QueryType::Set).key(key).bytes(value), net::deadline_after(timeout()), "set");
}

Bytes TCPStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "get");
  c.check_usable("get");
  c.wait({key}, resolve(timeout), this->timeout(), "get");
  auto deadline = net::deadline_after(this->timeout());
  c.send(Request(QueryType::Get).key(key), deadline, "get");
  return c.read_bytes(deadline, "get");
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "add");
  c.check_usable("add");
  auto deadline = net::deadline_after(timeout());
  c.send(Request(QueryType::Add).key(key).value<int64_t>(delta), deadline, "add");
  try {
    return c.read_value<int64_t>(deadline, "add");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::PeerLost) throw;
    throw Error(ErrorCode::PeerLost,
                fmt::format("{} (a server closes the connection when the value at key \"{}\" is "
                            "not a decimal integer)",
                            e.what(), key));
  }
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "compare_set");
  c.check_value(expected, "compare_set");
  c.check_value(desired, "compare_set");
  c.check_usable("compare_set");
  auto deadline = net::deadline_after(timeout());
  c.send(Request(QueryType::CompareSet).key(key).bytes(expected).bytes(desired), deadline,
         "compare_set");
  return c.read_bytes(deadline, "compare_set");
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  for (const auto& key : keys) c.check_key(key, "check");
  c.check_usable("check");
  Request request(QueryType::Check);
  request.value<uint64_t>(keys.size());
  for (const auto& key : keys) request.key(key);
  auto deadline = net::deadline_after(timeout());
  c.send(request, deadline, "check");
  return c.read_check_reply(deadline, "check");
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  for (const auto& key : keys) c.check_key(key, "wait");
  c.check_usable("wait");
  c.wait(keys, resolve(timeout), this->timeout(), "wait");
}

bool TCPStore::delete_key(const std::string& key) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "delete_key");
  c.check_usable("delete_key");
  auto deadline = net::deadline_after(timeout());
  c.send(Request(QueryType::DeleteKey).key(key), deadline, "delete_key");
  return c.read_value<int64_t>(deadline, "delete_key") == 1;
}

int64_t TCPStore::num_keys() {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_usable("num_keys");
  auto deadline = net::deadline_after(timeout());
  c.send(Request(QueryType::GetNumKeys), deadline, "num_keys");
  return c.read_value<int64_t>(deadline, "num_keys");
}

void TCPStore::append(const std::string& key, const Bytes& value) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "append");
  c.check_value(value, "append");
  c.check_usable("append");
  c.send(Request(QueryType::Append).key(key).bytes(value), net::deadline_after(timeout()),
         "append");
}

std::vector<Bytes> TCPStore::multi_get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  for (const auto& key : keys) c.check_key(key, "multi_get");
  c.check_usable("multi_get");
  c.wait(keys, resolve(timeout), this->timeout(), "multi_get");
  Request request(QueryType::MultiGet);
  request.value<uint64_t>(keys.size());
  for (const auto& key : keys) request.key(key);
  auto deadline = net::deadline_after(this->timeout());
  c.send(request, deadline, "multi_get");
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) values.push_back(c.read_bytes(deadline, "multi_get"));
  return values;
}

void TCPStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  if (keys.size() != values.size()) {
    throw_error(ErrorCode::InvalidArgument, c.where("multi_set"),
                fmt::format("{} keys but {} values", keys.size(), values.size()));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    c.check_key(keys[i], "multi_set");
    c.check_value(values[i], "multi_set");
  }
  c.check_usable("multi_set");
  Request request(QueryType::MultiSet);
  request.value<int64_t>(static_cast<int64_t>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) request.key(keys[i]).bytes(values[i]);
  c.send(request, net::deadline_after(timeout()), "multi_set");
}

void TCPStore::queue_push(const std::string& key, const Bytes& value) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "queue_push");
  c.check_value(value, "queue_push");
  c.check_usable("queue_push");
  c.send(Request(QueryType::QueuePush).key(key).bytes(value), net::deadline_after(timeout()),
         "queue_push");
}

Bytes TCPStore::queue_pop(const std::string& key, bool block, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "queue_pop");
  c.check_usable("queue_pop");
  const auto limit = resolve(timeout);
  const auto deadline = net::deadline_after(limit);
  for (;;) {
    if (block) {
      // Rounded up, so that the pop waits its whole timeout.
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      try {
        c.wait({key}, std::max(left, std::chrono::milliseconds(0)), this->timeout(), "queue_pop");
      } catch (const Error& e) {
        if (e.code() != ErrorCode::Timeout) throw;
        throw_error(ErrorCode::Timeout, c.where("queue_pop"),
                    fmt::format("after {} waiting for an element in queue \"{}\"",
                                format_duration(limit), key));
      }
    }
    auto io = net::deadline_after(this->timeout());
    c.send(Request(QueryType::QueuePop).key(key), io, "queue_pop");
    // The queue's length before the pop; the value follows only when it was not empty.
    auto length = c.read_value<int64_t>(io, "queue_pop");
    if (length > 0) return c.read_bytes(io, "queue_pop");
    if (length < 0) {
      c.protocol_error("queue_pop", fmt::format("QUEUE_POP answered length {}", length));
    }
    // Empty: a non-blocking pop (Timeout, as a wait of 0 s would be: the contract of
    // weft/store.h), or another client took the element our WAIT saw: wait again.
    if (!block) {
      throw_error(ErrorCode::Timeout, c.where("queue_pop"),
                  fmt::format("queue \"{}\" is empty (block=false)", key));
    }
  }
}

int64_t TCPStore::queue_len(const std::string& key) {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_key(key, "queue_len");
  c.check_usable("queue_len");
  auto deadline = net::deadline_after(timeout());
  c.send(Request(QueryType::QueueLen).key(key), deadline, "queue_len");
  return c.read_value<int64_t>(deadline, "queue_len");
}

std::chrono::nanoseconds TCPStore::ping() {
  std::lock_guard lock(mutex_);
  Connection& c = *connection_;
  c.check_usable("ping");
  const uint32_t nonce = next_ping_nonce();
  auto start = Clock::now();
  auto deadline = net::deadline_after(timeout());
  c.send(Request(QueryType::Ping).value<uint32_t>(nonce), deadline, "ping");
  auto echoed = c.read_value<uint32_t>(deadline, "ping");
  if (echoed != nonce) {
    c.protocol_error("ping", fmt::format("PING echoed {:#x} instead of {:#x}", echoed, nonce));
  }
  return Clock::now() - start;
}

}  // namespace weft
