#include "tests/store_protocol/raw_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/store_protocol.h"

namespace weft::test {
namespace {

std::string le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return out;
}

int ms_left(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

}  // namespace

Frame& Frame::u8(uint8_t v) {
  data_.push_back(static_cast<char>(v));
  return *this;
}
Frame& Frame::u32(uint32_t v) { return raw(le(v, 4)); }
Frame& Frame::u64(uint64_t v) { return raw(le(v, 8)); }
Frame& Frame::str(std::string_view s) {
  u64(s.size());
  return raw(s);
}
Frame& Frame::raw(std::string_view s) {
  data_.append(s);
  return *this;
}

Frame validate_frame() { return Frame().u8(0).u32(store_protocol::kValidationMagic); }

std::string le_u64(uint64_t v) { return le(v, 8); }
std::string le_i64(int64_t v) { return le(static_cast<uint64_t>(v), 8); }
std::string le_u32(uint32_t v) { return le(v, 4); }
std::string reply_bytes(std::string_view value) {
  return le_u64(value.size()) + std::string(value);
}

RawClient::RawClient(uint16_t port, bool send_validate)
    : socket_(net::connect_with_retry("127.0.0.1", port, net::deadline_after(5s), "raw client")) {
  // A blocking send that the server never drains fails after 10 s instead of hanging the test.
  timeval limit{10, 0};
  ::setsockopt(socket_.fd(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  if (send_validate) send(validate_frame());
}

void RawClient::send(std::string_view bytes) {
  sent_.append(bytes);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(socket_.fd(), bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // The server closed on us (what hostile-input tests provoke): later reads report it.
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return;
    throw std::runtime_error(fmt::format("raw client: send failed: {}", std::strerror(errno)));
  }
}

void RawClient::send_bytewise(std::string_view bytes) {
  for (char b : bytes) send(std::string_view(&b, 1));
}

std::string RawClient::read(size_t n, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string out;
  while (out.size() < n) {
    pollfd p{socket_.fd(), POLLIN, 0};
    int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc == 0) {
      throw std::runtime_error(fmt::format("raw client: {} of {} reply bytes within {} ms",
                                           out.size(), n, timeout.count()));
    }
    char buf[65536];
    ssize_t got = ::recv(socket_.fd(), buf, std::min(sizeof(buf), n - out.size()), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw std::runtime_error(
          fmt::format("raw client: connection closed after {} of {} bytes", out.size(), n));
    }
    out.append(buf, static_cast<size_t>(got));
  }
  received_.append(out);
  return out;
}

bool RawClient::silent_for(std::chrono::milliseconds window) {
  pollfd p{socket_.fd(), POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(window.count())) == 0;
}

bool RawClient::closed_by_server(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pollfd p{socket_.fd(), POLLIN, 0};
    if (::poll(&p, 1, ms_left(deadline)) == 0) return false;
    char buf[65536];
    ssize_t got = ::recv(socket_.fd(), buf, sizeof(buf), 0);
    if (got == 0) return true;
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == ECONNRESET;
    }
    received_.append(buf, static_cast<size_t>(got));
  }
}

void RawClient::shutdown_write() { ::shutdown(socket_.fd(), SHUT_WR); }

size_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace weft::test
