// collectives/shared_slots.h: one slot of memory per rank that every rank of the group maps, and
// one group-wide barrier over them: what small collectives between ranks of one host need.
//
// A small collective moved as messages costs one hand-off per step (recursive doubling: log2 P
// rounds, each a sleep and a wake-up when ranks outnumber cores, 12-15 us each way on a VM). Over
// slots it is one barrier: every rank writes its input into its own slot, arrives, waits until
// every rank has arrived, and reads what it needs straight from the peers' slots
// (slot_collectives.h). The waiters sleep on one futex word that the last arrival wakes with one
// system call, so P ranks on fewer cores cost one wake-up per collective, not one per step.
//
// Double buffering. Each rank has two slots; a collective uses parity arrivals() & 1. A rank writes
// slot p of its k-th collective only after the barrier of its (k-1)-th, which every rank entered
// only after it had read what it needed of the (k-2)-th, the last one to use slot p. So one barrier
// per collective is enough: none is needed to say "I have finished reading".
//
// Every rank of the group must run the same slot collectives in the same order (the group's
// collectives run in issue order on every rank, and every rank makes the same choice from the
// collective's kind and size); each compares the calls its peers published with its own after the
// barrier, so a mismatch is Error(Desync), not a silent wrong result.
//
// Thread safety: one thread (the one driving the group's transport) uses a SharedSlots.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/transport.h"

namespace weft::collectives {

// What a rank runs, published in its slot before it arrives; peers compare it with theirs.
struct SlotCall {
  uint64_t seq = 0;     // the collective's fingerprinted sequence number (tag.h)
  uint64_t shape = 0;   // kind, dtype, op and root, packed
  uint64_t bytes = 0;   // what this rank wrote into its slot
  uint64_t factor = 0;  // PremulSum's factor, bit for bit
  bool operator==(const SlotCall&) const = default;
};

class SharedSlots {
 public:
  virtual ~SharedSlots() = default;

  // Bytes of data each slot holds.
  virtual size_t capacity() const = 0;
  // Whether the ranks sharing the host outnumber its cores (on any rank's count: the same answer
  // on every rank), so that waiting ranks sleep rather than spin: slot_collectives.h plans by it.
  virtual bool crowded() const = 0;
  // The call words and the data of rank r's slot of `parity`, as mapped in this process. Only
  // rank r writes them. A collective uses parity arrivals() & 1, taken before its barrier.
  virtual SlotCall& call(int r, int parity) = 0;
  virtual std::byte* data(int r, int parity) = 0;
  // Slot collectives whose barrier this rank has passed.
  virtual uint64_t arrivals() const = 0;

  // Publishes this rank's writes to its slot, arrives, and blocks until every rank of the group
  // has arrived in the same collective; then every peer's slot of this parity may be read, until
  // this rank arrives in its next collective. Sleeps in the kernel once a short wait is over (a
  // spin only while the host's ranks fit its cores, else a few sched_yield rounds). Throws
  // Error(Timeout) at the deadline naming the ranks that had not arrived, Error(PeerLost) naming a
  // dead peer (checked at least every 50 ms while waiting), Error(Aborted) after abort().
  virtual void arrive_and_wait(Clock::time_point deadline) = 0;
};

}  // namespace weft::collectives
