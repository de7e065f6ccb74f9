// backends/tcp/shm_slots.h: shared slots (collectives/shared_slots.h) in the shared-memory
// transport's segments, for groups whose ranks all share one host.
//
// Each rank's segment (shm_transport.h) holds, after its doorbell, a slot area:
//
//   [arrivals][sleepers][entered]   one 128-byte line each
//   [call 0][data 0][call 1][data 1] the two slots (parity 0 and 1): 128 bytes of call words,
//                                    then `capacity` bytes of data, 128-byte aligned
//
// Every rank writes only its own area's `entered` and slots; the barrier's `arrivals` and
// `sleepers` used are rank 0's (every area has them; the others stay unused).
//
// The barrier. For its k-th slot collective (k from 1) a rank stores k into its `entered`,
// increments rank 0's `arrivals` (seq_cst) and waits until arrivals >= k P (32-bit words compared
// modulo 2^32: no rank can be more than one collective ahead of a waiter, so the distance stays far
// below 2^31). The arrival that makes the count k P is the last; it wakes the sleepers with one
// FUTEX_WAKE on `arrivals`, and only when `sleepers` is non-zero. A waiter spins (while the host's
// ranks fit its cores) or yields a few rounds (when they do not), then sleeps:
//
//   waiter                                   last arrival
//   W1 sleepers += 1 (seq_cst)               L1 arrivals += 1 (seq_cst): now k P
//   W2 seen = arrivals (seq_cst)             L2 if sleepers (seq_cst) > 0:
//   W3 if seen >= k P: sleepers -= 1, done   L3     FUTEX_WAKE(arrivals, all)
//   W4 FUTEX_WAIT(arrivals, seen, slice)
//   W5 sleepers -= 1; go to W1 unless done
//
// No wake-up is lost: in the single order of seq_cst operations, either W1 precedes L2 (then L2
// sees the sleeper and wakes it; if W2 read the count before L1, the word moved and FUTEX_WAIT
// returns at once, or the kernel queued the waiter before L3's wake), or L2 precedes W1, so L1
// precedes W2, which then sees k P. Every arrival moves the word, so a waiter that read it before
// some other arrival returns from FUTEX_WAIT at once and re-reads: spurious wake-ups, never a lost
// one. Sleeps last one slice (50 ms) at most; between slices the waiter checks its peers'
// liveness through the transport (control sockets) and abort(), so a dead peer is PeerLost within
// about a slice and abort() ends the wait, and moves the rings' traffic (Hooks::progress): a peer
// may still be finishing a send to this rank that needs it read before it can arrive.
//
// Thread safety: one thread (the transport's) uses it. Ownership: a view into the transport's
// segments; the transport owns both and outlives it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weft/error.h"

#include "collectives/shared_slots.h"

namespace weft::tcp {

class ShmSlots final : public collectives::SharedSlots {
 public:
  // What the waits need from the transport.
  struct Hooks {
    // Moves what the transport's rings can move (into unexpected buffers), so that a peer whose
    // send waits for this rank to read can finish it and come to the barrier: run once before
    // the first sleep and once per slice.
    std::function<void()> progress;
    // Polls the peers' liveness now and throws Error(PeerLost) naming a dead one, Error(Aborted)
    // after abort().
    std::function<void()> check;
    // Builds an error with the transport's prefix ("rank 1/4 group "world" shm slots: ...").
    std::function<Error(ErrorCode, const std::string&)> error;
  };

  // sched_yield() rounds a waiter makes before it sleeps when ranks outnumber cores. More than the
  // doorbell's (backends::kOversubscribedYieldRounds): a barrier waits for every rank, and the
  // last is often two or three hand-offs away. 8-byte all_reduce, weft-perf -z 2, 2 cores: 4 ranks
  // 5.6-5.8 us with 32 rounds, 5.7-12.9 with 8, 11-17 with 2, 24-31 with none (sleeping at once);
  // 8 ranks 17-18 / 15-24 / 16-26 / 36-41 us; 128 rounds gave nothing more.
  static constexpr int kYieldRounds = 32;

  // Bytes of a slot area of `capacity` bytes per slot (a multiple of 4096).
  static size_t footprint(size_t capacity);

  // `areas[r]`: rank r's slot area as mapped here (zero-filled when made). `spin`: how long a
  // waiter spins before yielding `yield_rounds` times, then sleeping.
  // `crowded`: SharedSlots::crowded(), agreed by the ranks at set-up.
  ShmSlots(std::vector<std::byte*> areas, int rank, size_t capacity, bool crowded,
           std::chrono::nanoseconds spin, int yield_rounds, Hooks hooks);

  size_t capacity() const override { return capacity_; }
  bool crowded() const override { return crowded_; }
  collectives::SlotCall& call(int r, int parity) override;
  std::byte* data(int r, int parity) override;
  uint64_t arrivals() const override { return arrived_; }
  void arrive_and_wait(collectives::Clock::time_point deadline) override;

  // Times this rank slept in FUTEX_WAIT (for tests: proves that waits block).
  uint64_t sleeps() const { return sleeps_; }
  // Whether some rank is asleep in (or about to enter) a barrier's FUTEX_WAIT: for tests.
  bool has_sleeper() const { return sleepers_word().load(std::memory_order_acquire) > 0; }

 private:
  std::atomic<uint32_t>& arrivals_word() const;
  std::atomic<uint32_t>& sleepers_word() const;
  std::atomic<uint64_t>& entered_word(int r) const;

  const std::vector<std::byte*> areas_;
  const int rank_;
  const size_t capacity_;
  const bool crowded_;
  const std::chrono::nanoseconds spin_;
  const int yield_rounds_;
  const Hooks hooks_;
  uint64_t arrived_ = 0;  // slot collectives whose barrier this rank has passed
  uint32_t target_ = 0;   // arrivals that complete the current barrier (mod 2^32)
  uint64_t sleeps_ = 0;
};

}  // namespace weft::tcp
