// backends/tcp/shm_peer.h: ShmTransport's per-peer state (internal).
//
// Kept apart from shm_transport.h so that the public header shows the transport's contract and
// this one its bookkeeping. Only ShmTransport touches it; it owns every object here.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <optional>

#include "backends/common/pending_message.h"
#include "backends/tcp/doorbell.h"
#include "backends/tcp/shm_ring.h"
#include "backends/tcp/shm_segment.h"
#include "runtime/socket.h"

namespace weft::tcp {

namespace detail {

// One shared-memory peer: its rings both ways, its doorbell, its control socket, and (from
// PeerQueues) the messages queued towards it and arriving from it.
struct ShmPeer : backends::PeerQueues {
  net::Socket control;
  std::optional<ShmSegment> segment;  // the peer's: holds `out` and `bell`
  std::optional<ShmRing> out;         // this rank -> peer
  std::optional<ShmRing> in;          // peer -> this rank, in this rank's segment
  std::optional<Doorbell> bell;       // the peer's
  pid_t pid = 0;                      // the peer's process, for single-copy reads
  bool single_copy = false;           // the peer reads large messages from this rank's memory
  bool readable = false;              // this rank can read the peer's memory (the same probe)
  bool corrupt = false;               // it sent a header no sender writes: stop reading its ring
  std::deque<backends::Op*> awaiting_ack;  // single-copy sends whose descriptor is written
  // A withdrawn single-copy send waited kWithdrawWait for this peer's ack in vain (the peer is
  // stopped or stuck): later withdrawals do not wait again, until an ack comes.
  bool ack_overdue = false;
  uint64_t in_control[2] = {};  // InState::Control: the control payload being read
};

}  // namespace detail

}  // namespace weft::tcp
