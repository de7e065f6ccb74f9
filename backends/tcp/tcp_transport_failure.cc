// TcpTransport's failure paths: a lost peer, a request withdrawn at its deadline, abort().
// Kept apart from tcp_transport.cc (the data path) to keep each file readable on its own.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "backends/tcp/tcp_transport.h"

namespace weft::tcp {

using detail::InState;
using detail::op_name;
using detail::OpKind;
using detail::tag_text;

void TcpTransport::lose_peer(Peer& peer, const std::string& why) {
  if (peer.lost) return;
  // After abort(), this rank's own shutdown of the connections reads as a hang-up: what the
  // caller must act on is the abort, not a peer that only looks lost.
  if (aborted_.load()) {
    handle_abort();
    return;
  }
  peer.lost = true;
  peer.lost_reason = why;
  // The fd stays open (shut down) until the transport dies, so that abort() on another thread
  // never touches a reused descriptor number.
  epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, peer.socket.fd(), nullptr);
  ::shutdown(peer.socket.fd(), SHUT_RDWR);
  auto lost = [&](Op& op) {
    if (op.id == 0) return;
    fail(op, error(ErrorCode::PeerLost, op_name(op.kind),
                   fmt::format("rank {} {} ({}, {} of {} bytes transferred)", peer.rank, why,
                               tag_text(op.tag), op.done, op.bytes)));
  };
  for (Op* op : peer.sends) lost(*op);
  for (Op* op : peer.recvs) lost(*op);
  if (peer.in_op) lost(*peer.in_op);
  peer.sends.clear();
  peer.recvs.clear();
  peer.orphans.clear();
  if (peer.in_unexpected) {
    peer.unexpected_bytes -= peer.in_unexpected->charge;
    peer.unexpected.pop_back();  // the incomplete one is always the last
  }
  peer.in_op = nullptr;
  peer.in_unexpected = nullptr;
  peer.in_state = InState::Header;
}

void TcpTransport::withdraw(Op& op) {
  Peer& peer = *peers_[op.peer];
  if (op.kind == OpKind::Send) {
    auto it = std::find(peer.sends.begin(), peer.sends.end(), &op);
    if (it == peer.sends.end()) return;
    if (op.header_done == 0) {
      peer.sends.erase(it);
      return;
    }
    // Partly on the wire: the peer expects the rest, so finish it from a copy that the caller
    // cannot free under us.
    auto orphan = std::make_unique<Op>();
    orphan->peer = op.peer;
    orphan->header = op.header;
    orphan->header_done = op.header_done;
    orphan->owned.assign(op.src + op.done, op.src + op.bytes);
    orphan->src = orphan->owned.data();
    orphan->bytes = orphan->owned.size();
    *it = orphan.get();
    peer.orphans.push_back(std::move(orphan));
    return;
  }
  if (peer.in_op == &op) {
    peer.in_op = nullptr;  // the rest of this message is read and discarded
    return;
  }
  std::erase(peer.recvs, &op);
}

void TcpTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_.load()) return;
    abort_reason_ = reason.empty() ? "aborted" : reason;
  }
  aborted_.store(true);
  // Shutting the connections down tells the peers at once (they see PeerLost) instead of
  // leaving them to their timeouts. The fds themselves are closed only by the destructor.
  for (auto& peer : peers_) {
    if (peer) ::shutdown(peer->socket.fd(), SHUT_RDWR);
  }
  uint64_t one = 1;
  ssize_t ignored = ::write(wakeup_.fd(), &one, sizeof(one));
  (void)ignored;
}

void TcpTransport::handle_abort() {
  if (abort_handled_ || !aborted_.load()) return;
  abort_handled_ = true;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    reason = abort_reason_;
  }
  for (auto& [id, op] : ops_) {
    if (!op->finished) fail(*op, error(ErrorCode::Aborted, op_name(op->kind), reason));
  }
  for (auto& peer : peers_) {
    if (!peer) continue;
    peer->sends.clear();
    peer->recvs.clear();
    peer->orphans.clear();
    peer->in_op = nullptr;
    peer->lost = true;
    peer->lost_reason = "is unreachable: this transport was aborted";
  }
}

}  // namespace weft::tcp
