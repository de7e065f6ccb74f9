#include "runtime/tcp_store_connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "runtime/store_auth.h"

namespace weft {
namespace {

using store_protocol::QueryType;
using store_wire::Request;
using Clock = net::Clock;
using tcp_store_detail::format_duration;
using tcp_store_detail::next_ping_nonce;

// How many keys a timeout message lists before summarising the rest.
constexpr size_t kMaxKeysNamed = 8;

// "key \"a\"", "keys \"a\", \"b\"", "keys \"k0\", ... (1024 keys)".
std::string describe_keys(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return fmt::format("key \"{}\"", keys[0]);
  std::string out = "keys ";
  for (size_t i = 0; i < keys.size() && i < kMaxKeysNamed; ++i) {
    if (i > 0) out += ", ";
    out += fmt::format("\"{}\"", keys[i]);
  }
  if (keys.size() > kMaxKeysNamed) out += fmt::format(", ... ({} keys)", keys.size());
  return out;
}

}  // namespace

namespace tcp_store_detail {

uint32_t next_ping_nonce() {
  static std::atomic<uint64_t> counter{
      static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
      (static_cast<uint64_t>(::getpid()) << 32)};
  // splitmix64's finaliser spreads consecutive counter values over all bits.
  uint64_t z = counter.fetch_add(0x9E3779B97F4A7C15ull, std::memory_order_relaxed);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

std::string format_duration(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return fmt::format("{} s", d.count() / 1000);
  if (d.count() > 1000) return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0);
  return fmt::format("{} ms", d.count());
}

}  // namespace tcp_store_detail

void TCPStore::Connection::fill(Clock::time_point deadline, std::string_view op) {
  read_begin_ = read_end_ = 0;
  // A reply is rarely there yet when fill() runs (its request was just sent): poll first, which
  // saves the recv that would fail with EAGAIN.
  bool readable = wait_readable(deadline);
  for (;;) {
    ssize_t n =
        readable ? ::recv(socket_.fd(), read_buffer_.get(), kReadBufferBytes, MSG_DONTWAIT) : -1;
    if (n > 0) {
      read_end_ = static_cast<size_t>(n);
      return;
    }
    Error error(ErrorCode::Io, "");
    if (!readable) {
      error = Error(ErrorCode::Timeout,
                    fmt::format("{}: Timeout: timed out waiting for a reply", where(op)));
    } else if (n == 0) {
      error = Error(ErrorCode::PeerLost,
                    fmt::format("{}: PeerLost: connection closed by peer", where(op)));
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      readable = wait_readable(deadline);
      continue;
    } else if (errno == ECONNRESET) {
      error = Error(ErrorCode::PeerLost,
                    fmt::format("{}: PeerLost: connection reset by peer", where(op)));
    } else {
      error =
          Error(ErrorCode::Io, fmt::format("{}: Io: recv: {}", where(op), std::strerror(errno)));
    }
    mark_broken(error);
    throw error;
  }
}

void TCPStore::Connection::handshake(const std::string& token, Clock::time_point deadline) {
  send(Request(QueryType::Validate).value<uint32_t>(store_protocol::kValidationMagic), deadline,
       "connect");
  if (!token.empty()) authenticate(token, deadline);

  // A random nonce (PyTorch sends its pid) so that a stale reply cannot pass for this one.
  const uint32_t nonce = next_ping_nonce();
  try {
    send(Request(QueryType::Ping).value<uint32_t>(nonce), deadline, "connect");
    auto echoed = read_value<uint32_t>(deadline, "connect");
    if (echoed != nonce) {
      protocol_error("connect", fmt::format("PING echoed {:#x} instead of {:#x}: is this a "
                                            "TCPStore server?",
                                            echoed, nonce));
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::PeerLost || !token.empty()) throw;
    throw_error(ErrorCode::PeerLost, where("connect"),
                fmt::format("the server closed the connection after VALIDATE and PING; it may "
                            "require authentication (set WEFT_STORE_TOKEN to its token) ({})",
                            e.what()));
  }
}

void TCPStore::Connection::authenticate(const std::string& token, Clock::time_point deadline) {
  try {
    send(Request(QueryType::AuthChallenge), deadline, "authenticate");
    store_auth::Nonce nonce{};
    read(nonce.data(), nonce.size(), deadline, "authenticate");
    auto mac = store_auth::prove(token, nonce);
    send(Request(QueryType::AuthProof).raw(mac.data(), mac.size()), deadline, "authenticate");
    auto accepted = read_value<uint8_t>(deadline, "authenticate");
    if (accepted == 1) return;
    if (accepted != 0) {
      protocol_error("authenticate", fmt::format("AUTH_PROOF answered {}, not 0 or 1", accepted));
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::PeerLost) throw;
    throw_error(ErrorCode::PeerLost, where("authenticate"),
                fmt::format("the server closed the connection during authentication: it may not "
                            "support weft's authentication extension (PyTorch's TCPStore does "
                            "not: unset WEFT_STORE_TOKEN for it) ({})",
                            e.what()));
  }
  Error refused(ErrorCode::InvalidArgument,
                fmt::format("{}: InvalidArgument: store at {} refused the token (WEFT_STORE_TOKEN "
                            "differs from the server's)",
                            where("authenticate"), address_));
  mark_broken(refused);
  throw refused;
}

void TCPStore::Connection::wait(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout,
                                std::chrono::milliseconds io_timeout, std::string_view op) {
  using store_protocol::WaitResponse;
  if (timeout.count() < 0) {
    throw_error(ErrorCode::InvalidArgument, where(op),
                fmt::format("timeout of {} ms is negative", timeout.count()));
  }
  if (timeout.count() == 0) {
    // Look once, never wait: a WAIT would be cancelled before its reply could cross the wire.
    Request check(QueryType::Check);
    check.value<uint64_t>(keys.size());
    for (const auto& key : keys) check.key(key);
    const auto io_deadline = net::deadline_after(io_timeout);
    send(check, io_deadline, op);
    if (read_check_reply(io_deadline, op)) return;
    throw_error(ErrorCode::Timeout, where(op),
                fmt::format("{} not set (timeout 0: looked once){}", describe_keys(keys),
                            missing_keys(keys, io_deadline)));
  }
  const auto deadline = net::deadline_after(timeout);
  Request request(QueryType::Wait);
  request.value<uint64_t>(keys.size());
  for (const auto& key : keys) request.key(key);
  send(request, net::deadline_after(io_timeout), op);

  const auto stop = static_cast<uint8_t>(WaitResponse::StopWaiting);
  const auto canceled = static_cast<uint8_t>(WaitResponse::WaitCanceled);
  if (wait_readable(deadline)) {
    auto reply = read_value<uint8_t>(net::deadline_after(io_timeout), op);
    if (reply != stop) protocol_error(op, fmt::format("WAIT answered {}, not STOP_WAITING", reply));
    return;
  }
  // Timed out client-side: withdraw the WAIT. The server may have answered it just before the
  // cancel arrived, so a STOP_WAITING may precede WAIT_CANCELED.
  const auto cancel_deadline = net::deadline_after(io_timeout);
  send(Request(QueryType::CancelWait), cancel_deadline, op);
  auto reply = read_value<uint8_t>(cancel_deadline, op);
  if (reply == stop) reply = read_value<uint8_t>(cancel_deadline, op);
  if (reply != canceled) {
    protocol_error(op, fmt::format("CANCEL_WAIT answered {}, not WAIT_CANCELED", reply));
  }
  throw_error(ErrorCode::Timeout, where(op),
              fmt::format("after {} waiting for {}{} (raise the timeout or WEFT_TIMEOUT if the "
                          "peers are only slow)",
                          format_duration(timeout), describe_keys(keys),
                          missing_keys(keys, cancel_deadline)));
}

// " (missing: "b", "d")" for a wait on several keys, so that the message says who is late: one
// pipelined CHECK per key. Best effort: the wait has already failed, so a failure here only
// drops the detail.
std::string TCPStore::Connection::missing_keys(const std::vector<std::string>& keys,
                                               Clock::time_point deadline) {
  if (keys.size() < 2 || keys.size() > 64) return "";
  try {
    Request batch(QueryType::Check);
    batch.value<uint64_t>(1).key(keys[0]);
    for (size_t i = 1; i < keys.size(); ++i) {
      batch.append(Request(QueryType::Check).value<uint64_t>(1).key(keys[i]));
    }
    send(batch, deadline, "wait");
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (!read_check_reply(deadline, "wait")) missing.push_back(key);
    }
    if (missing.empty()) return "";
    return fmt::format(" (missing: {})", describe_keys(missing));
  } catch (const Error&) {
    return "";
  }
}

}  // namespace weft
