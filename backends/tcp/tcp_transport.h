// backends/tcp/tcp_transport.h: collectives::Transport over one TCP connection per peer.
//
// Wire: each message is a 16-byte header {tag u64, bytes u64} (host byte order: both ends are
// weft on one architecture) followed by `bytes` bytes of payload. Messages on one connection
// arrive in the order they were posted, which gives Transport's matching rule (same peer and
// tag: posting order) for free.
//
// Sends are written with one sendmsg() gathering the headers and payloads of queued sends (no
// copy of the payload). Receives read the header, then the payload straight into the posted
// buffer when its receive is already posted (zero copy). Otherwise the message is "unexpected":
// it is read into a buffer of its own, and the receive, once posted, takes it from there (a copy)
// and reads any remainder straight into its own buffer. Unexpected bytes are bounded per peer
// (Options::unexpected_limit): when a message would go past it, reading from that peer pauses
// (TCP pushes back on the sender) until a receive for that message is posted or buffered
// messages are taken; the paused message is then read with zero copy.
//
// recv_reduce() reads its payload in pieces into one staging buffer, allocated and touched when
// the transport is built (never per call: first touch costs ~13 us per 4 KiB page here), and
// reduces each piece into the destination with reduce::accumulate as it lands.
//
// Progress happens only on the thread in wait() or test(), which moves bytes on every peer's
// socket, both directions, without blocking; when nothing can move, wait() sleeps in epoll_wait
// (edge-triggered) until a socket is ready, the deadline passes, or abort() writes the eventfd.
// So two ranks sending each other large messages at once never deadlock.
//
// Failures (see collectives/transport.h): end of stream or a reset fails every pending and later
// request with that peer with Error(PeerLost) naming it (messages it sent completely before
// closing can still be received); a deadline passing throws Error(Timeout) naming peer, tag and
// bytes outstanding. The request is then withdrawn and the connection stays usable: a send
// already partly written is finished from a copy, a receive already partly read has the rest of
// its message discarded. A size mismatch fails the receive with Error(Protocol) and discards the
// message (the sender learns of it from the collective's next failure, not from its send).
// abort() shuts every connection down, so the peers see PeerLost at once rather than time out.
//
// Limitation of the pause: while reading from a peer is paused, a peer that dies is noticed
// only at the deadline (Timeout, not PeerLost): its kernel holds the end of the stream behind
// the bytes we decline to read. Likewise a program that waits for a message queued behind one
// it has not posted a receive for, with more than the limit already buffered, waits until its
// deadline. Collectives post each step's receives before waiting, so they stay far below it.
//
// A send completes when its last byte is in the kernel's socket buffer: the caller may reuse
// the buffer then; it says nothing about the peer having received it.
//
// Matching, the unexpected limit, withdrawing and the failure wording are the MessageMatcher's
// (backends/common/message_matcher.h), shared with the shared-memory transport; this file is the
// byte pump.
//
// Costs: unexpected messages are copied once and their buffers come from a pool (UnexpectedPool),
// so a late receiver does not pay first-touch page faults per message. A message
// costs the receiver two recv() calls (header, then payload); for floods of tiny messages a
// read-ahead buffer would halve that, which matters less than it seems here: collectives send
// few, large messages per step.
//
// Thread safety: one thread posts, waits and tests; abort() may be called from any thread.
// Ownership: owns its sockets, epoll fd, eventfd and staging buffer; buffers are borrowed until
// their request completes or its wait() throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/error.h"

#include "backends/common/message_matcher.h"
#include "backends/common/pending_message.h"
#include "collectives/transport.h"
#include "runtime/socket.h"

namespace weft::tcp {

class TcpMesh;

namespace detail {

// One connection and everything queued on it.
struct TcpPeer : backends::PeerQueues {
  net::Socket socket;
  // Edge-triggered readiness: set by epoll events, cleared when a call returns EAGAIN.
  bool readable = true;
  bool writable = true;
  // It sent the abort marker (urgent data, see abort()) before hanging up.
  bool aborted = false;
  // Bytes this rank has read from the stream: at the hang-up, fewer than the kernel received
  // means a normal read skipped the marker (see TcpTransport::lose_peer).
  uint64_t bytes_read = 0;
  size_t in_header_got = 0;  // bytes of in_header read so far
};

}  // namespace detail

class TcpTransport final : public collectives::Transport {
 public:
  struct Options {
    // For messages: "rank 1/4 group "world" tcp recv: ...".
    std::string group_name = "world";
    // Size of the recv_reduce staging buffer. 1 MiB holds more than one socket read on loopback
    // (~256 KiB) while staying in L2-sized cache-friendly pieces.
    size_t staging_bytes = size_t{1} << 20;
    // Most bytes of unexpected messages buffered per peer before reading from it pauses. Each
    // message counts its buffer (its size rounded up to a power of two, at least 64 bytes) plus
    // 64 bytes of bookkeeping, so the limit bounds memory for floods of small messages too.
    size_t unexpected_limit = size_t{64} << 20;
  };

  // Takes the connected sockets (indexed by rank; this rank's entry and the entries of peers
  // served by another transport are invalid). Sets them non-blocking with TCP_NODELAY.
  TcpTransport(int rank, int size, std::vector<net::Socket> sockets, Options options);
  TcpTransport(TcpMesh&& mesh, Options options);
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  int rank() const override { return matcher_.rank(); }
  int size() const override { return matcher_.size(); }
  collectives::Link link(int peer) const override;

  // Throw Error(InvalidArgument) for a peer out of range, this rank, or a peer without a
  // connection here. Never block.
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

  // Collects readiness without blocking and moves whatever can move on every connection,
  // whichever request it serves. How a composite transport drives this one while it waits on
  // another: test() of a request that has finished moves nothing, and a peer whose sends fill
  // the socket waits until this rank reads.
  void poll();

 private:
  using Op = backends::Op;
  using Peer = detail::TcpPeer;

  // Checks the peer and registers a request; fails it at once after abort().
  Op& post(int peer, backends::OpKind kind, collectives::Tag tag, size_t bytes);
  // Moves bytes on one peer's socket until it would block; returns true if anything moved.
  bool pump_writes(Peer& peer);
  bool pump_reads(Peer& peer);
  // Handles a complete incoming header: picks where its payload goes.
  void on_header(Peer& peer);
  // Reads the current message's payload once; returns bytes read, 0 on EAGAIN or loss.
  size_t read_payload(Peer& peer);
  // One pass over every peer, both directions; true when any bytes moved.
  bool progress();
  void wait_for_events(collectives::Clock::time_point deadline);
  void lose_peer(Peer& peer, const std::string& why);
  // Reads a pending urgent byte; sets peer.aborted when it is the abort marker. It must be read
  // before a normal read passes its place in the stream, which discards it.
  void take_abort_marker(Peer& peer);
  // At the hang-up: whether the kernel received bytes that no read returned, which can only be
  // the marker skipped by a normal read that started at it (Linux then forgets urgent data).
  bool skipped_abort_marker(const Peer& peer) const;
  // What the set-up read from a connection (its handshake): the kernel's count of bytes received
  // less those still unread, taken in the order that can only overstate it (a marker skipped
  // then goes unnoticed, as before, rather than a plain hang-up reading as an abort).
  static uint64_t bytes_read_so_far(int fd);
  // Withdraws a pending op after its wait() timed out, keeping the byte stream consistent.
  void withdraw(Op& op);
  void handle_abort();

  const Options options_;
  backends::MessageMatcher matcher_;          // requests, matching, unexpected messages' buffers
  std::vector<std::unique_ptr<Peer>> peers_;  // indexed by rank; null for unconnected ranks
  std::unique_ptr<uint8_t[]> staging_;
  net::Socket epoll_;
  net::Socket wakeup_;  // eventfd that abort() writes
};

}  // namespace weft::tcp
