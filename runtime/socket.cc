#include "runtime/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/fd_limit.h"

namespace weft::net {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

int milliseconds_until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits until fd is ready for `events`; false when the deadline passed first.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, milliseconds_until(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the following read/write report the error
  }
}

int somaxconn() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int value = 0;
  if (in >> value && value > 0) return value;
  return SOMAXCONN;
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head) freeaddrinfo(head);
  }
};

}  // namespace

Socket::~Socket() { close(); }

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_error(ErrorCode::Io, "socket", fmt::format("fcntl(O_NONBLOCK): {}", errno_text(errno)));
  }
}

void set_nodelay(int fd) {
  int one = 1;
  // Fails only on non-TCP sockets (Unix sockets in tests); nothing to do then.
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  auto now = Clock::now();
  if (timeout.count() < 0) return now;
  if (timeout > std::chrono::hours(24 * 365 * 10)) return Clock::time_point::max();
  return now + timeout;
}

Socket connect_with_retry(const std::string& host, uint16_t port, Clock::time_point deadline,
                          std::string_view what, std::chrono::milliseconds refused_grace) {
  std::string target = fmt::format("{}:{}", host, port);
  // When the current run of refusals began (time_point::max(): none); reset by other outcomes.
  Clock::time_point refused_since = Clock::time_point::max();
  std::mt19937 rng(std::random_device{}());
  auto backoff = std::chrono::milliseconds(10);
  std::string last_error = "no attempt made";
  for (;;) {
    AddrInfoList addrs;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addrs.head);
    if (rc != 0) {
      last_error = fmt::format("cannot resolve \"{}\": {}", host, gai_strerror(rc));
      // Only a temporary failure (EAI_AGAIN: no answer from the name server) or a system error is
      // worth another try; "no such name" is the resolver's final word.
      if (rc != EAI_AGAIN && rc != EAI_SYSTEM && rc != EAI_MEMORY) {
        throw_error(ErrorCode::InvalidArgument, what,
                    fmt::format("{}:{}: the host \"{}\" does not resolve ({})", host, port, host,
                                gai_strerror(rc)));
      }
    } else {
      for (addrinfo* a = addrs.head; a; a = a->ai_next) {
        Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!s.valid()) {
          // Out of descriptors: retrying until the deadline would only delay the same error.
          if (out_of_descriptors(errno)) {
            throw_error(ErrorCode::Io, what,
                        fmt::format("socket() to connect to {}: {}", target, fd_error_text(errno)));
          }
          last_error = errno_text(errno);
          continue;
        }
        // Non-blocking connect so that the attempt itself respects the deadline.
        set_nonblocking(s.fd());
        rc = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          if (!wait_ready(s.fd(), POLLOUT, deadline)) {
            last_error = "connect timed out";
            continue;
          }
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        }
        if (rc != 0) {
          const int err = errno;
          last_error = errno_text(err);
          const bool refused = err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH ||
                               err == EADDRNOTAVAIL;
          if (!refused) {
            refused_since = Clock::time_point::max();
          } else if (refused_since == Clock::time_point::max()) {
            refused_since = Clock::now();
          } else if (refused_grace != std::chrono::milliseconds::max() &&
                     Clock::now() - refused_since >= refused_grace) {
            throw_error(ErrorCode::Io, what,
                        fmt::format("{} refuses connections or is unreachable ({}), still after "
                                    "{} ms",
                                    target, last_error, refused_grace.count()));
          }
          continue;
        }
        int flags = fcntl(s.fd(), F_GETFL, 0);
        fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK);
        set_nodelay(s.fd());
        return s;
      }
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::uniform_real_distribution<double> jitter(0.75, 1.25);
    auto pause = std::chrono::duration_cast<Clock::duration>(backoff * jitter(rng));
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  throw_error(ErrorCode::Timeout, what,
              fmt::format("could not connect to {} before the timeout: {}", target, last_error));
}

Socket listen_on(const std::string& host, uint16_t port, uint16_t* bound_port) {
  std::string bind_host = host.empty() ? "0.0.0.0" : host;
  std::string target = fmt::format("{}:{}", bind_host, port);
  AddrInfoList addrs;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(bind_host.c_str(), std::to_string(port).c_str(), &hints, &addrs.head);
  if (rc != 0) {
    throw_error(ErrorCode::Io, "listen",
                fmt::format("cannot resolve \"{}\": {}", bind_host, gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = addrs.head; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      last_error = fd_error_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.fd(), somaxconn()) != 0) {
      last_error = errno_text(errno);
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
    uint16_t p = addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port;
    if (bound_port) *bound_port = ntohs(p);
    return s;
  }
  throw_error(ErrorCode::Io, "listen", fmt::format("cannot listen on {}: {}", target, last_error));
}

void write_all(int fd, const void* data, size_t size, Clock::time_point deadline,
               std::string_view what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, deadline)) {
        throw_error(ErrorCode::Timeout, what, "timed out sending");
      }
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      throw_error(ErrorCode::PeerLost, what,
                  fmt::format("connection closed by peer while sending ({})", errno_text(errno)));
    }
    throw_error(ErrorCode::Io, what, fmt::format("send: {}", errno_text(errno)));
  }
}

void read_exact(int fd, void* data, size_t size, Clock::time_point deadline,
                std::string_view what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw_error(ErrorCode::PeerLost, what, "connection closed by peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLIN, deadline)) {
        throw_error(ErrorCode::Timeout, what, "timed out waiting for a reply");
      }
      continue;
    }
    if (errno == ECONNRESET) {
      throw_error(ErrorCode::PeerLost, what, "connection reset by peer");
    }
    throw_error(ErrorCode::Io, what, fmt::format("recv: {}", errno_text(errno)));
  }
}

std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    return fmt::format("{}:{}", text, ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return fmt::format("[{}]:{}", text, ntohs(a->sin6_port));
  }
  return "?";
}

std::string local_host(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[NI_MAXHOST] = {};
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, text, sizeof(text), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return "";
  }
  return text;
}

std::string interface_address(const std::string& name, std::string* available) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string v4, v6;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    char text[NI_MAXHOST] = {};
    if (getnameinfo(a->ifa_addr, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    if (available != nullptr && family == AF_INET) {
      *available += fmt::format("{}{}={}", available->empty() ? "" : ", ", a->ifa_name, text);
    }
    if (name != a->ifa_name) continue;
    if (family == AF_INET && v4.empty()) v4 = text;
    // Link-local IPv6 addresses need a scope to be reachable; getnameinfo appends "%if" to them.
    if (family == AF_INET6 && v6.empty()) v6 = text;
  }
  freeifaddrs(list);
  return v4.empty() ? v6 : v4;
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

}  // namespace weft::net
