// runtime/socket.h: small POSIX socket helpers shared by the store's client and server and the
// TCP backend: an owning fd, connect with backoff, listen, and deadline-bounded blocking I/O.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace weft::net {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor; closes it on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void close();

 private:
  int fd_ = -1;
};

// Resolves host (name, IPv4 or IPv6 literal) and connects, retrying refused or unreachable
// attempts with exponential backoff (10 ms doubling to 1 s, +-25% jitter) until deadline. The
// socket returned is blocking, with TCP_NODELAY. Throws Error(Timeout) naming host:port and the
// last errno text when the deadline passes, and Error(InvalidArgument) at once when the host name
// does not resolve (only a temporary resolver failure, EAI_AGAIN, is retried); `what` starts the
// message ("store client").
//
// `refused_grace`: for an address known to have a listener (a peer's published address), how
// long refusals and unreachable routes may go on before they are final: past it, Error(Io)
// names the address and the error instead of waiting for the deadline. Unresponsive attempts
// (lost SYNs) are still retried until the deadline.
Socket connect_with_retry(
    const std::string& host, uint16_t port, Clock::time_point deadline, std::string_view what,
    std::chrono::milliseconds refused_grace = std::chrono::milliseconds::max());

// Binds host:port (port 0: the kernel picks; "" or "0.0.0.0": every IPv4 interface; "::": every
// interface) and listens with the backlog in /proc/sys/net/core/somaxconn. Sets SO_REUSEADDR.
// Stores the bound port in *bound_port. Throws Error(Io) naming the address and errno's text.
Socket listen_on(const std::string& host, uint16_t port, uint16_t* bound_port);

void set_nonblocking(int fd);
void set_nodelay(int fd);

// Writes all of data, waiting (poll) while the socket is full, until deadline. Throws
// Error(Timeout) at the deadline, Error(PeerLost) when the peer closed, Error(Io) otherwise;
// messages start with `what`.
void write_all(int fd, const void* data, size_t size, Clock::time_point deadline,
               std::string_view what);
// Reads exactly size bytes, with the same deadline and errors as write_all.
void read_exact(int fd, void* data, size_t size, Clock::time_point deadline, std::string_view what);

// "10.0.0.7:4242" or "[::1]:4242" for the socket's peer; "?" when unknown.
std::string peer_address(int fd);

// The numeric host ("10.0.0.7", "::1") of the socket's local end; "" when unknown.
std::string local_host(int fd);

// The first IPv4 address (else IPv6) of network interface `name`; "" when it has none or does
// not exist, with the interfaces that have addresses in *available ("lo=127.0.0.1, eth0=...").
std::string interface_address(const std::string& name, std::string* available);

// True for "localhost", 127.0.0.0/8 and ::1.
bool is_loopback(const std::string& host);

// now + timeout, saturating instead of overflowing for huge timeouts.
Clock::time_point deadline_after(std::chrono::milliseconds timeout);

}  // namespace weft::net
