// backends/tcp/shm_transport.h: collectives::Transport over shared-memory rings between the
// ranks of a group that run on one host.
//
// Layout. Every rank creates one segment (shm_segment.h) that holds its Doorbell and one ShmRing
// per peer that sends to it: rank r's segment is [doorbell][ring from s0][ring from s1]..., the
// senders s0 < s1 < ... being r's shared-memory peers. So each ordered pair (sender -> receiver)
// has its own single-producer single-consumer ring, and the ring lives with its reader: a
// sender that dies leaves what it wrote readable. Setup (collective over the shared-memory
// peers, one store round trip):
//   1. create and format the segment, set "<key_prefix>/<rank>" to "name capacity s0,s1,...";
//      a rank that cannot create it (a full /dev/shm) sets "! <its error>" instead, so that its
//      peers fail at once with Error(Io) naming it rather than at their timeout;
//   2. multi_get the peers' records, open their segments, attach the ring towards each peer
//      (found by this rank's position in that peer's sender list) and the peer's doorbell;
//   3. set "<key_prefix>/<peer>/opened/<rank>" for each peer; wait for every peer's key for this
//      rank, then unlink the segment's name, so nothing is left in /dev/shm if the job dies.
// Segment names are "/weft-<job tag>-<group id>-<creator pid>-r<rank>" (shm_job_prefix()):
// unique on the host, and removable by the job's launcher if the rank dies before step 3.
//
// Wire. A message is a 16-byte header {tag u64, bytes u64} then the payload, padded to a
// multiple of 8 bytes. Both sides commit and consume multiples of 8 only, and the ring capacity
// is a multiple of 64, so every readable()/writable() span is a multiple of 8 bytes long and
// 8-byte aligned, and every payload starts 8-byte aligned: recv_reduce() reduces straight from
// readable() into the destination, and no element (at most 8 bytes) is ever split across the
// ring's wrap point. A message larger than the ring streams through it in pieces.
//
// Single copy. A message of at least Options::single_copy_bytes to a peer that can read this
// process's memory (tested at setup: each rank reads a probe word from each peer with
// process_vm_readv and says so in its acknowledgement) carries, instead of its payload, a
// descriptor {address, request id} (the header's bytes field has its top bit set). The receiver
// reads the data straight from the sender's buffer into the receive (recv_reduce: in L2-sized
// pieces through a staging buffer, reducing each) and answers with an ack message (tag all ones,
// the request id); the send completes on the ack. One copy instead of two, and no ring
// round trips for the payload: this is what Open MPI's vader does with CMA. A descriptor that
// arrives before its receive waits unread (the data stays with the sender) until the receive is
// posted, or until this rank is about to sleep, when it is copied into a pooled buffer and
// acknowledged, so that ranks that both send before they receive still complete.
//
// Matching follows transport.h and is the MessageMatcher's (backends/common/message_matcher.h),
// shared with the TCP transport: per peer, an arriving header is matched against the posted
// receives from that peer in posting order; without one, the message is unexpected and copied
// into a buffer from a pool (never allocated per message once warm), bounded per peer by
// Options::unexpected_limit: past it, reading from that peer pauses (the ring fills and the
// sender waits) until a receive for the message is posted. A single message larger than the
// limit is still buffered when nothing else is, so that no message size can stall a peer.
//
// Progress and blocking. Bytes move only on the thread in wait()/test() (or idle()): one pass
// writes every peer's pending sends into its ring and reads every incoming ring. A sender rings
// the receiver's doorbell after each commit, a receiver the sender's after each consume (so a
// writer blocked on a full ring wakes). When a pass moves nothing, wait() sleeps on this rank's
// doorbell: it spins for spin_budget_for(local ranks) first, which is 0 when the ranks on the
// host outnumber its cores, so oversubscribed ranks block in the kernel instead of spinning.
//
// Liveness. A dead process does not close a mapping, so each pair keeps its TCP connection from
// the mesh as a control socket, never read or written: at least once per doorbell slice (50 ms)
// of sleeping, and once per slice of busy waiting, the sockets are polled for POLLRDHUP/POLLHUP
// without reading. A peer whose socket hung up (it died, closed its transport, or aborted) is
// lost: what it committed before is still received, then every pending and later request
// involving it fails with Error(PeerLost) naming it. abort() shuts the control sockets down, so
// the peers learn of it within a slice.
//
// Deadlines: wait() past its deadline throws Error(Timeout) naming the peer, the tag and the
// bytes outstanding, and withdraws the request, keeping the stream consistent (a send already
// started is finished from a copy; the rest of a receive already started is discarded).
//
// Thread safety: one thread posts, waits, tests and idles; abort() may be called from any
// thread. Ownership: owns its segments (mappings), control sockets and pooled buffers; buffers
// passed to send/recv are borrowed until their request completes or its wait() throws.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weft/error.h"
#include "weft/store.h"

#include "backends/common/message_matcher.h"
#include "backends/tcp/doorbell.h"
#include "backends/tcp/shm_segment.h"
#include "backends/tcp/shm_slots.h"
#include "collectives/transport.h"
#include "runtime/socket.h"

namespace weft::tcp {

namespace detail {
struct ShmPeer;
}

class ShmTransport final : public collectives::Transport {
 public:
  struct Options {
    // For messages: "rank 1/4 group "world" shm recv: ...".
    std::string group_name = "world";
    // Store keys of the setup: "<key_prefix>/<rank>", ... Unique per group in its store.
    std::string key_prefix = "weft/shm";
    // Goes into segment names; the mesh's group id (TcpMesh::group_id()) tells groups apart.
    uint64_t group_id = 0;
    // Bytes per ring (a power of two >= 4 KiB). 2 MiB holds several 256 KiB collective
    // segments in flight, while a group of 8 local ranks maps 8 * 7 * 2 MiB = 112 MiB in all.
    size_t ring_bytes = size_t{2} << 20;
    // Most bytes of unexpected messages buffered per peer before reading from it pauses.
    size_t unexpected_limit = size_t{64} << 20;
    // Bounds the setup. 0: config().timeout (WEFT_TIMEOUT).
    std::chrono::milliseconds timeout{0};
    // Processes sharing this host's cores, for the spin budget. 0: this rank and its peers here.
    int local_ranks = 0;
    // Messages of at least this many bytes go by single copy (see Single copy above) to peers
    // that can read this process's memory; 0: never.
    size_t single_copy_bytes = 64 * 1024;
    // Bytes per slot of the shared slots for small collectives (shm_slots.h), offered when this
    // transport serves every other rank of the group (the group is on one host); 0: none. Every
    // rank must pass the same value (set-up fails with InvalidArgument naming the one that
    // differs).
    size_t slot_bytes = 65536;
    // Moves another transport's messages without blocking, for the waits that carry none of this
    // transport's (the slots' barrier, wait_beside()): where this transport lends its memory to
    // another that carries the messages (backends/common/host_memory_transport.h), a peer may be
    // held in a send to this rank until that transport takes the message in. Called before the
    // first sleep of such a wait and once per slice (50 ms) after; what it throws fails that wait.
    std::function<void()> progress_beside;
  };

  // Connects to the peers whose entry in `control` is a valid socket (indexed by rank; this
  // rank's entry is ignored): those must be on this host, and the relation must be symmetric
  // (if a serves b by shared memory, b serves a). Collective over those peers. Throws
  // Error(InvalidArgument) for bad arguments, Error(Timeout) when a peer's record or
  // acknowledgement is missing at the deadline, Error(Io) when this rank's segment or a peer's
  // cannot be made (a full /dev/shm says so, with the size wanted and what to do).
  ShmTransport(Store& store, int rank, int size, std::vector<net::Socket> control, Options options);
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  int rank() const override { return matcher_.rank(); }
  int size() const override { return matcher_.size(); }
  // SharedMemory for the peers served here, Self for this rank; Error(InvalidArgument) else.
  collectives::Link link(int peer) const override;
  bool serves(int peer) const;

  collectives::Request send(int peer, const void* data, size_t bytes,
                            collectives::Tag tag) override;
  collectives::Request recv(int peer, void* data, size_t bytes, collectives::Tag tag) override;
  collectives::Request recv_any(void* data, size_t bytes, collectives::Tag tag,
                                int* source) override;
  bool supports_recv_any() const override { return true; }
  collectives::Request recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                                   collectives::Tag tag) override;
  void wait(collectives::Request request, collectives::Clock::time_point deadline) override;
  bool test(collectives::Request request) override;
  void abort(const std::string& reason) override;

  // Moves what can move; when nothing could, sleeps on the doorbell until a ring has news, a
  // peer is found lost, abort() is called, or `until`. Never throws for a request: it is how a
  // composite transport waits on this one while it has requests elsewhere.
  void idle(collectives::Clock::time_point until);

  // For waits on memory the peers share beside the rings (symmetric buffers): rings every peer's
  // doorbell, after the caller published what they may wait for.
  void ring_peers();
  // Sleeps on this rank's doorbell until ready() (true) or the deadline (false), with the
  // transport's spin budget, checking the peers' liveness at least once per slice (50 ms).
  // Throws Error(PeerLost) naming a peer found lost, Error(Aborted) after abort(), but only while
  // ready() is false (a peer gone after doing its part fails nothing). Moves no ring traffic: the
  // caller runs it when no request is pending.
  bool wait_beside(const std::function<bool()>& ready, collectives::Clock::time_point deadline);

  // Whether this rank can read every peer's memory with process_vm_readv (probed at setup, as
  // single copy is; false when single copy is off).
  bool reads_every_peer() const;
  // Whether this host's ranks outnumber its cores (as seen by any rank of the group: the same on
  // every rank).
  bool crowded() const { return crowded_; }
  // Copies `bytes` at `address` in peer `peer`'s process into `to`. Throws Error(PeerLost) when
  // the peer is gone, another code (backends::describe_read_failure) when the kernel refuses.
  void read_peer(int peer, void* to, uint64_t address, size_t bytes);

  // Times this rank slept on its doorbell (for tests: proves that waits block).
  uint64_t sleeps() const { return bell_ ? bell_->sleeps() : 0; }

  // The shared slots for small collectives, when every other rank of the group is served here
  // and Options::slot_bytes > 0; else null. Owned by the transport.
  collectives::SharedSlots* shared_slots() override { return slots_.get(); }

 private:
  using Op = backends::Op;
  using Peer = detail::ShmPeer;

  void setup(Store& store, std::vector<net::Socket> control);
  Op& post(int peer, backends::OpKind kind, collectives::Tag tag, size_t bytes);
  // Posts a receive with the matcher; reads a single-copy message it matched.
  void match_posted_recv(Peer& peer, Op& op);
  bool pump_writes(Peer& peer);
  bool pump_reads(Peer& peer);
  bool progress();
  // True when a pass could move something (the doorbell's ready predicate).
  bool has_news();
  // Polls the control sockets (throttled to once per slice unless `now_please`).
  void check_peers(bool now_please);
  void lose_peer(Peer& peer, const std::string& why);
  // Single copy: a descriptor or an ack has been read (peer.in_header, peer.in_control).
  void handle_control(Peer& peer);
  // Reads a single-copy message's data from the peer into the receive (or reduces it) and
  // completes or fails the receive. The caller acknowledges.
  void read_single_copy(Peer& peer, Op& op, uint64_t address);
  void send_ack(Peer& peer, uint64_t sender_op);
  // Copies the data of unexpected single-copy messages into pooled buffers (within the
  // unexpected limit) and acknowledges them, so their senders complete; returns whether it did
  // any. Called when this rank is about to sleep: a program that sends before it receives on both
  // sides (legal with buffered sends) must not deadlock on single copy.
  bool absorb_single_copy();
  void withdraw(Op& op);
  void handle_abort();
  // Throws Error(Aborted) after abort(), Error(PeerLost) naming a lost peer (preferring one that
  // died to one that hung up because it broke on that death).
  void fail_if_broken();

  const Options options_;
  backends::MessageMatcher matcher_;          // requests, matching, unexpected messages' buffers
  std::vector<std::unique_ptr<Peer>> peers_;  // indexed by rank; null where not served
  std::optional<ShmSegment> segment_;         // this rank's: its doorbell and incoming rings
  std::optional<Doorbell> bell_;
  std::chrono::nanoseconds spin_budget_{0};
  std::unique_ptr<ShmSlots> slots_;
  backends::PooledBuffer staging_;  // recv_reduce of single-copy messages: read a piece, reduce it
  collectives::Clock::time_point next_liveness_check_{};
  uint64_t losses_ = 0;   // peers lost so far: wakes idle()
  bool crowded_ = false;  // set up once; see crowded()
};

}  // namespace weft::tcp
