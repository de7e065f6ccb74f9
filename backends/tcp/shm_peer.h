// backends/tcp/shm_peer.h: ShmTransport's per-peer state (internal).
//
// Kept apart from shm_transport.h so that the public header shows the transport's contract and
// this one its bookkeeping. Only ShmTransport touches it; it owns every object here.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/tcp/doorbell.h"
#include "backends/tcp/shm_ring.h"
#include "backends/tcp/shm_segment.h"
#include "backends/tcp/tcp_peer.h"
#include "runtime/socket.h"

namespace weft::tcp {

namespace detail {

// One shared-memory peer: its rings both ways, its doorbell, its control socket, and the
// messages queued towards it and arriving from it (fields as in tcp_peer.h's Peer).
struct ShmPeer {
  int rank = -1;
  net::Socket control;
  std::optional<ShmSegment> segment;  // the peer's: holds `out` and `bell`
  std::optional<ShmRing> out;         // this rank -> peer
  std::optional<ShmRing> in;          // peer -> this rank, in this rank's segment
  std::optional<Doorbell> bell;       // the peer's
  pid_t pid = 0;                      // the peer's process, for single-copy reads
  bool single_copy = false;           // the peer reads large messages from this rank's memory
  bool lost = false;
  bool corrupt = false;  // it sent a header no sender writes: stop reading its ring
  std::string lost_reason;

  std::deque<Op*> sends;
  std::deque<Op*> awaiting_ack;  // single-copy sends whose descriptor is written
  std::deque<Op*> recvs;
  std::list<Unexpected> unexpected;
  size_t unexpected_bytes = 0;
  std::vector<std::unique_ptr<Op>> orphans;

  InState in_state = InState::Header;
  WireHeader in_header;
  Op* in_op = nullptr;
  Unexpected* in_unexpected = nullptr;
  size_t in_left = 0;
  uint64_t in_control[2] = {};  // InState::Control: the control payload being read
};

}  // namespace detail

}  // namespace weft::tcp
