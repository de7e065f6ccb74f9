// backends/common/message_matcher.h: the matching half of a transport that moves tagged messages
// as a byte stream per peer (TCP sockets, shared-memory rings), shared so that each such
// transport keeps only its byte pump.
//
// What it does (the rules of collectives/transport.h):
// - Requests: post() registers a request under an id; wait() and test() find it again; a
//   finished request leaves the table when its wait() returns or throws.
// - Matching: an arriving header (start_payload) goes to the first posted receive from that peer
//   with its tag; without one, the message is unexpected and buffered in a pooled buffer, up to
//   Options::unexpected_limit per peer: past it the peer is paused (its sender is pushed back by
//   the socket or ring) until a receive for that message is posted. A receive posted later
//   (match_posted_recv) takes the first buffered message with its tag. A size mismatch fails the
//   receive with Error(Protocol); the message is discarded. A message whose tag differs from the
//   receive's only in the call fingerprint (tag.h) fails it with Error(Desync) the same way.
// - Any source: a receive posted with peer collectives::kAnySource (bind_any_source) takes the
//   first message with its tag already buffered or paused at any peer, or else waits in a queue
//   of its own; an arriving message goes to the earliest posted of the receives that could take
//   it (one from its peer, or one from any source), and binds an any-source one to its peer.
//   A lost peer fails every unbound any-source receive (it may have been the sender).
// - Failure: a deadline passed (settle) throws Error(Timeout) naming peer, tag and bytes
//   outstanding and withdraws the request so the stream stays consistent (a send already partly
//   written is finished from a copy, an orphan; the rest of a receive already partly read is
//   discarded); a lost peer fails everything queued with it (fail_peer); abort() fails every
//   request (handle_abort).
//
// What the transport keeps: moving bytes (its pump reads a header into PeerQueues::in_header,
// calls start_payload, then moves the payload into in_op or in_unexpected), sleeping, noticing a
// lost peer, and anything of its own (the shared-memory transport's single copy).
//
// Cost: no indirection. Every call is a direct, non-virtual one on the transport's own member,
// the same work the transports did inline before; deliver() is the one call per chunk.
//
// Thread safety: one thread (the transport's owner thread) calls everything, except
// mark_aborted(), which any thread may call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "weft/error.h"

#include "backends/common/pending_message.h"
#include "backends/common/unexpected_pool.h"
#include "collectives/transport.h"

namespace weft::backends {

class MessageMatcher {
 public:
  struct Options {
    std::string transport = "tcp";  // names requests in messages: "tcp recv", "shm send"
    std::string group_name = "world";
    // Most bytes of unexpected messages buffered per peer before reading from it pauses. Each
    // message counts its buffer (its size rounded up to a power of two, at least 64 bytes) plus
    // 64 bytes of bookkeeping, so the limit bounds memory for floods of small messages too.
    size_t unexpected_limit = size_t{64} << 20;
    // A message larger than the limit is still buffered when nothing else is, so that no message
    // size can stall a peer (the shared-memory ring needs it: its sender cannot be pushed back
    // past a full ring by a receiver that never reads). Off: such a message waits for its receive.
    bool admit_oversized_alone = false;
  };

  // A single-copy message (Unexpected::single_copy) that a posted receive matched: the
  // transport reads it into the receive (unless the receive failed on its size) and acknowledges.
  struct SingleCopyMatch {
    uint64_t address = 0;
    uint64_t sender_op = 0;
  };

  MessageMatcher(int rank, int size, Options options);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "rank 1/4 group "world" <op>: <detail>".
  Error error(ErrorCode code, const char* op, const std::string& detail) const;
  // "tcp send", "shm recv_reduce".
  const char* op_name(OpKind kind) const { return names_[static_cast<int>(kind)].c_str(); }

  // ---- Requests.
  // Registers a request; after handle_abort() it is failed with Error(Aborted) at once.
  Op& post(int peer, OpKind kind, collectives::Tag tag, size_t bytes);
  // The pending request `request`, or Error(InvalidArgument) naming `what` ("tcp wait").
  Op& pending(collectives::Request request, const char* what);
  // When op is finished: forgets it and returns true, or throws its error. When `deadline` has
  // passed: calls withdraw() (the transport's, which calls withdraw(peer, op) below), forgets
  // op and throws Error(Timeout). Otherwise returns false.
  template <class Withdraw>
  bool settle(Op& op, collectives::Clock::time_point deadline, Withdraw&& withdraw) {
    if (op.finished) {
      finish(op);
      return true;
    }
    if (collectives::Clock::now() < deadline) return false;
    Error timeout = timeout_error(op);
    withdraw();
    forget(op);
    throw timeout;
  }
  void complete(Op& op) { op.finished = true; }
  void fail(Op& op, Error e) {
    op.finished = true;
    op.error.emplace(std::move(e));
  }
  // A send written to its end: completes it, or drops it when it is an orphan (id 0).
  void sent(PeerQueues& peer, Op& op);

  // ---- Matching.
  // Matches a freshly posted receive against what already arrived from its peer (or queues it).
  // Returns the single-copy message it matched, if any, for the transport to read.
  std::optional<SingleCopyMatch> match_posted_recv(PeerQueues& peer, Op& op);
  // Picks where the payload of peer.in_header goes (a receive, a pooled buffer, or nowhere after
  // a size mismatch), or pauses the peer; returns false when paused.
  bool start_payload(PeerQueues& peer);
  // A receive from any source (op.peer == kAnySource, op.source set): binds it to the first
  // peer, in rank order, holding a buffered or paused message with its tag and returns that
  // peer, for the transport to match it there as a receive from that peer; or returns null,
  // with op queued until a message with its tag arrives (or failed, when a peer is lost).
  // `peers` is the transport's peer table (null entries are skipped).
  template <class PeerTable>
  PeerQueues* bind_any_source(Op& op, PeerTable& peers) {
    for (auto& p : peers) {
      if (p && p->lost) {
        fail(op, any_source_lost(op, *p));
        return nullptr;
      }
    }
    for (auto& p : peers) {
      if (!p) continue;
      PeerQueues& peer = *p;
      const bool buffered = std::any_of(peer.unexpected.begin(), peer.unexpected.end(),
                                        [&](const Unexpected& u) { return u.tag == op.tag; });
      if (buffered || (peer.in_state == InState::Paused && peer.in_header.tag == op.tag)) {
        bind(op, peer);
        return &peer;
      }
    }
    any_recvs_.push_back(&op);
    return nullptr;
  }
  // Registers a receive from any source into `data` (*source gets the sender) and binds it as
  // bind_any_source() does: returns it, and the peer it was bound to (null: queued or failed).
  template <class PeerTable>
  std::pair<Op*, PeerQueues*> post_any_source(PeerTable& peers, void* data, size_t bytes,
                                              collectives::Tag tag, int* source) {
    Op& op = post(collectives::kAnySource, OpKind::Recv, tag, bytes);
    if (op.finished) return {&op, nullptr};
    op.dst = static_cast<uint8_t*>(data);
    op.source = source;
    return {&op, bind_any_source(op, peers)};
  }
  // Takes the first posted receive from peer with `tag`, or null. One whose size is not `bytes`
  // is failed with Error(Protocol) (and returned, finished). Without one, a receive whose tag
  // differs only in its call fingerprint (collectives/tag.h: the ranks called this collective
  // with different arguments) is failed with Error(Desync) and returned, finished.
  Op* take_posted_recv(PeerQueues& peer, collectives::Tag tag, uint64_t bytes);
  // The current message's payload is all read: completes its receive, back to reading headers.
  void finish_message(PeerQueues& peer);
  // Moves n payload bytes at src into a receive (copy, or reduce whole elements and carry the
  // rest in op.carry). REQUIRES: n <= bytes still owed to op; op.carry_len == 0 for a reduce.
  static void deliver(Op& op, const uint8_t* src, size_t n);
  // What an unexpected message counts against the limit: its buffer, and its list node and
  // bookkeeping (~64 bytes), so that a flood of tiny messages is bounded in memory too.
  static size_t unexpected_charge(uint64_t bytes) {
    return UnexpectedPool::capacity_for(bytes) + 64;
  }
  UnexpectedPool& pool() { return pool_; }
  size_t unexpected_limit() const { return options_.unexpected_limit; }

  // ---- Failure.
  // Withdraws a pending op after its wait() timed out, keeping the byte stream consistent.
  void withdraw(PeerQueues& peer, Op& op);
  // The same for a receive from any source not bound to a peer yet (op.peer == kAnySource).
  void withdraw_unbound(Op& op) { std::erase(any_recvs_, &op); }
  // What an aborting transport sends each peer just before it hangs up (out of band: TCP urgent
  // data, a byte on the shared-memory control socket), so that a peer can say the rank aborted
  // rather than that it exited or crashed, and the `why` it then reports.
  static constexpr char kAbortMarker = 'A';
  static constexpr const char* kPeerAborted =
      "aborted its process group and hung up (abort() was called there, or it broke on an "
      "earlier failure; its own error says which)";
  // The peer is lost: fails every request queued with it with Error(PeerLost) naming it and
  // `why`, and drops a message half-read from it.
  void fail_peer(PeerQueues& peer, const std::string& why);
  // Records abort(reason); false when already aborted. Any thread.
  bool mark_aborted(const std::string& reason);
  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }
  // On the owner thread, once after mark_aborted(): fails every request with Error(Aborted) and
  // returns true; the transport then calls clear_aborted() on each of its peers.
  bool handle_abort();
  void clear_aborted(PeerQueues& peer);
  bool abort_handled() const { return abort_handled_; }

 private:
  Error timeout_error(const Op& op) const;
  Error any_source_lost(const Op& op, const PeerQueues& peer) const;
  void bind(Op& op, PeerQueues& peer) {
    op.peer = peer.rank;
    if (op.source != nullptr) *op.source = peer.rank;
  }
  void finish(Op& op);
  void forget(const Op& op) { ops_.erase(op.id); }

  const int rank_;
  const int size_;
  const Options options_;
  std::string names_[3];
  std::unordered_map<uint64_t, std::unique_ptr<Op>> ops_;  // live requests by id
  std::deque<Op*> any_recvs_;  // receives from any source not bound yet, in posting order
  uint64_t next_id_ = 1;
  UnexpectedPool pool_;

  std::atomic<bool> aborted_{false};
  bool abort_handled_ = false;  // owner thread only
  mutable std::mutex abort_mutex_;
  std::string abort_reason_;  // guarded by abort_mutex_
};

}  // namespace weft::backends
