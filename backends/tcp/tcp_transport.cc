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
#include "runtime/reduce.h"

namespace weft::tcp {
namespace {

using collectives::Clock;
using collectives::Tag;
using detail::InState;
using detail::op_name;
using detail::OpKind;
using detail::tag_text;
using detail::Unexpected;
using detail::WireHeader;

constexpr uint64_t kWakeupKey = ~uint64_t{0};
// Most sends gathered into one sendmsg(): enough to batch a burst of small messages, well under
// IOV_MAX (1024).
constexpr size_t kMaxGatheredSends = 32;

// A header announcing more is corrupt, not a message: no host holds 1 TiB for one receive.
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

// What an unexpected message counts against the limit: its buffer, and its list node and
// bookkeeping (~64 bytes), so that a flood of tiny messages is bounded in memory too.
size_t unexpected_charge(uint64_t bytes) { return detail::BufferPool::capacity_for(bytes) + 64; }

}  // namespace

TcpTransport::TcpTransport(TcpMesh&& mesh, Options options)
    : TcpTransport(mesh.rank(), mesh.size(), mesh.take_sockets(), std::move(options)) {}

TcpTransport::TcpTransport(int rank, int size, std::vector<net::Socket> sockets, Options options)
    : rank_(rank), size_(size), options_(std::move(options)), pool_(options_.unexpected_limit) {
  if (size < 1 || rank < 0 || rank >= size || sockets.size() != static_cast<size_t>(size)) {
    throw error(ErrorCode::InvalidArgument, "tcp transport",
                fmt::format("needs 0 <= rank < size and one socket slot per rank ({} given)",
                            sockets.size()));
  }
  if (options_.staging_bytes < 64) {
    throw error(ErrorCode::InvalidArgument, "tcp transport", "staging_bytes must be >= 64");
  }
  epoll_ = net::Socket(epoll_create1(EPOLL_CLOEXEC));
  wakeup_ = net::Socket(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_.valid() || !wakeup_.valid()) {
    throw error(ErrorCode::Io, "tcp transport",
                fmt::format("epoll/eventfd: {}", std::strerror(errno)));
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
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = static_cast<uint64_t>(r);
    if (epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, peer->socket.fd(), &ev) != 0) {
      throw error(ErrorCode::Io, "tcp transport",
                  fmt::format("epoll_ctl for rank {}: {}", r, std::strerror(errno)));
    }
    peers_[r] = std::move(peer);
  }
  // Touched now, once: a first touch inside a collective would cost ~13 us per 4 KiB page.
  staging_.reset(new uint8_t[options_.staging_bytes]);
  std::memset(staging_.get(), 0, options_.staging_bytes);
}

TcpTransport::~TcpTransport() = default;

Error TcpTransport::error(ErrorCode code, const char* op, const std::string& detail) const {
  ErrorContext context;
  context.rank = rank_;
  context.size = size_;
  context.group = options_.group_name;
  context.op = op;
  return Error(code, context, detail);
}

collectives::Link TcpTransport::link(int peer) const {
  if (peer == rank_) return collectives::Link::Self;
  if (peer < 0 || peer >= size_ || !peers_[peer]) {
    throw error(ErrorCode::InvalidArgument, "tcp link",
                fmt::format("rank {} has no TCP connection here", peer));
  }
  return collectives::Link::Tcp;
}

TcpTransport::Op& TcpTransport::post(int peer, OpKind kind, Tag tag, size_t bytes) {
  if (peer < 0 || peer >= size_ || peer == rank_ || !peers_[peer]) {
    throw error(ErrorCode::InvalidArgument, op_name(kind),
                fmt::format("peer {} is not another rank with a TCP connection here", peer));
  }
  handle_abort();
  auto owned = std::make_unique<Op>();
  Op& op = *owned;
  op.id = next_id_++;
  op.peer = peer;
  op.kind = kind;
  op.tag = tag;
  op.bytes = bytes;
  ops_.emplace(op.id, std::move(owned));
  if (abort_handled_) {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    fail(op, error(ErrorCode::Aborted, op_name(kind), abort_reason_));
  }
  return op;
}

collectives::Request TcpTransport::send(int peer, const void* data, size_t bytes, Tag tag) {
  Op& op = post(peer, OpKind::Send, tag, bytes);
  if (op.finished) return {op.id};
  Peer& p = *peers_[peer];
  if (p.lost) {
    fail(op,
         error(ErrorCode::PeerLost, "tcp send", fmt::format("rank {} {}", peer, p.lost_reason)));
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
  if (!op.finished) match_posted_recv(*peers_[peer], op);
  return {op.id};
}

collectives::Request TcpTransport::recv_reduce(int peer, void* dst, size_t count, DType dtype,
                                               ReduceOp reduce_op, Tag tag) {
  reduce::check_supported(dtype, reduce_op);
  size_t element = dtype_size(dtype);
  if (count > SIZE_MAX / element) {
    throw error(ErrorCode::InvalidArgument, "tcp recv_reduce",
                fmt::format("{} elements of {} overflow size_t", count, dtype_name(dtype)));
  }
  Op& op = post(peer, OpKind::RecvReduce, tag, count * element);
  op.dst = static_cast<uint8_t*>(dst);
  op.dtype = dtype;
  op.reduce_op = reduce_op;
  op.element = element;
  if (!op.finished) match_posted_recv(*peers_[peer], op);
  return {op.id};
}

void TcpTransport::match_posted_recv(Peer& peer, Op& op) {
  auto mismatch = [&](size_t arrived) {
    return error(ErrorCode::Protocol, op_name(op.kind),
                 fmt::format("rank {} sent {} bytes with {} but this rank expects {} bytes",
                             peer.rank, arrived, tag_text(op.tag), op.bytes));
  };
  for (auto it = peer.unexpected.begin(); it != peer.unexpected.end(); ++it) {
    if (it->tag != op.tag) continue;
    Unexpected& u = *it;
    bool in_flight = peer.in_unexpected == &u;
    if (u.size != op.bytes) {
      fail(op, mismatch(u.size));
    } else {
      deliver(op, u.buffer.data.get(), u.got);
      if (!in_flight) complete(op);
    }
    if (in_flight) {
      peer.in_unexpected = nullptr;  // the rest goes to op, or nowhere after a mismatch
      if (!op.finished) peer.in_op = &op;
    }
    peer.unexpected_bytes -= u.charge;
    pool_.release(std::move(u.buffer));
    peer.unexpected.erase(it);
    if (peer.in_state == InState::Paused) on_header(peer);  // the freed room may let it in
    return;
  }
  if (peer.in_state == InState::Paused && peer.in_header.tag == op.tag) {
    peer.recvs.push_front(&op);  // on_header takes the first posted receive with the tag
    on_header(peer);
    return;
  }
  if (peer.lost) {
    fail(op, error(ErrorCode::PeerLost, op_name(op.kind),
                   fmt::format("rank {} {}", peer.rank, peer.lost_reason)));
    return;
  }
  peer.recvs.push_back(&op);
}

void TcpTransport::deliver(Op& op, const uint8_t* src, size_t n) {
  if (op.kind == OpKind::Recv) {
    if (n > 0 && src != op.dst + op.done) std::memcpy(op.dst + op.done, src, n);
    op.done += n;
    return;
  }
  size_t whole = n / op.element * op.element;
  reduce::accumulate(op.dst + op.done, src, whole / op.element, op.dtype, op.reduce_op);
  op.done += whole;
  op.carry_len = n - whole;
  std::memcpy(op.carry, src + whole, op.carry_len);
}

void TcpTransport::on_header(Peer& peer) {
  const WireHeader& h = peer.in_header;
  if (h.bytes > kMaxMessageBytes) {
    lose_peer(peer,
              fmt::format("sent a corrupt header ({} bytes with {})", h.bytes, tag_text(h.tag)));
    return;
  }
  peer.in_op = nullptr;
  peer.in_unexpected = nullptr;
  peer.in_left = h.bytes;
  peer.in_state = InState::Payload;
  auto posted = std::find_if(peer.recvs.begin(), peer.recvs.end(),
                             [&](const Op* op) { return op->tag == h.tag; });
  if (posted != peer.recvs.end()) {
    Op& op = **posted;
    peer.recvs.erase(posted);
    if (op.bytes != h.bytes) {
      fail(op, error(ErrorCode::Protocol, op_name(op.kind),
                     fmt::format("rank {} sent {} bytes with {} but this rank expects {} bytes",
                                 peer.rank, h.bytes, tag_text(h.tag), op.bytes)));
    } else {
      peer.in_op = &op;
    }
  } else if (!peer.hung_up &&
             peer.unexpected_bytes + unexpected_charge(h.bytes) > options_.unexpected_limit) {
    peer.in_state = InState::Paused;
    return;
  } else {
    Unexpected& u = peer.unexpected.emplace_back();
    u.tag = h.tag;
    u.size = h.bytes;
    u.charge = unexpected_charge(h.bytes);
    u.buffer = pool_.acquire(h.bytes);
    peer.unexpected_bytes += u.charge;
    peer.in_unexpected = &u;
  }
  if (peer.in_left == 0) finish_message(peer);
}

void TcpTransport::finish_message(Peer& peer) {
  if (peer.in_op) complete(*peer.in_op);
  peer.in_op = nullptr;
  peer.in_unexpected = nullptr;
  peer.in_state = InState::Header;
  peer.in_header_got = 0;
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
  peer.in_left -= got;
  if (op) {
    op->carry_len = 0;
    deliver(*op, op->kind == OpKind::Recv ? dst : staging_.get(), staged + got);
  } else if (peer.in_unexpected) {
    peer.in_unexpected->got += got;
  }
  if (peer.in_left == 0) finish_message(peer);
  return got;
}

bool TcpTransport::pump_reads(Peer& peer) {
  bool moved = false;
  while (peer.readable && !peer.lost) {
    if (peer.in_state == InState::Paused) {
      if (!peer.hung_up) break;
      on_header(peer);  // buffers it now
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
      complete(op);
    }
  }
  return moved;
}

void TcpTransport::complete(Op& op) {
  op.finished = true;
  if (op.id != 0) return;
  // An orphan (withdrawn send) whose copy is now written: nobody waits for it.
  auto& orphans = peers_[op.peer]->orphans;
  std::erase_if(orphans, [&](const std::unique_ptr<Op>& o) { return o.get() == &op; });
}

void TcpTransport::fail(Op& op, Error e) {
  op.finished = true;
  op.error.emplace(std::move(e));
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
    if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) peer.readable = true;
    if (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) peer.hung_up = true;
    if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) peer.writable = true;
  }
}

void TcpTransport::wait(collectives::Request request, Clock::time_point deadline) {
  auto it = ops_.find(request.id);
  if (it == ops_.end()) {
    throw error(
        ErrorCode::InvalidArgument, "tcp wait",
        fmt::format("request {} is not pending (never posted, or already waited for)", request.id));
  }
  Op& op = *it->second;
  for (;;) {
    handle_abort();
    bool moved = !op.finished && progress();
    if (op.finished) {
      std::unique_ptr<Op> done = std::move(it->second);
      ops_.erase(it);
      if (done->error) throw *done->error;
      return;
    }
    if (Clock::now() >= deadline) {
      std::string detail =
          op.kind == OpKind::Send
              ? fmt::format("send to rank {} ({}) still has {} of {} bytes to write", op.peer,
                            tag_text(op.tag), op.bytes - op.done, op.bytes)
              : fmt::format("nothing complete from rank {} ({}): {} of {} bytes outstanding",
                            op.peer, tag_text(op.tag), op.bytes - op.done, op.bytes);
      Error timeout = error(ErrorCode::Timeout, op_name(op.kind), detail);
      withdraw(op);
      ops_.erase(it);
      throw timeout;
    }
    // Sleep only when a pass moved nothing: every socket then returned EAGAIN (or is paused on
    // purpose), so edge-triggered epoll reports whatever changes next.
    if (!moved) wait_for_events(deadline);
  }
}

bool TcpTransport::test(collectives::Request request) {
  auto it = ops_.find(request.id);
  if (it == ops_.end()) {
    throw error(ErrorCode::InvalidArgument, "tcp test",
                fmt::format("request {} is not pending", request.id));
  }
  handle_abort();
  if (!it->second->finished) {
    // Readiness is edge-triggered and only epoll reports new edges: collect them first, without
    // blocking, or a socket that once returned EAGAIN would never be read again by test() alone.
    wait_for_events(Clock::now());
    progress();
  }
  return it->second->finished;
}

}  // namespace weft::tcp
