#include "backends/common/message_matcher.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "runtime/reduce.h"

namespace weft::backends {

using collectives::differs_only_in_fingerprint;
using collectives::Tag;
using collectives::tag_fingerprint;
using collectives::tag_text;

namespace {

// A message and a receive for the same step of the same collective whose calls differ (their
// tags differ only in the call fingerprint): the ranks disagree about dtype, count, op or root.
std::string fingerprint_detail(int peer, Tag sent, Tag expected) {
  return fmt::format(
      "rank {} sent {} but this rank expects {}: the two ranks called this collective with "
      "different arguments (dtype, count, reduce op or root; the calls' fingerprints {:04x} and "
      "{:04x} differ), so its data is not used; rerun with WEFT_DEBUG=detail to have every "
      "rank's call compared",
      peer, tag_text(sent), tag_text(expected), tag_fingerprint(sent), tag_fingerprint(expected));
}

}  // namespace

MessageMatcher::MessageMatcher(int rank, int size, Options options)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      names_{options_.transport + " send", options_.transport + " recv",
             options_.transport + " recv_reduce"},
      pool_(options_.unexpected_limit) {}

Error MessageMatcher::error(ErrorCode code, const char* op, const std::string& detail) const {
  ErrorContext context;
  context.rank = rank_;
  context.size = size_;
  context.group = options_.group_name;
  context.op = op;
  return Error(code, context, detail);
}

Op& MessageMatcher::post(int peer, OpKind kind, Tag tag, size_t bytes) {
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

Op& MessageMatcher::pending(collectives::Request request, const char* what) {
  auto it = ops_.find(request.id);
  if (it == ops_.end()) {
    throw error(
        ErrorCode::InvalidArgument, what,
        fmt::format("request {} is not pending (never posted, or already waited for)", request.id));
  }
  return *it->second;
}

void MessageMatcher::finish(Op& op) {
  auto it = ops_.find(op.id);
  std::unique_ptr<Op> done = std::move(it->second);
  ops_.erase(it);
  if (done->error) throw *done->error;
}

Error MessageMatcher::timeout_error(const Op& op) const {
  std::string detail =
      op.kind == OpKind::Send
          ? fmt::format("send to rank {} ({}) still has {} of {} bytes to write", op.peer,
                        tag_text(op.tag), op.bytes - op.done, op.bytes)
      : op.peer == collectives::kAnySource
          ? fmt::format("no message from any rank ({}, {} bytes expected)", tag_text(op.tag),
                        op.bytes)
          : fmt::format("nothing complete from rank {} ({}): {} of {} bytes outstanding", op.peer,
                        tag_text(op.tag), op.bytes - op.done, op.bytes);
  return error(ErrorCode::Timeout, op_name(op.kind), detail);
}

Error MessageMatcher::any_source_lost(const Op& op, const PeerQueues& peer) const {
  return error(ErrorCode::PeerLost, op_name(op.kind),
               fmt::format("rank {} {}, and this receive from any source ({}) may have been "
                           "waiting for it",
                           peer.rank, peer.lost_reason, tag_text(op.tag)));
}

void MessageMatcher::sent(PeerQueues& peer, Op& op) {
  if (op.id != 0) {
    complete(op);
    return;
  }
  // An orphan (a withdrawn send, or a transport's own control message) now fully written:
  // nobody waits for it.
  std::erase_if(peer.orphans, [&](const std::unique_ptr<Op>& o) { return o.get() == &op; });
}

std::optional<MessageMatcher::SingleCopyMatch> MessageMatcher::match_posted_recv(PeerQueues& peer,
                                                                                 Op& op) {
  for (auto it = peer.unexpected.begin(); it != peer.unexpected.end(); ++it) {
    const bool near_miss = differs_only_in_fingerprint(it->tag, op.tag);
    if (it->tag != op.tag && !near_miss) continue;
    Unexpected& u = *it;
    const bool arriving = peer.in_unexpected == &u;
    if (near_miss) {
      fail(op, error(ErrorCode::Desync, op_name(op.kind),
                     fingerprint_detail(peer.rank, u.tag, op.tag)));
    } else if (u.size != op.bytes) {
      fail(op, error(ErrorCode::Protocol, op_name(op.kind),
                     fmt::format("rank {} sent {} bytes with {} but this rank expects {} bytes: {}",
                                 peer.rank, u.size, tag_text(op.tag), op.bytes,
                                 collectives::kDesyncHint)));
    } else if (!u.single_copy) {
      deliver(op, u.buffer.data.get(), u.got);
      if (!arriving) complete(op);
    }
    std::optional<SingleCopyMatch> single_copy;
    if (u.single_copy) single_copy = SingleCopyMatch{u.address, u.sender_op};
    if (arriving) {
      peer.in_unexpected = nullptr;  // the rest goes to op, or nowhere after a mismatch
      if (!op.finished) peer.in_op = &op;
    }
    peer.unexpected_bytes -= u.charge;
    pool_.release(std::move(u.buffer));
    peer.unexpected.erase(it);
    if (peer.in_state == InState::Paused) start_payload(peer);  // the freed room may let it in
    return single_copy;
  }
  if (peer.in_state == InState::Paused &&
      (peer.in_header.tag == op.tag || differs_only_in_fingerprint(peer.in_header.tag, op.tag))) {
    peer.recvs.push_front(&op);  // the paused message is the first with this tag: it is op's
    start_payload(peer);
    return std::nullopt;
  }
  if (peer.lost) {
    fail(op, error(ErrorCode::PeerLost, op_name(op.kind),
                   fmt::format("rank {} {}", peer.rank, peer.lost_reason)));
    return std::nullopt;
  }
  peer.recvs.push_back(&op);
  return std::nullopt;
}

Op* MessageMatcher::take_posted_recv(PeerQueues& peer, Tag tag, uint64_t bytes) {
  auto posted = std::find_if(peer.recvs.begin(), peer.recvs.end(),
                             [&](const Op* op) { return op->tag == tag; });
  // A receive from any source posted before the first one from this peer takes the message.
  auto any = std::find_if(any_recvs_.begin(), any_recvs_.end(),
                          [&](const Op* op) { return op->tag == tag; });
  if (any != any_recvs_.end() && (posted == peer.recvs.end() || (*any)->id < (*posted)->id)) {
    Op& op = **any;
    any_recvs_.erase(any);
    bind(op, peer);
    if (op.bytes != bytes) {
      fail(op, error(ErrorCode::Protocol, op_name(op.kind),
                     fmt::format("rank {} sent {} bytes with {} but this receive from any source "
                                 "expects {} bytes",
                                 peer.rank, bytes, tag_text(tag), op.bytes)));
    }
    return &op;
  }
  if (posted == peer.recvs.end()) {
    // Not posted yet, or posted for a different call of the same collective step: the latter
    // fails now (its payload is discarded) rather than at the timeout.
    posted = std::find_if(peer.recvs.begin(), peer.recvs.end(),
                          [&](const Op* op) { return differs_only_in_fingerprint(op->tag, tag); });
    if (posted == peer.recvs.end()) return nullptr;
    Op& op = **posted;
    peer.recvs.erase(posted);
    fail(op,
         error(ErrorCode::Desync, op_name(op.kind), fingerprint_detail(peer.rank, tag, op.tag)));
    return &op;
  }
  Op& op = **posted;
  peer.recvs.erase(posted);
  if (op.bytes != bytes) {
    fail(op,
         error(ErrorCode::Protocol, op_name(op.kind),
               fmt::format("rank {} sent {} bytes with {} but this rank expects {} bytes: {}",
                           peer.rank, bytes, tag_text(tag), op.bytes, collectives::kDesyncHint)));
  }
  return &op;
}

bool MessageMatcher::start_payload(PeerQueues& peer) {
  const WireHeader& h = peer.in_header;
  peer.in_op = nullptr;
  peer.in_unexpected = nullptr;
  peer.in_left = h.bytes;
  if (Op* op = take_posted_recv(peer, h.tag, h.bytes)) {
    if (!op->finished) peer.in_op = op;  // else: a size mismatch, the payload is discarded
  } else {
    const size_t charge = unexpected_charge(h.bytes);
    const bool over = peer.unexpected_bytes + charge > options_.unexpected_limit;
    const bool alone = options_.admit_oversized_alone && peer.unexpected.empty();
    if (over && !peer.draining && !alone) {
      peer.in_state = InState::Paused;
      return false;
    }
    Unexpected& u = peer.unexpected.emplace_back();
    u.tag = h.tag;
    u.size = h.bytes;
    u.charge = charge;
    u.buffer = pool_.acquire(h.bytes);
    peer.unexpected_bytes += charge;
    peer.in_unexpected = &u;
  }
  peer.in_state = InState::Payload;
  if (peer.in_left == 0) finish_message(peer);
  return true;
}

void MessageMatcher::finish_message(PeerQueues& peer) {
  if (peer.in_op != nullptr) complete(*peer.in_op);
  peer.in_op = nullptr;
  peer.in_unexpected = nullptr;  // stays in peer.unexpected, complete (got == size)
  peer.in_state = InState::Header;
}

void MessageMatcher::deliver(Op& op, const uint8_t* src, size_t n) {
  if (op.kind == OpKind::Recv) {
    if (n > 0 && src != op.dst + op.done) std::memcpy(op.dst + op.done, src, n);
    op.done += n;
    return;
  }
  const size_t whole = n / op.element * op.element;
  reduce::accumulate(op.dst + op.done, src, whole / op.element, op.dtype, op.reduce_op);
  op.done += whole;
  op.carry_len = n - whole;
  if (op.carry_len > 0) std::memcpy(op.carry, src + whole, op.carry_len);
}

void MessageMatcher::withdraw(PeerQueues& peer, Op& op) {
  if (op.kind == OpKind::Send) {
    auto it = std::find(peer.sends.begin(), peer.sends.end(), &op);
    if (it == peer.sends.end()) return;
    if (op.header_done == 0) {
      peer.sends.erase(it);
      return;
    }
    // Partly on the wire: the peer expects the rest, so finish it from a copy that the caller
    // cannot free under us. An orphan has id 0.
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

void MessageMatcher::fail_peer(PeerQueues& peer, const std::string& why) {
  peer.lost = true;
  peer.draining = true;
  peer.lost_reason = why;
  auto lost = [&](Op& op) {
    if (op.id == 0) return;  // an orphan: nobody waits for it
    fail(op, error(ErrorCode::PeerLost, op_name(op.kind),
                   fmt::format("rank {} {} ({}, {} of {} bytes transferred)", peer.rank, why,
                               tag_text(op.tag), op.done, op.bytes)));
  };
  for (Op* op : peer.sends) lost(*op);
  for (Op* op : peer.recvs) lost(*op);
  for (Op* op : any_recvs_) fail(*op, any_source_lost(*op, peer));
  any_recvs_.clear();
  if (peer.in_op != nullptr) lost(*peer.in_op);
  peer.sends.clear();
  peer.recvs.clear();
  peer.orphans.clear();
  if (peer.in_unexpected != nullptr) {
    Unexpected& partial = *peer.in_unexpected;
    peer.unexpected_bytes -= partial.charge;
    pool_.release(std::move(partial.buffer));
    peer.unexpected.remove_if([&](const Unexpected& u) { return &u == &partial; });
  }
  peer.in_op = nullptr;
  peer.in_unexpected = nullptr;
  peer.in_state = InState::Header;
}

bool MessageMatcher::mark_aborted(const std::string& reason) {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (aborted_.load()) return false;
  abort_reason_ = reason.empty() ? std::string("aborted") : reason;
  aborted_.store(true);
  return true;
}

bool MessageMatcher::handle_abort() {
  if (abort_handled_ || !aborted_.load()) return false;
  abort_handled_ = true;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    reason = abort_reason_;
  }
  for (auto& [id, op] : ops_) {
    if (!op->finished) fail(*op, error(ErrorCode::Aborted, op_name(op->kind), reason));
  }
  any_recvs_.clear();
  return true;
}

void MessageMatcher::clear_aborted(PeerQueues& peer) {
  peer.sends.clear();
  peer.recvs.clear();
  peer.orphans.clear();
  peer.in_op = nullptr;
  peer.lost = true;
  peer.draining = true;
  peer.lost_reason = "is unreachable: this transport was aborted";
}

}  // namespace weft::backends
