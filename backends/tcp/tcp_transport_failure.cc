// TcpTransport's failure paths: a lost peer, a request withdrawn at its deadline, abort().
// Kept apart from tcp_transport.cc (the data path) to keep each file readable on its own; what
// they do to the queues is the MessageMatcher's, shared with the shared-memory transport.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <optional>

#include "backends/tcp/tcp_transport.h"

namespace weft::tcp {

void TcpTransport::lose_peer(Peer& peer, const std::string& hang_up) {
  if (peer.lost) return;
  // After abort(), this rank's own shutdown of the connections reads as a hang-up: what the
  // caller must act on is the abort, not a peer that only looks lost.
  if (matcher_.aborted()) {
    handle_abort();
    return;
  }
  // A peer that aborted sent its marker as urgent data before hanging up: say so, rather than
  // "closed its connection", which reads as an exit or a crash.
  take_abort_marker(peer);
  if (!peer.aborted && skipped_abort_marker(peer)) peer.aborted = true;
  const std::string why = peer.aborted ? backends::MessageMatcher::kPeerAborted : hang_up;
  // The fd stays open (shut down) until the transport dies, so that abort() on another thread
  // never touches a reused descriptor number.
  epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, peer.socket.fd(), nullptr);
  ::shutdown(peer.socket.fd(), SHUT_RDWR);
  matcher_.fail_peer(peer, why);
}

void TcpTransport::take_abort_marker(Peer& peer) {
  char marker = 0;
  if (::recv(peer.socket.fd(), &marker, 1, MSG_OOB | MSG_DONTWAIT) == 1 &&
      marker == backends::MessageMatcher::kAbortMarker) {
    peer.aborted = true;
  }
}

namespace {

// The kernel's count of bytes received on a TCP connection (in order, urgent ones included).
std::optional<uint64_t> bytes_received(int fd) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
      length < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
    return std::nullopt;  // not TCP, or a kernel before 4.1
  }
  return info.tcpi_bytes_received;
}

}  // namespace

bool TcpTransport::skipped_abort_marker(const Peer& peer) const {
  // The stream is read to its end (EOF, or the reset once the queue is drained) when this runs,
  // so every byte received was returned by a read, except urgent ones: only abort() sends those.
  std::optional<uint64_t> received = bytes_received(peer.socket.fd());
  return received && *received > peer.bytes_read;
}

uint64_t TcpTransport::bytes_read_so_far(int fd) {
  int unread = 0;
  if (::ioctl(fd, FIONREAD, &unread) != 0) unread = 0;    // first: data arriving after it adds
  std::optional<uint64_t> received = bytes_received(fd);  // to this count only
  if (!received) return 0;
  return *received >= static_cast<uint64_t>(unread) ? *received - static_cast<uint64_t>(unread) : 0;
}

void TcpTransport::withdraw(Op& op) {
  if (op.peer == collectives::kAnySource) {
    matcher_.withdraw_unbound(op);
    return;
  }
  matcher_.withdraw(*peers_[op.peer], op);
}

void TcpTransport::abort(const std::string& reason) {
  if (!matcher_.mark_aborted(reason)) return;
  // Shutting the connections down tells the peers at once (they see PeerLost) instead of
  // leaving them to their timeouts. The fds themselves are closed only by the destructor.
  for (auto& peer : peers_) {
    if (!peer) continue;
    // Urgent data stays out of the byte stream, whatever the owner thread is writing into it.
    const char marker = backends::MessageMatcher::kAbortMarker;
    (void)::send(peer->socket.fd(), &marker, 1, MSG_OOB | MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(peer->socket.fd(), SHUT_RDWR);
  }
  uint64_t one = 1;
  ssize_t ignored = ::write(wakeup_.fd(), &one, sizeof(one));
  (void)ignored;
}

void TcpTransport::handle_abort() {
  if (!matcher_.handle_abort()) return;
  for (auto& peer : peers_) {
    if (peer) matcher_.clear_aborted(*peer);
  }
}

}  // namespace weft::tcp
