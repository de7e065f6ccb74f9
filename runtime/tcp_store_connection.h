// runtime/tcp_store_connection.h: TCPStore's one connection to its server (private to the
// TCPStore implementation, shared by tcp_store.cc and tcp_store_connection.cc).
//
// Every request goes out in one write and its reply is read before the next request, so one
// request is in flight, with one exception: a WAIT that outlives its timeout is followed by
// CANCEL_WAIT while it is still pending; the server then answers WAIT_CANCELED, possibly after
// the STOP_WAITING of a key set just before the cancel arrived. Both orders are read, as
// PyTorch's client does.
//
// After an exchange fails half-way (a reply timed out, the server closed, a reply broke the
// protocol) the stream's position is unknown: the connection is marked broken, closed, and every
// later call fails at once with the first error's code and text instead of misreading replies.
#pragma once

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/tcp_store.h"

#include "runtime/socket.h"
#include "runtime/store_protocol.h"
#include "runtime/store_wire.h"

namespace weft {

// A reply length above this is garbage, not a value: refuse it instead of allocating it. Far
// above any value weft's server accepts (store_protocol::kMaxValueBytes).
constexpr uint64_t kMaxStoreReplyBytes = uint64_t{1} << 30;

namespace tcp_store_detail {

// A PING nonce, different per call and per process. Not secret: it only keeps a stale reply from
// passing for a fresh one. (A std::random_device per connection cost 4% of a 1024-client
// rendezvous.)
uint32_t next_ping_nonce();

// "300 s", "1.5 s", "250 ms": durations as error messages print them.
std::string format_duration(std::chrono::milliseconds d);

}  // namespace tcp_store_detail

// Encoding, decoding and the multi-message exchanges (handshake, wait with cancel).
// Not thread-safe: TCPStore::mutex_ guards it.
class TCPStore::Connection {
 public:
  Connection(net::Socket socket, std::string address)
      : socket_(std::move(socket)), address_(std::move(address)) {}

  const std::string& address() const { return address_; }

  // "store 127.0.0.1:29500 get": the `where` of every error.
  std::string where(std::string_view op) const { return fmt::format("store {} {}", address_, op); }

  // Fails fast when an earlier exchange left the stream in an unknown state.
  void check_usable(std::string_view op) const {
    if (broken_) {
      throw Error(broken_code_,
                  fmt::format("{}: {}: connection unusable after an earlier error: {}", where(op),
                              error_code_name(broken_code_), broken_reason_));
    }
  }

  // Refuses keys and values that weft's server would close the connection for, before anything
  // is sent, so the caller learns which limit it broke.
  void check_key(const std::string& key, std::string_view op) const {
    if (key.size() + store_wire::kKeyPrefix.size() > store_protocol::kMaxKeyBytes) {
      throw_error(
          ErrorCode::InvalidArgument, where(op),
          fmt::format("key of {} bytes is longer than the {} a store key may have", key.size(),
                      store_protocol::kMaxKeyBytes - store_wire::kKeyPrefix.size()));
    }
  }
  void check_value(const Bytes& value, std::string_view op) const {
    if (value.size() > store_protocol::kMaxValueBytes) {
      throw_error(ErrorCode::InvalidArgument, where(op),
                  fmt::format("value of {} bytes is larger than the {} a store value may have",
                              value.size(), store_protocol::kMaxValueBytes));
    }
  }

  void send(const store_wire::Request& request, net::Clock::time_point deadline,
            std::string_view op) {
    guarded([&] {
      net::write_all(socket_.fd(), request.data().data(), request.data().size(), deadline,
                     where(op));
    });
  }

  // Reads exactly size bytes, from what an earlier recv buffered first.
  void read(void* data, size_t size, net::Clock::time_point deadline, std::string_view op) {
    auto* out = static_cast<uint8_t*>(data);
    while (size > 0) {
      if (read_begin_ == read_end_) {
        // A large value goes straight to its destination, not through the buffer.
        if (size >= kReadBufferBytes) {
          guarded([&] { net::read_exact(socket_.fd(), out, size, deadline, where(op)); });
          return;
        }
        fill(deadline, op);
      }
      size_t n = std::min(size, read_end_ - read_begin_);
      std::memcpy(out, read_buffer_.get() + read_begin_, n);
      read_begin_ += n;
      out += n;
      size -= n;
    }
  }

  template <typename T>
  T read_value(net::Clock::time_point deadline, std::string_view op) {
    T v{};
    read(&v, sizeof(v), deadline, op);
    return v;
  }

  Bytes read_bytes(net::Clock::time_point deadline, std::string_view op) {
    auto size = read_value<uint64_t>(deadline, op);
    if (size > kMaxStoreReplyBytes) {
      protocol_error(op, fmt::format("reply announces {} bytes, more than the {} allowed", size,
                                     kMaxStoreReplyBytes));
    }
    Bytes out(size);
    if (size > 0) read(out.data(), size, deadline, op);
    return out;
  }

  bool read_check_reply(net::Clock::time_point deadline, std::string_view op) {
    using store_protocol::CheckResponse;
    auto reply = read_value<uint8_t>(deadline, op);
    if (reply == static_cast<uint8_t>(CheckResponse::Ready)) return true;
    if (reply == static_cast<uint8_t>(CheckResponse::NotReady)) return false;
    protocol_error(op, fmt::format("CHECK answered {}, not READY or NOT_READY", reply));
  }

  [[noreturn]] void protocol_error(std::string_view op, std::string_view detail) {
    Error error(ErrorCode::Protocol,
                fmt::format("{}: {}: {}", where(op), error_code_name(ErrorCode::Protocol), detail));
    mark_broken(error);
    throw error;
  }

  // VALIDATE, the optional authentication, then a PING whose echo proves a TCPStore answers.
  void handshake(const std::string& token, net::Clock::time_point deadline);
  // WAIT for keys up to timeout; on expiry CANCEL_WAIT and throw Error(Timeout) naming them.
  // io_timeout bounds the sends and the cancel's reply.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
            std::chrono::milliseconds io_timeout, std::string_view op);

 private:
  void authenticate(const std::string& token, net::Clock::time_point deadline);
  std::string missing_keys(const std::vector<std::string>& keys, net::Clock::time_point deadline);

  // True when a byte can be read before the deadline (or the peer closed: the read reports it).
  bool wait_readable(net::Clock::time_point deadline) {
    if (read_begin_ < read_end_) return true;
    for (;;) {
      auto now = net::Clock::now();
      if (now >= deadline) return false;
      // Rounded up: a truncated poll would return before the deadline and end the wait early.
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      int ms = static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
      pollfd p{socket_.fd(), POLLIN, 0};
      int rc = ::poll(&p, 1, ms);
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return true;
    }
  }

  // Runs one step of an exchange; any error marks the connection broken, then propagates.
  template <typename F>
  void guarded(F&& step) {
    try {
      step();
    } catch (const Error& e) {
      mark_broken(e);
      throw;
    }
  }

  void mark_broken(const Error& e) {
    if (broken_) return;
    broken_ = true;
    broken_code_ = e.code();
    broken_reason_ = e.what();
    socket_.close();
  }

  // Receives whatever the server has sent, up to the buffer's size; at least one byte.
  void fill(net::Clock::time_point deadline, std::string_view op);

  // Replies are read through a buffer: a multi_get of 1024 keys is one or a few recv calls, not
  // two per value (measured: 1024 clients rendezvousing spent most of their time in recv).
  static constexpr size_t kReadBufferBytes = 64 * 1024;

  net::Socket socket_;
  std::string address_;  // "host:port", as the user gave it
  // Not zeroed: only the pages recv writes get touched (a first touch costs ~13 us per 4 KiB
  // page here, and a rendezvous opens a connection per rank).
  std::unique_ptr<uint8_t[]> read_buffer_ =
      std::make_unique_for_overwrite<uint8_t[]>(kReadBufferBytes);
  size_t read_begin_ = 0;  // read_buffer_[read_begin_, read_end_) is received and not yet read
  size_t read_end_ = 0;
  bool broken_ = false;
  ErrorCode broken_code_ = ErrorCode::PeerLost;
  std::string broken_reason_;
};

}  // namespace weft
