#include "backends/tcp/tcp_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "backends/tcp/tcp_mesh.h"
#include "runtime/fd_limit.h"
#include "runtime/reduce.h"

namespace weft::tcp {
namespace {

using backends::InState;
using backends::MessageMatcher;
using backends::OpKind;
using backends::WireHeader;
using collectives::Clock;
using collectives::Tag;
using collectives::tag_text;

constexpr uint64_t kWakeupKey = ~uint64_t{0};
// Most sends gathered into one sendmsg(): enough to batch a burst of small messages, well under
// IOV_MAX (1024).
constexpr size_t kMaxGatheredSends = 32;

// A header announcing more is corrupt, not a message: no host holds 1 TiB for one receive.
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

MessageMatcher::Options matcher_options(const TcpTransport::Options& options) {
  MessageMatcher::Options matcher;
  matcher.transport = "tcp";
  matcher.group_name = options.group_name;
  matcher.unexpected_limit = options.unexpected_limit;
  return matcher;
}

}  // namespace

TcpTransport::TcpTransport(TcpMesh&& mesh, Options options)
    : TcpTransport(mesh.rank(), mesh.size(), mesh.take_sockets(), std::move(options)) {}

TcpTransport::TcpTransport(int rank, int size, std::vector<net::Socket> sockets, Options options)
    : options_(std::move(options)), matcher_(rank, size, matcher_options(options_)) {
  if (size < 1 || rank < 0 || rank >= size || sockets.size() != static_cast<size_t>(size)) {
    throw matcher_.error(
        ErrorCode::InvalidArgument, "tcp transport",
        fmt::format("needs 0 <= rank < size and one socket slot per rank ({} given)",
                    sockets.size()));
  }
  if (options_.staging_bytes < 64) {
    throw matcher_.error(ErrorCode::InvalidArgument, "tcp transport",
                         "staging_bytes must be >= 64");
  }
  epoll_ = net::Socket(epoll_create1(EPOLL_CLOEXEC));
  wakeup_ = net::Socket(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_.valid() || !wakeup_.valid()) {
    throw matcher_.error(ErrorCode::Io, "tcp transport",
                         fmt::format("epoll/eventfd: {}", fd_error_text(errno, size)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeupKey;
  epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, wakeup_.fd(), &ev);
  peers_.resize(size);
  for (int r = 0; r < size; ++r) {
    if (!sockets[r].valid() || r == rank) continue;
    auto peer = std::make_unique<Peer>();
    peer->rank = r;
    peer->socket = std::move(sockets[r]);
    net::set_nonblocking(peer->socket.fd());
    net::set_nodelay(peer->socket.fd());
    peer->bytes_read = bytes_read_so_far(peer->socket.fd());
    // EPOLLPRI: a peer's abort marker (urgent data), read before the stream passes its mark.
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET;
    ev.data.u64 = static_cast<uint64_t>(r);
    if (epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, peer->socket.fd(), &ev) != 0) {
      throw matcher_.error(ErrorCode::Io, "tcp transport",
                           fmt::format("epoll_ctl for rank {}: {}", r, std::strerror(errno)));
    }
    peers_[r] = std::move(peer);
  }
  // Touched now, once: a first touch inside a collective would cost ~13 us per 4 KiB page.
  staging_.reset(new uint8_t[options_.staging_bytes]);
  std::memset(staging_.get(), 0, options_.staging_bytes);
}

TcpTransport::~TcpTransport() = default;

collectives::Link TcpTransport::link(int peer) const {
  if (peer == matcher_.rank()) return collectives::Link::Self;
  if (peer < 0 || peer >= matcher_.size() || !peers_[peer]) {
    throw matcher_.error(ErrorCode::InvalidArgument, "tcp link",
                         fmt::format("rank {} has no TCP connection here", peer));
  }
  return collectives::Link::Tcp;
}

TcpTransport::Op& TcpTransport::post(int peer, OpKind kind, Tag tag, size_t bytes) {
  if (peer < 0 || peer >= matcher_.size() || peer == matcher_.rank() || !peers_[peer]) {
    throw matcher_.error(
        ErrorCode::InvalidArgument, matcher_.op_name(kind),
        fmt::format("peer {} is not another rank with a TCP connection here", peer));
  }
  handle_abort();
  return matcher_.post(peer, kind, tag, bytes);
}

collectives::Request TcpTransport::send(int peer, const void* data, size_t bytes, Tag tag) {
  Op& op = post(peer, OpKind::Send, tag, bytes);
  if (op.finished) return {op.id};
  Peer& p = *peers_[peer];
  if (p.lost) {
    matcher_.fail(op, matcher_.error(ErrorCode::PeerLost, "tcp send",
                                     fmt::format("rank {} {}", peer, p.lost_reason)));
    return {op.id};
  }
  op.src = static_cast<const uint8_t*>(data);
  op.header = WireHeader{tag, bytes};
  p.sends.push_back(&op);
  // Eagerly: a small message usually fits the socket buffer, and leaving it for wait() would
  // add the poster's compute time to its latency.
  if (p.sends.size() == 1) pump_writes(p);
  return {op.id};
}

collectives::Request TcpTransport::recv(int peer, void* data, size_t bytes, Tag tag) {
  Op& op = post(peer, OpKind::Recv, tag, bytes);
  op.dst = static_cast<uint8_t*>(data);
  if (!op.finished) matcher_.match_posted_recv(*peers_[peer], op);
  return {op.id};
}

collectives::Request TcpTransport::recv_any(void* data, size_t bytes, Tag tag, int* source) {
  handle_abort();
  auto [op, peer] = matcher_.post_any_source(peers_, data, bytes, tag, source);
  if (peer != nullptr) matcher_.match_posted_recv(*peer, *op);
  return {op->id};
}

collectives::Request TcpTransport::recv_reduce(int peer, void* dst, size_t count, DType dtype,
                                               ReduceOp reduce_op, Tag tag) {
  reduce::check_supported(dtype, reduce_op);
  size_t element = dtype_size(dtype);
  if (count > SIZE_MAX / element) {
    throw matcher_.error(
        ErrorCode::InvalidArgument, "tcp recv_reduce",
        fmt::format("{} elements of {} overflow size_t", count, dtype_name(dtype)));
  }
  Op& op = post(peer, OpKind::RecvReduce, tag, count * element);
  op.dst = static_cast<uint8_t*>(dst);
  op.dtype = dtype;
  op.reduce_op = reduce_op;
  op.element = element;
  if (!op.finished) matcher_.match_posted_recv(*peers_[peer], op);
  return {op.id};
}

void TcpTransport::on_header(Peer& peer) {
  peer.in_header_got = 0;  // the header is whole in in_header: the next one starts afresh
  const WireHeader& h = peer.in_header;
  if (h.bytes > kMaxMessageBytes) {
    lose_peer(peer,
              fmt::format("sent a corrupt header ({} bytes with {})", h.bytes, tag_text(h.tag)));
    return;
  }
  matcher_.start_payload(peer);
}

size_t TcpTransport::read_payload(Peer& peer) {
  Op* op = peer.in_op;
  uint8_t* dst;
  size_t want = peer.in_left;
  size_t staged = 0;  // bytes of a reduce's carried partial element placed before the read
  if (op && op->kind == OpKind::Recv) {
    dst = op->dst + op->done;
  } else if (peer.in_unexpected) {
    dst = peer.in_unexpected->buffer.data.get() + peer.in_unexpected->got;
  } else {
    // A reduce (the carried bytes go first so that elements stay aligned) or a discard.
    if (op) {
      staged = op->carry_len;
      std::memcpy(staging_.get(), op->carry, staged);
    }
    dst = staging_.get() + staged;
    want = std::min(want, options_.staging_bytes - staged);
  }
  ssize_t n;
  do {
    n = ::recv(peer.socket.fd(), dst, want, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      peer.readable = false;
    } else {
      lose_peer(peer, n == 0 ? "closed its connection"
                             : fmt::format("reset the connection ({})", std::strerror(errno)));
    }
    return 0;
  }
  size_t got = static_cast<size_t>(n);
  peer.bytes_read += got;
  peer.in_left -= got;
  if (op) {
    op->carry_len = 0;
    MessageMatcher::deliver(*op, op->kind == OpKind::Recv ? dst : staging_.get(), staged + got);
  } else if (peer.in_unexpected) {
    peer.in_unexpected->got += got;
  }
  if (peer.in_left == 0) matcher_.finish_message(peer);
  return got;
}

bool TcpTransport::pump_reads(Peer& peer) {
  bool moved = false;
  while (peer.readable && !peer.lost) {
    if (peer.in_state == InState::Paused) {
      if (!peer.draining) break;
      matcher_.start_payload(peer);  // buffers it now
      continue;
    }
    if (peer.in_state == InState::Payload) {
      if (read_payload(peer) == 0) break;
      moved = true;
      continue;
    }
    auto* header = reinterpret_cast<uint8_t*>(&peer.in_header);
    ssize_t n = ::recv(peer.socket.fd(), header + peer.in_header_got,
                       sizeof(WireHeader) - peer.in_header_got, MSG_DONTWAIT);
    if (n > 0) {
      moved = true;
      peer.bytes_read += static_cast<uint64_t>(n);
      peer.in_header_got += static_cast<size_t>(n);
      if (peer.in_header_got == sizeof(WireHeader)) on_header(peer);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      peer.readable = false;
    } else {
      lose_peer(peer, n == 0 ? "closed its connection"
                             : fmt::format("reset the connection ({})", std::strerror(errno)));
    }
  }
  return moved;
}

bool TcpTransport::pump_writes(Peer& peer) {
  bool moved = false;
  while (peer.writable && !peer.lost && !peer.sends.empty()) {
    iovec iov[2 * kMaxGatheredSends];
    size_t count = 0;
    for (size_t i = 0; i < peer.sends.size() && i < kMaxGatheredSends; ++i) {
      Op& op = *peer.sends[i];
      if (op.header_done < sizeof(WireHeader)) {
        iov[count++] = {reinterpret_cast<uint8_t*>(&op.header) + op.header_done,
                        sizeof(WireHeader) - op.header_done};
      }
      if (op.done < op.bytes) {
        iov[count++] = {const_cast<uint8_t*>(op.src) + op.done, op.bytes - op.done};
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    ssize_t n = ::sendmsg(peer.socket.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        peer.writable = false;
      } else {
        lose_peer(peer, fmt::format("reset the connection ({})", std::strerror(errno)));
      }
      break;
    }
    moved = true;
    size_t left = static_cast<size_t>(n);
    while (!peer.sends.empty()) {
      Op& op = *peer.sends.front();
      size_t header = std::min(left, sizeof(WireHeader) - op.header_done);
      op.header_done += header;
      left -= header;
      size_t payload = std::min(left, op.bytes - op.done);
      op.done += payload;
      left -= payload;
      if (op.header_done < sizeof(WireHeader) || op.done < op.bytes) break;
      peer.sends.pop_front();
      matcher_.sent(peer, op);
    }
  }
  return moved;
}

bool TcpTransport::progress() {
  bool moved = false;
  for (auto& peer : peers_) {
    if (!peer || peer->lost) continue;
    moved |= pump_writes(*peer);
    moved |= pump_reads(*peer);
  }
  return moved;
}

void TcpTransport::wait_for_events(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  int timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
  epoll_event events[64];
  int n = epoll_wait(epoll_.fd(), events, 64, timeout_ms);
  for (int i = 0; i < n; ++i) {
    uint64_t key = events[i].data.u64;
    if (key == kWakeupKey) continue;  // abort(): handled by the caller's loop
    Peer& peer = *peers_[key];
    uint32_t e = events[i].events;
    // Errors and hang-ups are found by the next read or write, which reports them properly.
    if (e & EPOLLPRI) take_abort_marker(peer);
    if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) peer.readable = true;
    if (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) peer.draining = true;  // it hung up
    if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) peer.writable = true;
  }
}

void TcpTransport::wait(collectives::Request request, Clock::time_point deadline) {
  Op& op = matcher_.pending(request, "tcp wait");
  for (;;) {
    handle_abort();
    const bool moved = !op.finished && progress();
    if (matcher_.settle(op, deadline, [&] { withdraw(op); })) return;
    // Sleep only when a pass moved nothing: every socket then returned EAGAIN (or is paused on
    // purpose), so edge-triggered epoll reports whatever changes next.
    if (!moved) wait_for_events(deadline);
  }
}

void TcpTransport::poll() {
  handle_abort();
  wait_for_events(Clock::now());
  progress();
}

bool TcpTransport::test(collectives::Request request) {
  Op& op = matcher_.pending(request, "tcp test");
  handle_abort();
  if (!op.finished) {
    // Readiness is edge-triggered and only epoll reports new edges: collect them first, without
    // blocking, or a socket that once returned EAGAIN would never be read again by test() alone.
    wait_for_events(Clock::now());
    progress();
  }
  return op.finished;
}

}  // namespace weft::tcp
