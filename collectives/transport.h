// collectives/transport.h: the point-to-point interface every collective algorithm runs on.
//
// An algorithm (ring all-reduce, binomial broadcast, ...) is written once against Transport; the
// TCP backend implements it with sockets between hosts and shared-memory rings between ranks on
// one host (chosen per peer pair at setup), and the UCX backend with UCX's tagged messages. An
// algorithm never knows which it got, and never includes a backends/ header.
//
// Model
//   A Transport connects the `size()` ranks of one process group. A rank posts sends and
//   receives of byte ranges to and from peers, each with a Tag (tag.h: the bits of every kind
//   of tag), and later waits for them.
//   Posting never blocks; wait() blocks (bounded spin, then epoll/futex) until the request is
//   done, driving the transport's progress on the calling thread while it waits.
//
// Matching
//   A send from rank A to rank B with tag T matches B's receive from A with tag T. Several
//   messages with the same (peer, tag) match in posting order. Messages whose receive is not yet
//   posted are held by the transport (up to its buffering limit; a sender past the limit waits).
//   A receive's size must equal the matching send's: a mismatch fails both with
//   Error(Protocol) naming the peer, the tag and both sizes (it means the ranks disagree about
//   the collective, which WEFT_DEBUG=detail reports earlier and better as Desync).
//
// Receive-and-reduce
//   recv_reduce() combines incoming elements into `dst` (dst[i] = dst[i] op in[i]) with the
//   runtime's reduce kernels. The shared-memory transport reduces straight from the ring, with
//   no copy into a staging buffer; the TCP transport reduces each piece as it lands, so the
//   reduction of one piece overlaps the transfer of the next.
//
// Failure
//   A peer that dies or closes its connection fails every pending and later request that
//   involves it with Error(PeerLost) naming the peer, at once (shared memory has its own liveness
//   signal: the control connection each pair keeps). wait() past its deadline throws
//   Error(Timeout) naming the peer, tag and bytes still outstanding. abort() from any thread makes
//   every blocked and later wait() throw Error(Aborted).
//
// Thread safety: one thread posts and waits (the process group's progress thread); abort() may be
// called from any thread. Ownership: buffers are borrowed until their request completes (wait()
// returned or threw); the Transport owns its sockets, mappings and staging buffers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "weft/dtype.h"
#include "weft/reduce_op.h"

#include "collectives/tag.h"

namespace weft::collectives {

class SymmetricMemory;  // symmetric_memory.h
class SharedSlots;      // shared_slots.h

using Clock = std::chrono::steady_clock;

// The peer of a receive from any source (Transport::recv_any).
inline constexpr int kAnySource = -1;

// A posted request. Valid until wait() returns or throws for it.
struct Request {
  uint64_t id = 0;
};

// How a pair of ranks is connected; algorithms may plan by it (the planner does).
enum class Link : uint8_t { Self, SharedMemory, Tcp, Ucx };

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Link link(int peer) const = 0;

  // Which node (host, or shared-memory domain) rank `r` is on, as a number that every rank of the
  // group computes alike for every r: ranks share a node exactly when they reach each other over
  // shared memory. Hierarchical collectives plan by it (hierarchical.h). The default knows no
  // grouping: every rank its own node (the UCX transport, whose own shared memory hides it).
  virtual int node_of(int r) const { return r; }

  // Posts a send of `bytes` bytes at `data` to `peer`.
  // REQUIRES: 0 <= peer < size(), peer != rank(); data unchanged until the request completes.
  virtual Request send(int peer, const void* data, size_t bytes, Tag tag) = 0;

  // Posts a receive of exactly `bytes` bytes from `peer` into `data`.
  virtual Request recv(int peer, void* data, size_t bytes, Tag tag) = 0;

  // Posts a receive of `count` elements from `peer`, combined into dst: dst[i] = dst[i] op in[i]
  // (Avg and PremulSum combine as Sum; the algorithm finalises). The sender sends count *
  // dtype_size(dtype) bytes with send().
  virtual Request recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                              Tag tag) = 0;

  // Posts a receive of exactly `bytes` bytes with `tag` from whichever peer's message matches
  // first (c10d's recv from any source). *source becomes that peer when the receive is matched,
  // before it completes (`source` is borrowed like `data`). A message goes to the earliest posted
  // of the receives that could take it: one from its peer or one from any source. A peer lost
  // while the receive is unmatched fails it with Error(PeerLost): that peer may have been the
  // sender. Transports that cannot (the default) throw Error(Unsupported).
  virtual Request recv_any(void* data, size_t bytes, Tag tag, int* source);
  virtual bool supports_recv_any() const { return false; }

  // Blocks until the request completes. Throws Error(PeerLost), Error(Timeout) at the deadline,
  // Error(Protocol) on a size mismatch, Error(Aborted) after abort(). The request is finished
  // either way: it must not be waited for again.
  virtual void wait(Request request, Clock::time_point deadline) = 0;

  // True when the request has completed (then wait() returns at once). Drives progress; never
  // blocks.
  virtual bool test(Request request) = 0;

  // Fails every pending and later request with Error(Aborted). Safe from any thread.
  virtual void abort(const std::string& reason) = 0;

  // Symmetric memory between the ranks of each host (symmetric_memory.h): the optional zero-copy
  // registration of DESIGN.md. Null when the transport cannot share memory between them; then
  // why_no_symmetric_memory() says why ("shared memory is off"). The transport owns it; it lives
  // as long as the transport.
  virtual SymmetricMemory* symmetric_memory() { return nullptr; }
  virtual std::string why_no_symmetric_memory() const {
    return "its transport has no memory shared between the ranks";
  }

  // One slot per rank that every rank of the group maps, with a group-wide barrier, for small
  // collectives (shared_slots.h). Null unless every rank of the group shares this rank's memory.
  // The transport owns it; it lives as long as the transport.
  virtual SharedSlots* shared_slots() { return nullptr; }
};

}  // namespace weft::collectives
