// backends/ucx/ucx_transport.h: collectives::Transport over UCX's tagged messages (UCP).
//
// One UCP context and one worker per group (features TAG and WAKEUP, worker in serialized thread
// mode), and one endpoint per peer created from the peer's worker address. Set-up costs each rank
// one store write (its record: host name and worker address, under "<key_prefix>/<rank>") and one
// batched multi_get of every rank's record, whatever the size of the group.
//
// Transports are UCX's own choice, by its own settings: UCX_TLS as the user sets it (default: UCX
// picks shared memory between ranks of one host and TCP, or RDMA, between hosts); UCX_TLS=tcp
// forces sockets. Before ucp_init the transport asks UCX for what weft needs unless the user set
// it: peer error handling on the shared-memory transports (UCX_POSIX_ERROR_HANDLING and
// UCX_SYSV_ERROR_HANDLING, off by default, which would leave such peers on TCP) and a keepalive
// of WEFT_UCX_KEEPALIVE (default 1s; UCX's own default is 20 s), so that a dead peer on shared
// memory is noticed in about a second.
//
// Matching. UCP matches a receive by a 64-bit tag alone (any sender), so a weft (peer, Tag) is
// folded into one UCP tag: bit 63 the kind (collective or send/recv), bits 62..61 the message
// class (below), bits 60..45 the sender's rank, bits 44..0 the message: for a collective, 26 bits
// of its sequence number, the internal bit and 18 bits of step (every step an algorithm numbers);
// for a send/recv, the user tag folded to 45 bits (user tags that differ only above bit 44 and are
// in flight at once would match each other: docs/ucx.md). UCP keeps messages of one sender with
// one tag in order, which is weft's posting-order rule. Unexpected messages are UCX's to hold
// (eager data buffered, rendezvous data left at the sender until its receive is posted).
//
// Pieces. A message of at least 512 KiB travels as a 16-byte header {magic, bytes} (class 1) and
// pieces of 256 KiB to 1/16 of the message (class 2; the size follows from the byte count alone);
// a smaller one travels whole (class 0). A receive posts the header's receive, and its pieces'
// once the header has landed and its size matched (a mismatch fails it with Error(Protocol) naming
// both sizes): pieces are posted in the order headers land, so message k's pieces land in
// receive k whichever receive (from one rank, or from any rank) took its header.
// Receive-and-reduce receives into a staging buffer taken from a pool (allocated, touched and
// registered with UCX once, ucp_mem_map, reused by later receives) and combines each piece into
// the destination as it lands, while the next pieces are in transfer.
//
// Single copy (opt-in: WEFT_UCX_SINGLE_COPY=<bytes>). A collective's message of at least that many
// bytes to a peer on this host that can read this process's memory (each rank probes its local
// peers at set-up with process_vm_readv and lists those it can read in its "connected" record,
// beside its threshold) travels as a header only, {kSingleCopyMagic, bytes, address, request id},
// in class 1 like a piece header; both sides decide by the same rule, so the receive expects it
// (anything else is Error(Protocol)). A receive reads the data straight from the sender's buffer
// (one copy where the shared-memory FIFO takes two) and answers with an acknowledgement (class 3,
// the reader's rank, the request id), on which the send completes. A receive-and-reduce answers
// "send the pieces" instead and receives them as above: reading, then reducing, costs the
// receiver more than reducing what the sender's UCX copied. Point-to-point messages never go by
// single copy: their receive may be posted much later, and the sender would wait for it.
//
// Failure. Endpoints use UCP_ERR_HANDLING_MODE_PEER: a dead peer (its sockets closed, or its
// process gone as the keepalive finds) fails its endpoint; every pending and later request with
// that peer then fails with Error(PeerLost) naming it and UCS's status string. abort() sends each
// peer a short hang-up message (a reserved tag), so that a peer blocked on this rank learns at
// once, as TCP's closed socket tells it, then closes the endpoints and fails every request with
// Error(Aborted). A rank that gets a hang-up fails its requests with that peer at once and its
// other requests a second later (unless they end first): the group is over. A deadline passed fails
// the request with Error(Timeout) naming peer, tag and bytes; a timed-out send closes its endpoint
// (UCX cannot take back a send in flight), so that the caller's buffer is free when wait() throws.
//
// Unexpected messages. A rendezvous message (a large one, and every piece) stays with its sender
// until a receive for it is posted, so its send cannot complete before that: a rank that sends
// 8 MiB and then runs a collective, against a peer that runs the collective first and receives
// afterwards, would wait until the timeout (each group runs its calls in issue order). So a wait
// that has found nothing to do for 100 ms takes every message UCX holds unexpected from a live
// peer (ucp_tag_probe_nb with remove, then ucp_tag_msg_recv_nbx into a buffer of its own: an
// absorption), up to 256 MiB held at once, without waiting for the data: it lands as the worker
// progresses. Every receive the transport posts looks among the absorptions first, oldest first,
// under its tag and mask, as UCX would have matched them: one that has landed is delivered at once,
// one still landing is bound to the receive and delivered when it lands (a sender lost meanwhile
// fails it, as it would a posted receive). A receive cancelled while bound lets its absorption go
// back to the list, as UCX keeps a message whose receive was cancelled. Only after that pause, so
// that a message arriving early in a running collective is matched by UCX without the extra copy.
//
// Progress runs on the thread that waits (the backend's progress thread): ucp_worker_progress in a
// loop for a short, bounded spin (WEFT_SPIN_US; none while the group's ranks on this host
// outnumber its cores; then a few sched_yield() rounds instead), then asleep on the worker's event
// fd (ucp_worker_arm, poll) beside an eventfd that abort() writes. The sleep is cut into slices of
// at most 100 ms so that UCX's keepalive runs while nothing arrives.
//
// Thread safety: one thread posts and waits; abort() may be called from any thread. A mutex
// serialises the worker between them (held by the waiting thread except while it sleeps).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/error.h"
#include "weft/store.h"

#include "collectives/transport.h"

// UCX's handles, as ucp.h declares them, so that this header does not need UCX's.
typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;
typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_mem* ucp_mem_h;

namespace weft::ucx {

// The UCP tag of a weft message from `sender` with tag `tag` (see "Matching" above).
uint64_t ucp_tag_of(collectives::Tag tag, int sender);
// The most ranks a group over UCX may have: the sender's rank has 16 bits, all ones reserved.
inline constexpr int kMaxRanks = 65535;

// Whether UCX_TLS, as the user set it, lets UCX move data between local ranks through shared
// memory: unset, a list naming "all", "sm", "shm", "mm", "posix" or "sysv", or an exclusion list
// ("^tcp") that does not take both posix and sysv (or "sm", "mm") out.
bool tls_may_use_shared_memory();

class UcxTransport final : public collectives::Transport {
 public:
  struct Options {
    std::string group_name = "world";
    // Rank r's record is "<key_prefix>/<r>" in the group's store.
    std::string key_prefix = "ucx";
    // Bounds set-up (every rank's record must appear within it).
    std::chrono::milliseconds timeout{300'000};
    // Messages of a collective of at least this many bytes between ranks of one host go by
    // single copy (see above); 0: never (the default: see docs/ucx.md). WEFT_UCX_SINGLE_COPY,
    // when set, wins; off where UCX_TLS rules out cross-memory attach.
    size_t single_copy_bytes = 0;
    // What why_no_symmetric_memory() says (the backend knows why it paired no host memory).
    std::string why_no_symmetric_memory = "its transport has no memory shared between the ranks";
  };

  // Creates this rank's context, worker and endpoints (collective over the group's ranks).
  // Throws Error(Io) naming UCS's status when UCX fails, Error(Timeout) naming the ranks whose
  // record is missing, Error(InvalidArgument) for a bad rank, size or record.
  static std::unique_ptr<UcxTransport> connect(Store& store, int rank, int size,
                                               const Options& options);
  ~UcxTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  collectives::Link link(int peer) const override {
    return peer == rank_ ? collectives::Link::Self : collectives::Link::Ucx;
  }

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
  // Moves what UCX can move and takes in the messages it holds unexpected from live peers, then
  // drives those to the end (bounded by kBesideBound), without waiting for anything else: how a
  // wait that carries no UCX messages (host memory's barriers: host_memory_transport.h) lets a
  // peer held in a send to this rank finish it. Owner thread; fails no request of its own (a
  // peer found lost fails the requests with it, as in wait()).
  void progress_beside();
  std::string why_no_symmetric_memory() const override { return options_.why_no_symmetric_memory; }

  struct Op;  // one request (ucx_transport.cc)
  struct Piece;
  struct Absorption;  // below

 private:
  UcxTransport(int rank, int size, Options options);

  // "rank 1/4 group "world" ucx recv: <detail>".
  Error error(ErrorCode code, const char* op, const std::string& detail) const;
  Op& post(int peer, int kind, collectives::Tag tag, size_t bytes);
  Op& pending(collectives::Request request, const char* what);
  // Calls ucp_worker_progress until it finds nothing; then handles what the callbacks noted
  // (lost peers, hang-ups, finished requests). True when anything progressed.
  bool progress();
  void handle_news();
  // Fails every request with `peer` with Error(PeerLost), once.
  void lose_peer(int peer, const std::string& why);
  // On the worker's owner (mutex held): hangs up and fails everything, once after abort().
  void handle_abort();
  // Closes `peer`'s endpoint (force) and waits, bounded, for UCX to let go of its requests.
  void close_endpoint(int peer, bool force);
  // Waits (progressing) until `done` or `bound` has passed.
  template <class Done>
  void progress_until(Done&& done, std::chrono::milliseconds bound);
  // The request has its result: forgets it (once UCX has let go) and throws its error.
  void finish(Op& op);
  void post_hangup_receive();
  // Posts one request of `op` (a whole message, a header or a piece) with `ucp_tag`.
  void post_piece(Op& op, Piece& piece, uint64_t ucp_tag, uint64_t tag_mask);
  // Posts a receive's whole message or header; post_pieces() its pieces once the header landed.
  void start_receive(Op& op, uint64_t ucp_tag, uint64_t tag_mask);
  void post_pieces(uint64_t id);
  void cancel_receives(Op& op);
  // A single-copy header has landed in receive `op`: reads (or reduces) the data from the
  // sender's memory and acknowledges, saying whether it did.
  void read_single_copy(Op& op);
  void send_ack(int peer, uint64_t sender_op, uint64_t answer);
  void sleep_until(collectives::Clock::time_point until);
  // Starts an absorption of every message UCX holds unexpected from a live peer (above); true when
  // it started any.
  bool absorb_unexpected();
  // Gives `piece` (a receive being posted with `ucp_tag` under `tag_mask`) the oldest absorption
  // that matches, delivered now or bound until it lands; false when none matches.
  bool take_absorbed(Piece& piece, uint64_t ucp_tag, uint64_t tag_mask);

  const int rank_;
  const int size_;
  const Options options_;
  std::string names_[3];  // "ucx send", "ucx recv", "ucx recv_reduce"

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1;  // ucp_worker_get_efd's: UCX owns it
  int abort_fd_ = -1;   // an eventfd abort() writes to wake a sleeping wait()
  std::vector<ucp_ep_h> endpoints_;
  std::vector<std::string> lost_;  // by peer: why it is lost; "" while alive
  // By peer: 1 once UCX kept a failed receive with it past kLetGoBound (finish()).
  std::vector<uint8_t> stuck_with_;
  std::vector<pid_t> readable_pid_;  // by peer: its process, where this rank can read it; else 0
  // By peer: from how many bytes on it reads this rank's messages by single copy; 0: never.
  std::vector<size_t> copy_from_;
  size_t single_copy_from_ = 0;     // the same, for the peers this rank reads (readable_pid_)
  uint64_t single_copy_reads_ = 0;  // messages read by single copy, and handed over in pieces
  uint64_t single_copy_declined_ = 0;
  // What each endpoint's error handler gets: (this, peer).
  std::vector<std::unique_ptr<std::pair<UcxTransport*, int>>> handler_args_;
  bool in_news_ = false;
  bool closing_ = false;
  // After a peer hung up: when requests with other peers are abandoned, and why.
  std::optional<collectives::Clock::time_point> hangup_grace_end_;
  int hangup_peer_ = -1;
  std::string hangup_why_;
  void abandon_after_hangup();  // the destructor runs: the hang-up receive is not posted again
  std::chrono::nanoseconds spin_budget_{0};
  int yield_rounds_ = 0;  // sched_yield() rounds before sleeping, when ranks outnumber cores

  std::mutex mutex_;  // serialises everything below between the owner and abort()
  std::unordered_map<uint64_t, std::unique_ptr<Op>> ops_;
  uint64_t next_id_ = 1;
  // The staging pool of recv_reduce: buffers of a power-of-two size, allocated and touched once.
  struct Staging {
    size_t capacity = 0;
    std::unique_ptr<uint8_t[]> data;
    ucp_mem_h memh = nullptr;  // its registration, made once (null: UCX's cache registers it)
  };
  Staging take_staging(size_t bytes);
  void unmap(Staging& staging);
  std::vector<Staging> staging_free_;
  // Absorptions, oldest first (unique_ptr: UCX's callback holds the address), and their bytes.
  std::deque<std::unique_ptr<Absorption>> absorbed_;
  size_t absorbed_bytes_ = 0;
  // What UCX's callbacks noted for handle_news().
  std::vector<std::pair<int, std::string>> lost_news_;
  std::vector<uint64_t> released_;  // requests UCX let go of after their wait() returned
  std::vector<uint64_t> headers_;   // receives whose piece header landed, in landing order
  // The hang-up receive: a peer's rank and reason land here.
  struct Hangup;
  std::unique_ptr<Hangup> hangup_;

  std::atomic<bool> aborted_{false};
  bool abort_handled_ = false;  // under mutex_
  std::mutex reason_mutex_;
  std::string abort_reason_;  // guarded by reason_mutex_; set before aborted_

 public:
  // For UCX's C callbacks (ucx_transport.cc) only.
  void note_lost(int peer, const std::string& why) { lost_news_.emplace_back(peer, why); }
  void note_released(uint64_t id) { released_.push_back(id); }
  void note_header(uint64_t id) { headers_.push_back(id); }
  void note_hangup();
  // One message taken unexpected (see "Unexpected messages"): its tag, its bytes as they land,
  // the outcome (a ucs_status_t; 0 is UCS_OK) and the receive waiting for it, if any.
  struct Absorption {
    UcxTransport* transport = nullptr;
    uint64_t tag = 0;
    std::vector<uint8_t> data;
    bool done = false;
    int status = 0;
    Piece* bound = nullptr;
  };
  // The absorption has landed: delivers it to its receive, if one is bound (and forgets it).
  void note_absorbed(Absorption& absorption);
  // Delivers a landed absorption's bytes and outcome to `piece` as UCX would have.
  static void deliver(const Absorption& absorption, Piece& piece);
};

}  // namespace weft::ucx
