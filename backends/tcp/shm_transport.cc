#include "backends/tcp/shm_transport.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "weft/config.h"

#include "backends/common/cross_memory.h"
#include "backends/tcp/shm_peer.h"
#include "backends/tcp/shm_ring.h"
#include "runtime/launch_env.h"
#include "runtime/reduce.h"
#include "runtime/shm_names.h"

namespace weft::tcp {

using backends::InState;
using backends::MessageMatcher;
using backends::OpKind;
using backends::Unexpected;
using backends::WireHeader;
using collectives::Clock;
using collectives::Tag;
using collectives::tag_text;

namespace {

constexpr size_t kHeaderBytes = sizeof(WireHeader);

// Single copy. A header whose bytes field has this bit carries, instead of the payload, the
// descriptor {address in the sender, sender's request id} (16 bytes); the receiver reads the
// bytes with process_vm_readv() and answers with an ack: a message with kAckTag whose 8-byte
// payload is the request id (tag.h keeps kTransportControlTag clear of every other tag).
constexpr uint64_t kSingleCopyBit = uint64_t{1} << 63;
constexpr Tag kAckTag = collectives::kTransportControlTag;
constexpr size_t kDescriptorBytes = 16;
constexpr size_t kAckBytes = 8;
// recv_reduce of a single-copy message reads in pieces of this size into a staging buffer and
// reduces each: L2-sized, so the reduction reads it from cache.
constexpr size_t kSingleCopyPiece = 256 * 1024;

constexpr size_t kMinRingBytes = 4096;
// Starts the record of a rank that could not make its segment, followed by its error: no
// segment name starts with '!' (shm_job_prefix() names start "weft-").
constexpr std::string_view kFailedRecord = "! ";
// sched_yield() rounds before a futex sleep when ranks outnumber cores (see doorbell.h).
using backends::kOversubscribedYieldRounds;
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;  // as TcpTransport: larger is corrupt

size_t round8(size_t n) { return (n + 7) & ~size_t{7}; }
size_t page_align(size_t n) { return (n + 4095) / 4096 * 4096; }
// [doorbell][slot area, when slots are on][ring 0][ring 1]...
size_t slot_area_bytes(size_t slot_bytes) {
  return slot_bytes > 0 ? ShmSlots::footprint(slot_bytes) : 0;
}
size_t ring_offset(size_t index, size_t capacity, size_t slot_bytes) {
  return page_align(Doorbell::kFootprint) + slot_area_bytes(slot_bytes) +
         index * page_align(ShmRing::footprint(capacity));
}

MessageMatcher::Options matcher_options(const ShmTransport::Options& options) {
  MessageMatcher::Options matcher;
  matcher.transport = "shm";
  matcher.group_name = options.group_name;
  matcher.unexpected_limit = options.unexpected_limit;
  // The ring cannot push a sender back past what it holds: see "Matching" in shm_transport.h.
  matcher.admit_oversized_alone = true;
  return matcher;
}

}  // namespace

ShmTransport::ShmTransport(Store& store, int rank, int size, std::vector<net::Socket> control,
                           Options options)
    : options_(std::move(options)), matcher_(rank, size, matcher_options(options_)) {
  if (size < 1 || rank < 0 || rank >= size || control.size() != static_cast<size_t>(size)) {
    throw matcher_.error(
        ErrorCode::InvalidArgument, "shm transport",
        fmt::format("needs 0 <= rank < size and one control slot per rank ({} given)",
                    control.size()));
  }
  const size_t ring = options_.ring_bytes;
  if (ring < kMinRingBytes || (ring & (ring - 1)) != 0) {
    throw matcher_.error(
        ErrorCode::InvalidArgument, "shm transport",
        fmt::format("ring_bytes must be a power of two >= {}, not {}", kMinRingBytes, ring));
  }
  setup(store, std::move(control));
}

ShmTransport::~ShmTransport() = default;

void ShmTransport::setup(Store& store, std::vector<net::Socket> control) {
  using namespace std::chrono;
  const milliseconds timeout = options_.timeout.count() > 0 ? options_.timeout : config().timeout;
  const size_t capacity = options_.ring_bytes;
  std::vector<int> senders;
  peers_.resize(matcher_.size());
  for (int r = 0; r < matcher_.size(); ++r) {
    if (r == matcher_.rank() || !control[r].valid()) continue;
    senders.push_back(r);
    peers_[r] = std::make_unique<Peer>();
    peers_[r]->rank = r;
    peers_[r]->control = std::move(control[r]);
  }
  // Slots only when every other rank of the group is here (the group is on one host): a group
  // that spans hosts never uses them, so its segments do not carry them.
  const size_t slot_bytes =
      senders.size() + 1 == static_cast<size_t>(matcher_.size()) ? options_.slot_bytes : 0;
  auto ring_offset = [&](size_t index, size_t ring) {
    return tcp::ring_offset(index, ring, slot_bytes);
  };
  const int local =
      options_.local_ranks > 0 ? options_.local_ranks : static_cast<int>(senders.size()) + 1;
  spin_budget_ =
      config().spin_us >= 0 ? std::chrono::microseconds(config().spin_us) : spin_budget_for(local);
  // The shared slots plan by it, so every rank must see the same: each publishes its own view and
  // all take the union (below).
  bool crowded = spin_budget_for(local).count() == 0;

  // 1. This rank's segment: doorbell, then one ring per sender, formatted before publishing.
  // Named after the job, so that a launcher can remove what a rank killed during set-up leaves,
  // and so can the next run of the same job (no launcher removes them after a crash of all).
  // The pid and the group id (random per run) in the name keep a new run from ever opening
  // an old run's segment.
  const std::string job = launcher_job_id(std::getenv).value;
  remove_earlier_runs_segments(job);
  const std::string name = fmt::format("{}{:016x}-{}-r{}", shm_job_prefix(job), options_.group_id,
                                       ::getpid(), matcher_.rank());
  auto key = [&](int r) { return fmt::format("{}/{}", options_.key_prefix, r); };
  try {
    segment_ = ShmSegment::create(name, ring_offset(senders.size(), capacity));
  } catch (const Error& e) {
    // The peers wait for this rank's record: a record that says why there is none fails them at
    // once (below), instead of at their timeout. A full /dev/shm is the usual cause.
    if (!senders.empty()) {
      std::string failed = fmt::format("{}{}", kFailedRecord, e.what());
      try {
        store.set(key(matcher_.rank()), Bytes(failed.begin(), failed.end()));
      } catch (const Error&) {
        // The store is gone too: the peers learn of this rank's exit from their own timeouts.
      }
    }
    throw matcher_.error(e.code(), "shm transport", e.what());
  }
  bell_ = Doorbell::create(segment_->data());
  // Oversubscribed (no spinning): yield the core to the rank we wait for before sleeping.
  if (spin_budget_.count() == 0) bell_->set_yield_rounds(kOversubscribedYieldRounds);
  std::string record =
      fmt::format("{} {} {} {} {} {} ", name, capacity, slot_bytes, crowded ? 1 : 0, ::getpid(),
                  backends::cross_memory_probe_address());
  for (size_t i = 0; i < senders.size(); ++i) {
    std::byte* at = segment_->data() + ring_offset(i, capacity);
    peers_[senders[i]]->in = ShmRing::create(at, ShmRing::footprint(capacity), capacity);
    record += fmt::format("{}{}", i ? "," : "", senders[i]);
  }
  if (senders.empty()) return;  // nobody to meet: the segment only holds an unused doorbell
  store.set(key(matcher_.rank()), Bytes(record.begin(), record.end()));

  // 2. Open every peer's segment and attach the ring towards it.
  std::vector<std::string> keys;
  for (int s : senders) keys.push_back(key(s));
  std::vector<Bytes> records = store.multi_get(keys, timeout);
  std::vector<uint64_t> probes(senders.size());
  for (size_t i = 0; i < senders.size(); ++i) {
    Peer& peer = *peers_[senders[i]];
    std::string text(records[i].begin(), records[i].end());
    if (text.starts_with(kFailedRecord)) {
      throw matcher_.error(
          ErrorCode::Io, "shm transport",
          fmt::format("rank {} on this host could not make its shared-memory segment, so the "
                      "group cannot use shared memory here: {}",
                      peer.rank, text.substr(kFailedRecord.size())));
    }
    std::istringstream in(text);
    std::string peer_name, list;
    size_t peer_capacity = 0, peer_slot_bytes = 0;
    int peer_crowded = 0;
    uint64_t peer_probe = 0;
    in >> peer_name >> peer_capacity >> peer_slot_bytes >> peer_crowded >> peer.pid >> peer_probe >>
        list;
    crowded = crowded || peer_crowded != 0;
    crowded_ = crowded_ || crowded;
    probes[i] = peer_probe;
    std::vector<int> peer_senders;
    std::istringstream items(list);
    for (std::string item; std::getline(items, item, ',');) {
      int sender = -1;
      auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), sender);
      if (ec != std::errc() || end != item.data() + item.size() || sender < 0 ||
          sender >= matcher_.size()) {
        throw matcher_.error(
            ErrorCode::Protocol, "shm transport",
            fmt::format("rank {}'s record \"{}\" in the store is malformed", peer.rank,
                        std::string(records[i].begin(), records[i].end())));
      }
      peer_senders.push_back(sender);
    }
    auto me = std::find(peer_senders.begin(), peer_senders.end(), matcher_.rank());
    if (peer_capacity != capacity || me == peer_senders.end()) {
      throw matcher_.error(
          ErrorCode::InvalidArgument, "shm transport",
          fmt::format("rank {} publishes rings of {} bytes from ranks [{}]; this rank "
                      "uses {} and expects to be among them (asymmetric routing?)",
                      peer.rank, peer_capacity, list, capacity));
    }
    if (peer_slot_bytes != slot_bytes) {
      throw matcher_.error(
          ErrorCode::InvalidArgument, "shm transport",
          fmt::format("rank {} uses shared slots of {} bytes, this rank {} (WEFT_SHM_SLOT_BYTES "
                      "must be the same on every rank)",
                      peer.rank, peer_slot_bytes, slot_bytes));
    }
    peer.segment = ShmSegment::open(peer_name, ring_offset(peer_senders.size(), capacity));
    peer.bell = Doorbell::attach(peer.segment->data());
    const size_t index = static_cast<size_t>(me - peer_senders.begin());
    peer.out = ShmRing::attach(peer.segment->data() + ring_offset(index, capacity),
                               ShmRing::footprint(capacity));
  }

  // 3. Acknowledge, saying whether this rank can read the peer's memory (single copy), then
  //    unlink once every peer has mapped this rank's segment.
  for (size_t i = 0; i < senders.size(); ++i) {
    uint8_t readable = 0;
    if (options_.single_copy_bytes > 0) {
      readable = backends::can_read_process(peers_[senders[i]]->pid, probes[i]);
    }
    peers_[senders[i]]->readable = readable != 0;
    store.set(fmt::format("{}/{}/opened/{}", options_.key_prefix, senders[i], matcher_.rank()),
              Bytes{1, readable});
  }
  std::vector<std::string> acks;
  for (int s : senders)
    acks.push_back(fmt::format("{}/{}/opened/{}", options_.key_prefix, matcher_.rank(), s));
  std::vector<Bytes> acked = store.multi_get(acks, timeout);
  for (size_t i = 0; i < senders.size(); ++i) {
    peers_[senders[i]]->single_copy = acked[i].size() == 2 && acked[i][1] == 1;
  }
  segment_->unlink();

  // 4. The shared slots, when every other rank of the group is on this host.
  if (slot_bytes > 0) {
    const size_t at = page_align(Doorbell::kFootprint);
    std::vector<std::byte*> areas;
    for (int r = 0; r < matcher_.size(); ++r) {
      areas.push_back((r == matcher_.rank() ? segment_->data() : peers_[r]->segment->data()) + at);
    }
    ShmSlots::Hooks hooks;
    hooks.progress = [this] {
      progress();
      absorb_single_copy();
      if (options_.progress_beside) options_.progress_beside();
    };
    hooks.check = [this] {
      check_peers(true);
      fail_if_broken();
    };
    hooks.error = [this](ErrorCode code, const std::string& detail) {
      return matcher_.error(code, "shm slots", detail);
    };
    slots_ = std::make_unique<ShmSlots>(
        std::move(areas), matcher_.rank(), slot_bytes, crowded, spin_budget_,
        spin_budget_.count() == 0 ? ShmSlots::kYieldRounds : 0, std::move(hooks));
  }
}

bool ShmTransport::serves(int peer) const {
  return peer >= 0 && peer < matcher_.size() && peers_[peer] != nullptr;
}

collectives::Link ShmTransport::link(int peer) const {
  if (peer == matcher_.rank()) return collectives::Link::Self;
  if (!serves(peer)) {
    throw matcher_.error(ErrorCode::InvalidArgument, "shm link",
                         fmt::format("rank {} is not a shared-memory peer here", peer));
  }
  return collectives::Link::SharedMemory;
}

ShmTransport::Op& ShmTransport::post(int peer, OpKind kind, Tag tag, size_t bytes) {
  if (peer == matcher_.rank() || !serves(peer)) {
    throw matcher_.error(ErrorCode::InvalidArgument, matcher_.op_name(kind),
                         fmt::format("peer {} is not another rank with shared memory here", peer));
  }
  if (bytes > kMaxMessageBytes) {
    throw matcher_.error(ErrorCode::InvalidArgument, matcher_.op_name(kind),
                         fmt::format("{} bytes is more than one message may carry", bytes));
  }
  handle_abort();
  Op& op = matcher_.post(peer, kind, tag, bytes);
  if (!op.finished && kind == OpKind::Send && peers_[peer]->lost) {
    matcher_.fail(op, matcher_.error(ErrorCode::PeerLost, matcher_.op_name(kind),
                                     fmt::format("rank {} {}", peer, peers_[peer]->lost_reason)));
  }
  return op;
}

collectives::Request ShmTransport::send(int peer, const void* data, size_t bytes, Tag tag) {
  Op& op = post(peer, OpKind::Send, tag, bytes);
  if (op.finished) return {op.id};
  op.src = static_cast<const uint8_t*>(data);
  op.header = WireHeader{tag, bytes};
  if (peers_[peer]->single_copy && options_.single_copy_bytes > 0 &&
      bytes >= options_.single_copy_bytes) {
    op.single_copy = true;
    op.header.bytes |= kSingleCopyBit;
    op.descriptor[0] = reinterpret_cast<uintptr_t>(data);
    op.descriptor[1] = op.id;
  }
  peers_[peer]->sends.push_back(&op);
  pump_writes(*peers_[peer]);  // small messages leave at once, as an eager send would
  return {op.id};
}

collectives::Request ShmTransport::recv(int peer, void* data, size_t bytes, Tag tag) {
  Op& op = post(peer, OpKind::Recv, tag, bytes);
  if (op.finished) return {op.id};
  op.dst = static_cast<uint8_t*>(data);
  match_posted_recv(*peers_[peer], op);
  return {op.id};
}

collectives::Request ShmTransport::recv_any(void* data, size_t bytes, Tag tag, int* source) {
  if (bytes > kMaxMessageBytes) {
    throw matcher_.error(ErrorCode::InvalidArgument, "shm recv",
                         fmt::format("{} bytes is more than one message may carry", bytes));
  }
  handle_abort();
  auto [op, peer] = matcher_.post_any_source(peers_, data, bytes, tag, source);
  if (peer != nullptr) match_posted_recv(static_cast<Peer&>(*peer), *op);
  return {op->id};
}

collectives::Request ShmTransport::recv_reduce(int peer, void* dst, size_t count, DType dtype,
                                               ReduceOp reduce_op, Tag tag) {
  reduce::check_supported(dtype, reduce_op);
  const size_t element = dtype_size(dtype);
  if (count > kMaxMessageBytes / element) {
    throw matcher_.error(ErrorCode::InvalidArgument, "shm recv_reduce",
                         fmt::format("{} elements of {} bytes is too many", count, element));
  }
  Op& op = post(peer, OpKind::RecvReduce, tag, count * element);
  if (op.finished) return {op.id};
  op.dst = static_cast<uint8_t*>(dst);
  op.dtype = dtype;
  op.reduce_op = reduce_op;
  op.element = element;
  match_posted_recv(*peers_[peer], op);
  return {op.id};
}

void ShmTransport::match_posted_recv(Peer& peer, Op& op) {
  auto single_copy = matcher_.match_posted_recv(peer, op);
  if (!single_copy) return;
  if (!op.finished) read_single_copy(peer, op, single_copy->address);
  send_ack(peer, single_copy->sender_op);  // the sender may reuse its buffer now
}

bool ShmTransport::pump_writes(Peer& peer) {
  bool moved = false;
  while (!peer.sends.empty() && !peer.lost) {
    Op& op = *peer.sends.front();
    if (op.header_done == 0) {
      if (peer.out->writable_bytes() < kHeaderBytes) break;
      peer.out->write_some(&op.header, kHeaderBytes);
      op.header_done = kHeaderBytes;
      moved = true;
    }
    if (op.single_copy) {
      // The descriptor goes whole (16 bytes, so it never straddles the wrap: see Wire).
      if (peer.out->writable_bytes() < kDescriptorBytes) break;
      peer.out->write_some(op.descriptor, kDescriptorBytes);
      moved = true;
      peer.sends.pop_front();
      peer.awaiting_ack.push_back(&op);  // completes when the receiver has read the data
      continue;
    }
    while (op.done < op.bytes) {
      std::span<std::byte> span = peer.out->writable();
      if (span.empty()) break;
      const size_t n = std::min(span.size(), op.bytes - op.done);
      std::memcpy(span.data(), op.src + op.done, n);
      peer.out->commit(round8(n));  // spans are multiples of 8 long: the padding fits
      op.done += n;
      moved = true;
    }
    if (op.done < op.bytes) break;
    peer.sends.pop_front();
    matcher_.sent(peer, op);  // an orphan or an ack (id 0) is dropped
  }
  if (moved) peer.bell->ring();
  return moved;
}

bool ShmTransport::pump_reads(Peer& peer) {
  bool moved = false;
  while (!peer.corrupt) {
    if (peer.in_state == InState::Header) {
      if (peer.in->readable_bytes() < kHeaderBytes) break;
      peer.in->read_some(&peer.in_header, kHeaderBytes);
      moved = true;
      const bool single_copy = (peer.in_header.bytes & kSingleCopyBit) != 0;
      const uint64_t bytes = peer.in_header.bytes & ~kSingleCopyBit;
      if (bytes > kMaxMessageBytes || (peer.in_header.tag == kAckTag && bytes != kAckBytes)) {
        peer.corrupt = true;  // what follows in the ring is not a stream any more
        lose_peer(peer, fmt::format("sent a corrupt header ({} bytes)", peer.in_header.bytes));
        break;
      }
      if (single_copy || peer.in_header.tag == kAckTag) {
        peer.in_state = InState::Control;
        continue;
      }
      if (!matcher_.start_payload(peer)) break;
      continue;
    }
    if (peer.in_state == InState::Control) {
      const size_t need = peer.in_header.tag == kAckTag ? kAckBytes : kDescriptorBytes;
      if (peer.in->readable_bytes() < need) break;
      peer.in->read_some(peer.in_control, need);
      peer.in_state = InState::Header;
      moved = true;
      handle_control(peer);
      continue;
    }
    if (peer.in_state == InState::Paused) {
      if (!matcher_.start_payload(peer)) break;  // still over the limit
      continue;
    }
    std::span<const std::byte> span = peer.in->readable();
    if (span.empty()) break;
    const size_t n = std::min(span.size(), peer.in_left);
    if (peer.in_op != nullptr) {
      MessageMatcher::deliver(*peer.in_op, reinterpret_cast<const uint8_t*>(span.data()), n);
    } else if (peer.in_unexpected != nullptr) {
      Unexpected& message = *peer.in_unexpected;
      std::memcpy(message.buffer.data.get() + message.got, span.data(), n);
      message.got += n;
    }
    peer.in->consume(round8(n));
    peer.in_left -= n;
    moved = true;
    if (peer.in_left == 0) matcher_.finish_message(peer);
  }
  if (moved) peer.bell->ring();
  return moved;
}

bool ShmTransport::progress() {
  bool moved = false;
  for (auto& peer : peers_) {
    if (!peer) continue;
    moved |= pump_reads(*peer);
    moved |= pump_writes(*peer);
  }
  return moved;
}

bool ShmTransport::has_news() {
  if (matcher_.aborted()) return true;
  for (auto& peer : peers_) {
    if (!peer || peer->lost) continue;
    if (!peer->sends.empty()) {
      const size_t need = peer->sends.front()->header_done == 0 ? kHeaderBytes : 1;
      if (peer->out->writable_bytes() >= need) return true;
    }
    if (peer->in_state != InState::Paused) {
      const size_t need = peer->in_state == InState::Header ? kHeaderBytes
                          : peer->in_state == InState::Control
                              ? (peer->in_header.tag == kAckTag ? kAckBytes : kDescriptorBytes)
                              : 1;
      if (peer->in->readable_bytes() >= need) return true;
    }
  }
  return false;
}

void ShmTransport::wait(collectives::Request request, Clock::time_point deadline) {
  Op& op = matcher_.pending(request, "shm wait");
  for (;;) {
    handle_abort();
    if (!op.finished) progress();
    if (!op.finished) check_peers(false);
    if (matcher_.settle(op, deadline, [&] { withdraw(op); })) return;
    // About to sleep: copy out what peers are waiting for us to read (see absorb_single_copy).
    if (absorb_single_copy()) continue;
    bell_->wait([&] { return op.finished || has_news(); }, deadline, spin_budget_,
                [&] { check_peers(true); });
  }
}

bool ShmTransport::test(collectives::Request request) {
  Op& op = matcher_.pending(request, "shm test");
  handle_abort();
  if (!op.finished) progress();
  if (!op.finished) check_peers(false);
  return op.finished;
}

void ShmTransport::idle(Clock::time_point until) {
  handle_abort();
  if (progress()) return;
  check_peers(false);
  if (absorb_single_copy()) return;
  const uint64_t losses = losses_;
  bell_->wait([&] { return losses_ != losses || has_news(); }, until, spin_budget_,
              [&] { check_peers(true); });
}

void ShmTransport::handle_control(Peer& peer) {
  if (peer.in_header.tag == kAckTag) {
    peer.ack_overdue = false;  // it answers again
    const uint64_t id = peer.in_control[0];
    auto it = std::find_if(peer.awaiting_ack.begin(), peer.awaiting_ack.end(),
                           [&](Op* op) { return op->descriptor[1] == id; });
    if (it == peer.awaiting_ack.end()) return;  // withdrawn after its descriptor went out
    Op& op = **it;
    peer.awaiting_ack.erase(it);
    matcher_.sent(peer, op);  // an orphan (id 0) held a copy of a withdrawn send's data
    return;
  }
  const uint64_t bytes = peer.in_header.bytes & ~kSingleCopyBit;
  const uint64_t address = peer.in_control[0];
  const uint64_t sender_op = peer.in_control[1];
  Op* op = matcher_.take_posted_recv(peer, peer.in_header.tag, bytes);
  if (op == nullptr) {
    // Unexpected: keep only the descriptor; the data waits in the sender's memory.
    Unexpected& message = peer.unexpected.emplace_back();
    message.tag = peer.in_header.tag;
    message.size = bytes;
    message.got = bytes;
    message.charge = 64;
    message.single_copy = true;
    message.address = address;
    message.sender_op = sender_op;
    peer.unexpected_bytes += message.charge;
    return;
  }
  if (!op->finished) read_single_copy(peer, *op, address);  // else: failed on its size
  send_ack(peer, sender_op);
}

void ShmTransport::read_single_copy(Peer& peer, Op& op, uint64_t address) {
  int err = 0;
  if (op.kind == OpKind::Recv) {
    err = backends::read_process(peer.pid, op.dst, address, op.bytes);
  } else {
    if (!staging_.data) staging_ = matcher_.pool().acquire(kSingleCopyPiece);
    err = backends::read_reduce_process(peer.pid, op.dst, address, op.bytes, op.dtype, op.reduce_op,
                                        staging_.data.get(), kSingleCopyPiece);
  }
  if (err == 0) {
    op.done = op.bytes;
    matcher_.complete(op);
  } else {
    auto [code, why] = backends::describe_read_failure(err, peer.rank, peer.pid, op.bytes);
    matcher_.fail(op, matcher_.error(code, matcher_.op_name(op.kind), why));
  }
}

bool ShmTransport::absorb_single_copy() {
  bool moved = false;
  for (auto& peer : peers_) {
    if (!peer || peer->lost) continue;
    for (Unexpected& message : peer->unexpected) {
      if (!message.single_copy) continue;
      const size_t charge = MessageMatcher::unexpected_charge(message.size);
      if (peer->unexpected_bytes - message.charge + charge > matcher_.unexpected_limit() &&
          peer->unexpected.size() > 1) {
        continue;  // over the limit: the sender waits for the receive, as a paused ring would
      }
      backends::PooledBuffer buffer = matcher_.pool().acquire(message.size);
      if (backends::read_process(peer->pid, buffer.data.get(), message.address, message.size) !=
          0) {
        matcher_.pool().release(std::move(buffer));
        continue;  // the receive, once posted, reads it again and reports the error
      }
      peer->unexpected_bytes += charge - message.charge;
      message.charge = charge;
      message.buffer = std::move(buffer);
      message.single_copy = false;
      send_ack(*peer, message.sender_op);
      moved = true;
    }
  }
  return moved;
}

void ShmTransport::send_ack(Peer& peer, uint64_t sender_op) {
  if (peer.lost) return;
  auto ack = std::make_unique<Op>();  // id 0: internal, dropped once written (as an orphan)
  ack->peer = peer.rank;
  ack->header = WireHeader{kAckTag, kAckBytes};
  ack->owned.resize(kAckBytes);
  std::memcpy(ack->owned.data(), &sender_op, kAckBytes);
  ack->src = ack->owned.data();
  ack->bytes = kAckBytes;
  peer.sends.push_back(ack.get());
  peer.orphans.push_back(std::move(ack));
  pump_writes(peer);
}

}  // namespace weft::tcp
