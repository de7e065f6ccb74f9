// backends/tcp/tcp_peer.h: TcpTransport's per-request and per-connection state (internal).
//
// Kept apart from tcp_transport.h so that the public header shows the transport's contract and
// this one its bookkeeping. Only TcpTransport touches these; it owns every object here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/reduce_op.h"

#include "collectives/transport.h"
#include "runtime/socket.h"

namespace weft::tcp::detail {

// What precedes every payload on the wire (host byte order; see tcp_transport.h).
struct WireHeader {
  uint64_t tag = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(WireHeader) == 16);

enum class OpKind : uint8_t { Send, Recv, RecvReduce };

// "tag 17:3" (sequence number : step), as make_tag() builds them.
inline std::string tag_text(collectives::Tag tag) {
  return fmt::format("tag {}:{}", tag >> 24, tag & 0xFFFFFF);
}

inline const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::Send:
      return "tcp send";
    case OpKind::Recv:
      return "tcp recv";
    case OpKind::RecvReduce:
      return "tcp recv_reduce";
  }
  return "tcp";
}

// One posted request. Lives in TcpTransport::ops_ until its wait() returns or throws; a send
// withdrawn half-written after a timeout lives on in Peer::orphans until its copy is written.
struct Op {
  uint64_t id = 0;
  int peer = -1;
  OpKind kind = OpKind::Send;
  collectives::Tag tag = 0;
  const uint8_t* src = nullptr;  // sends
  uint8_t* dst = nullptr;        // receives
  size_t bytes = 0;              // payload size
  size_t done = 0;               // payload bytes written, or received (and reduced)
  // Sends: the header, and how much of it is written.
  WireHeader header;
  size_t header_done = 0;
  // RecvReduce: element type and op, and the bytes of an element split across two reads.
  DType dtype = DType::UInt8;
  ReduceOp reduce_op;
  size_t element = 1;
  uint8_t carry[8] = {};
  size_t carry_len = 0;

  bool finished = false;
  std::optional<Error> error;  // set when finished with a failure
  std::vector<uint8_t> owned;  // an orphaned send's copy of its unwritten payload
  // ShmTransport single-copy sends: the payload on the wire is this descriptor {address, id};
  // the receiver reads the data straight from src and acknowledges.
  bool single_copy = false;
  uint64_t descriptor[2] = {};
};

// A block of memory with its capacity.
struct Buffer {
  std::unique_ptr<uint8_t[]> data;
  size_t capacity = 0;
};

// Keeps the buffers of unexpected messages for reuse. A fresh block costs its first touch
// (~13 us per 4 KiB page here: 3 ms for 1 MiB, more than sending it over loopback), and glibc
// maps and unmaps every block over its mmap threshold, so allocating per message would pay that
// on every message a receiver is late for.
//
// Capacities are powers of two (at least 64 bytes) so that messages of similar sizes share
// buffers. At most `max_pooled_bytes` are kept; beyond that, released buffers are freed.
class BufferPool {
 public:
  explicit BufferPool(size_t max_pooled_bytes) : max_pooled_bytes_(max_pooled_bytes) {}
  // The capacity acquire(bytes) returns.
  static size_t capacity_for(size_t bytes);
  // A buffer of capacity_for(bytes) (uninitialised): a pooled one if any.
  Buffer acquire(size_t bytes);
  void release(Buffer buffer);
  size_t pooled_bytes() const { return pooled_bytes_; }

 private:
  size_t max_pooled_bytes_;
  size_t pooled_bytes_ = 0;
  std::vector<Buffer> free_;  // a stack: the most recently released (warmest) first
};

// A message that arrived (or is arriving) before its receive was posted.
struct Unexpected {
  collectives::Tag tag = 0;
  size_t size = 0;
  size_t got = 0;
  size_t charge = 0;  // what it counts against the unexpected limit: its buffer plus bookkeeping
  Buffer buffer;      // at least size bytes, from the transport's BufferPool
  // ShmTransport single-copy message: no buffer; the data stays at the sender's address until a
  // receive reads it, and the sender's request `sender_op` waits for the acknowledgement.
  bool single_copy = false;
  uint64_t address = 0;
  uint64_t sender_op = 0;
};

// Where the payload being read from a peer goes.
enum class InState : uint8_t {
  Header,   // reading a header
  Payload,  // reading a payload into in_op, in_unexpected, or nowhere (discard)
  Paused,   // a header is read but buffering its payload would pass the unexpected limit
  Control,  // ShmTransport: reading a control payload (a single-copy descriptor, an ack)
};

// One connection and everything queued on it.
struct Peer {
  int rank = -1;
  net::Socket socket;
  // Edge-triggered readiness: set by epoll events, cleared when a call returns EAGAIN.
  bool readable = true;
  bool writable = true;
  // The peer shut its side down (EPOLLRDHUP): what is left in the socket is all there will be,
  // and it is bounded by the kernel's receive buffer, so the unexpected limit no longer applies
  // (a paused peer is drained to its end and its loss reported).
  bool hung_up = false;
  bool lost = false;
  std::string lost_reason;  // "closed its connection", "reset the connection (...)"

  std::deque<Op*> sends;  // in posting order; only the front may be partly written
  std::deque<Op*> recvs;  // posted receives that no arrived message matched yet, in order
  std::list<Unexpected> unexpected;  // in arrival order; only the back may be incomplete
  size_t unexpected_bytes = 0;       // sum of their charges (reserved at their headers)
  std::vector<std::unique_ptr<Op>> orphans;

  InState in_state = InState::Header;
  WireHeader in_header;
  size_t in_header_got = 0;
  Op* in_op = nullptr;
  Unexpected* in_unexpected = nullptr;
  size_t in_left = 0;  // payload bytes of the current message not read yet
};

}  // namespace weft::tcp::detail
