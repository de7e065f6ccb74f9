// ShmTransport's failure paths: lost peers, withdrawn requests and abort (see shm_transport.h).
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "backends/common/cross_memory.h"
#include "backends/tcp/shm_peer.h"
#include "backends/tcp/shm_transport.h"
#include "runtime/progress_thread.h"

namespace weft::tcp {

using backends::OpKind;
using collectives::Clock;

namespace {
// How long withdrawing a single-copy send waits for the peer to have read it.
constexpr std::chrono::seconds kWithdrawWait = kWithdrawBound;  // runtime/progress_thread.h
}  // namespace

void ShmTransport::check_peers(bool now_please) {
  const Clock::time_point now = Clock::now();
  if (!now_please && now < next_liveness_check_) return;
  next_liveness_check_ = now + bell_->slice();
  // Once per slice, a few descriptors: a vector here costs nothing next to the poll().
  std::vector<pollfd> fds;
  std::vector<Peer*> polled;
  for (auto& peer : peers_) {
    if (!peer || peer->lost || !peer->control.valid()) continue;
    fds.push_back(pollfd{peer->control.fd(), POLLRDHUP, 0});
    polled.push_back(peer.get());
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
      lose_peer(*polled[i], "is gone (its control connection closed: it exited or crashed)");
    }
  }
}

void ShmTransport::lose_peer(Peer& peer, const std::string& hang_up) {
  if (peer.lost) return;
  // After abort(), this rank's own shutdown of the connections reads as a hang-up: what the
  // caller must act on is the abort, not a peer that only looks lost.
  if (matcher_.aborted()) {
    handle_abort();
    return;
  }
  // A peer that aborted wrote its marker on the control socket (which carries nothing else)
  // before hanging up.
  char marker = 0;
  const bool aborted = peer.control.valid() &&
                       ::recv(peer.control.fd(), &marker, 1, MSG_DONTWAIT) == 1 &&
                       marker == backends::MessageMatcher::kAbortMarker;
  const std::string why = aborted ? backends::MessageMatcher::kPeerAborted : hang_up;
  // What it committed before going stays readable in this rank's segment: take all of it first.
  // Marked lost (and draining) already, so that the matcher buffers past the unexpected limit:
  // what is left is bounded by the ring, and holding it back would only turn messages into
  // failures.
  peer.lost = true;
  peer.draining = true;
  peer.lost_reason = why;
  while (pump_reads(peer)) {
  }
  ++losses_;
  for (Op* op : peer.awaiting_ack) {
    if (op->id != 0) {
      matcher_.fail(*op, matcher_.error(ErrorCode::PeerLost, matcher_.op_name(op->kind),
                                        fmt::format("rank {} {} (a single-copy send not yet read)",
                                                    peer.rank, why)));
    }
  }
  peer.awaiting_ack.clear();
  matcher_.fail_peer(peer, why);
}

void ShmTransport::withdraw(Op& op) {
  if (op.peer == collectives::kAnySource) {
    matcher_.withdraw_unbound(op);
    return;
  }
  Peer& peer = *peers_[op.peer];
  if (op.kind == OpKind::Send) {
    // A single-copy send whose descriptor went out: the peer may read the caller's buffer at any
    // time until it acknowledges, so keep the buffer borrowed until the ack comes, the peer is
    // lost, or a short bound passes (a live peer reads it when it posts the receive, or copies
    // it out before it sleeps). Past the bound the buffer is let go; a read after that gets
    // garbage or EFAULT, which the peer reports as PeerLost.
    if (std::find(peer.awaiting_ack.begin(), peer.awaiting_ack.end(), &op) !=
        peer.awaiting_ack.end()) {
      // One wait per silent peer, not one per send: a collective that timed out on a stopped
      // peer withdraws every chunk it sent there, and 2 s each would hold its error back (and
      // the group's teardown) by seconds past the timeout.
      const Clock::time_point until =
          peer.ack_overdue ? Clock::now() : Clock::now() + kWithdrawWait;
      while (!op.finished && !peer.lost && !matcher_.aborted() && Clock::now() < until) {
        progress();
        check_peers(false);
        if (op.finished || peer.lost) break;
        bell_->wait([&] { return op.finished || peer.lost || has_news(); }, until, spin_budget_,
                    [&] { check_peers(true); });
      }
      if (!op.finished && !peer.lost && !matcher_.aborted()) peer.ack_overdue = true;
      std::erase(peer.awaiting_ack, &op);
      return;
    }
    auto it = std::find(peer.sends.begin(), peer.sends.end(), &op);
    if (it != peer.sends.end() && op.header_done > 0 && op.single_copy) {
      // The header is out, the descriptor not yet: send one pointing at a copy the orphan owns,
      // kept until the peer acknowledges it.
      auto orphan = std::make_unique<Op>();
      orphan->peer = op.peer;
      orphan->header = op.header;
      orphan->header_done = op.header_done;
      orphan->single_copy = true;
      orphan->owned.assign(op.src, op.src + op.bytes);
      orphan->descriptor[0] = reinterpret_cast<uintptr_t>(orphan->owned.data());
      orphan->descriptor[1] = op.descriptor[1];
      *it = orphan.get();
      peer.orphans.push_back(std::move(orphan));
      return;
    }
  }
  matcher_.withdraw(peer, op);
}

void ShmTransport::abort(const std::string& reason) {
  if (!matcher_.mark_aborted(reason)) return;
  // Peers poll these sockets: a shut-down connection tells them within a slice, rather than at
  // their deadline. shutdown() leaves the descriptor open, so the owner thread's polls are safe.
  for (auto& peer : peers_) {
    if (!peer || !peer->control.valid()) continue;
    const char marker = backends::MessageMatcher::kAbortMarker;
    (void)::send(peer->control.fd(), &marker, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(peer->control.fd(), SHUT_RDWR);
  }
  if (bell_) bell_->ring();
}

bool ShmTransport::reads_every_peer() const {
  for (const auto& peer : peers_) {
    if (peer && !peer->readable) return false;
  }
  return options_.single_copy_bytes > 0;
}

void ShmTransport::read_peer(int peer, void* to, uint64_t address, size_t bytes) {
  if (!serves(peer)) {
    throw matcher_.error(ErrorCode::InvalidArgument, "shm read",
                         fmt::format("rank {} is not a shared-memory peer here", peer));
  }
  const Peer& p = *peers_[peer];
  const int err = backends::read_process(p.pid, to, address, bytes);
  if (err == 0) return;
  auto [code, why] = backends::describe_read_failure(err, p.rank, p.pid, bytes);
  throw matcher_.error(code, "shm read", why);
}

void ShmTransport::ring_peers() {
  for (auto& peer : peers_) {
    if (peer && !peer->lost) peer->bell->ring();
  }
}

void ShmTransport::fail_if_broken() {
  if (matcher_.aborted()) {
    handle_abort();
    throw matcher_.error(ErrorCode::Aborted, "shm wait", "the transport was aborted");
  }
  // A peer that died is the news; one that hung up because it broke on that death is not.
  const Peer* lost = nullptr;
  for (auto& peer : peers_) {
    if (!peer || !peer->lost) continue;
    if (!lost || lost->lost_reason == backends::MessageMatcher::kPeerAborted) lost = peer.get();
  }
  if (lost) {
    throw matcher_.error(ErrorCode::PeerLost, "shm wait",
                         fmt::format("rank {} {}", lost->rank, lost->lost_reason));
  }
}

bool ShmTransport::wait_beside(const std::function<bool()>& ready, Clock::time_point deadline) {
  auto check = [&] { fail_if_broken(); };
  // ready() first, every time: a peer that has done its part (arrived in a barrier) and then
  // exited or hung up (it left the barrier, finished and closed its group) is no failure of this
  // wait, and a rank that saw the barrier complete must not be told otherwise.
  if (ready()) return true;
  check_peers(false);
  check();
  if (!bell_) return ready();
  if (options_.progress_beside) options_.progress_beside();
  for (;;) {
    const uint64_t losses = losses_;
    const bool woken = bell_->wait(
        [&] { return ready() || matcher_.aborted() || losses_ != losses; }, deadline, spin_budget_,
        [&] {
          check_peers(true);
          if (options_.progress_beside) options_.progress_beside();
          if (!ready()) check();
        });
    if (ready()) return true;
    check();
    if (!woken) return false;
  }
}

void ShmTransport::handle_abort() {
  if (!matcher_.handle_abort()) return;
  for (auto& peer : peers_) {
    if (!peer) continue;
    peer->awaiting_ack.clear();
    matcher_.clear_aborted(*peer);
  }
}

}  // namespace weft::tcp
