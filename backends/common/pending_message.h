// backends/common/pending_message.h: what a message-matching transport keeps per request and per
// peer (internal to the transports that use MessageMatcher: today the TCP and shared-memory
// ones).
//
// Only the owning transport and its MessageMatcher touch these; the transport owns every object
// here. A transport's own per-peer state (its socket, its rings) derives from PeerQueues.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/reduce_op.h"

#include "backends/common/unexpected_pool.h"
#include "collectives/tag.h"

namespace weft::backends {

// What precedes every payload on the wire (host byte order: both ends are weft on one host
// architecture).
struct WireHeader {
  uint64_t tag = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(WireHeader) == 16);

enum class OpKind : uint8_t { Send, Recv, RecvReduce };

// One posted request. Lives in the matcher's table until its wait() returns or throws; a send
// withdrawn half-written after a timeout lives on in PeerQueues::orphans (with id 0) until its
// copy is written.
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

  // A receive from any source (posted with peer kAnySource): where the peer it matched is
  // written, the moment it is bound to one (peer is then that rank).
  int* source = nullptr;

  bool finished = false;
  std::optional<Error> error;  // set when finished with a failure
  std::vector<uint8_t> owned;  // an orphaned send's copy of its unwritten payload
  // ShmTransport single-copy sends: the payload on the wire is this descriptor {address, id};
  // the receiver reads the data straight from src and acknowledges.
  bool single_copy = false;
  uint64_t descriptor[2] = {};
};

// A message that arrived (or is arriving) before its receive was posted.
struct Unexpected {
  collectives::Tag tag = 0;
  size_t size = 0;
  size_t got = 0;
  size_t charge = 0;    // what it counts against the unexpected limit: its buffer plus bookkeeping
  PooledBuffer buffer;  // at least size bytes, from the matcher's UnexpectedPool
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

// The matching state of one peer: the requests queued towards it, the receives posted for it,
// what arrived from it unasked, and the message being read from it.
struct PeerQueues {
  int rank = -1;
  bool lost = false;
  std::string lost_reason;  // "closed its connection", "is gone (...)"
  // The peer hung up or is lost: what is left of its stream is bounded (by the kernel's socket
  // buffer, by the ring), so it is buffered past the unexpected limit instead of pausing, and a
  // paused peer is drained to its end and its loss reported.
  bool draining = false;

  std::deque<Op*> sends;  // in posting order; only the front may be partly written
  std::deque<Op*> recvs;  // posted receives that no arrived message matched yet, in order
  std::list<Unexpected> unexpected;  // in arrival order; only the back may be incomplete
  size_t unexpected_bytes = 0;       // sum of their charges (reserved at their headers)
  std::vector<std::unique_ptr<Op>> orphans;

  InState in_state = InState::Header;
  WireHeader in_header;
  Op* in_op = nullptr;
  Unexpected* in_unexpected = nullptr;
  size_t in_left = 0;  // payload bytes of the current message not read yet
};

}  // namespace weft::backends
