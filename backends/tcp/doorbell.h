// backends/tcp/doorbell.h: how a process sleeps until a peer on the same host has news for it.
//
// Each process that waits owns one Doorbell, placed in shared memory; every peer that may make
// its wait condition true (fills a ring towards it, drains a ring from it) rings it afterwards.
// The shared state is a 32-bit futex word and a "sleeping" flag:
//
//   waiter (wait())                          any peer (after publishing, e.g. ring commit())
//   W1 seen = word                           R1 publish (the ring's release store of head)
//   W2 sleeping = 1; fence(seq_cst)          R2 fence(seq_cst)
//   W3 if ready(): sleeping = 0, return      R3 if sleeping && exchange(sleeping, 0):
//   W4 FUTEX_WAIT(word, seen, slice)         R4     word += 1; FUTEX_WAKE(word)
//   W5 sleeping = 0; go to W1
//
// ring() costs a fence and one load when nobody sleeps: no syscall, no write to the shared line.
//
// Why no wake-up is lost. The two seq_cst fences are ordered one way or the other in the single
// total order of seq_cst operations. If R2 comes first, the waiter's ready() at W3, which loads
// after W2, sees what R1 published and returns without sleeping. If W2 comes first, R3's load of
// `sleeping`, after R2, sees W2's 1 (or a later value): either R3 clears it and bumps the word
// at R4, after the waiter read `seen` at W1, so FUTEX_WAIT either finds word != seen and returns
// at once (EAGAIN) or is queued before R4's FUTEX_WAKE (the kernel checks the word and queues
// under one lock) and is woken; or another ringer cleared the flag first, and that ringer's bump
// wakes the waiter the same way, after which it re-checks ready() at W3 of its next round, which
// now sees R1. A ringer clears the flag so that several peers ringing one sleeper make one
// syscall, not one each. The futex is not FUTEX_PRIVATE: the word is in a MAP_SHARED mapping
// and the waker is another process (libstdc++ 12's std::atomic::wait does not wake across
// processes).
//
// Blocking and liveness: wait() spins for at most `spin_budget` (0: not at all) calling ready(),
// then sleeps in slices of at most slice() (50 ms by default), calling on_slice() at least once
// per slice while it sleeps, so the caller can check that its peers are alive and throw
// (Error(PeerLost)); it returns false at the deadline. Spin only while the ranks on the host do
// not outnumber its cores (spin_budget_for()): a spinning rank would otherwise burn the time
// slice the rank it waits for needs. When they do outnumber them, wait() may instead yield the
// core a few times before sleeping (set_yield_rounds()): sched_yield() hands the core to a rank
// that is runnable, very likely the one being waited for, and the answer often comes back within
// that round trip, which is cheaper than a futex sleep and wake-up (12-15 us each way here).
//
// Thread safety: ring() is safe from any thread in any process. One thread at a time waits on a
// given doorbell (its owner). Ownership: a Doorbell is a view; the ShmSegment holding its
// kFootprint bytes must outlive it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "backends/common/transport_util.h"

namespace weft::tcp {

namespace detail {
struct alignas(64) DoorbellState {
  std::atomic<uint32_t> word;      // the futex word: bumped by each ringer that wakes a sleeper
  std::atomic<uint32_t> sleeping;  // 1 from W2 until the waiter or a ringer clears it
  uint32_t magic;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// The futex calls on a word in memory shared between processes (not FUTEX_PRIVATE), for the
// doorbell and for other waits on shared words (shm_slots.h). futex_wait() returns when woken,
// when the word is not `seen` (at once), at the timeout, or on a signal: the caller re-checks.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::nanoseconds timeout);
void futex_wake_all(std::atomic<uint32_t>* word);
// A pause instruction for spin loops.
void cpu_relax();
}  // namespace detail

// spin_budget_for() is shared with every transport's wait loop (backends/common/transport_util.h).
using backends::spin_budget_for;

class Doorbell {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kFootprint = sizeof(detail::DoorbellState);
  static constexpr size_t kAlignment = alignof(detail::DoorbellState);
  // Bounds how late a dead peer is noticed (on_slice()) against how often a sleeper wakes for
  // nothing: 20 wake-ups a second cost nothing measurable.
  static constexpr std::chrono::milliseconds kDefaultSlice{50};

  // Formats a doorbell in `memory` (kFootprint bytes, kAlignment-aligned; else
  // Error(InvalidArgument)). Peers attach after it returned.
  static Doorbell create(void* memory);
  // A view of a doorbell create() formatted, possibly in another process; Error(Protocol) when
  // `memory` holds none.
  static Doorbell attach(void* memory);

  // Wakes the owner if it sleeps (or is about to). Call it after publishing what the owner
  // waits for (see the protocol above). Never blocks; a syscall only when the owner sleeps.
  void ring();

  // Returns true as soon as ready() does, false when the deadline passes first. ready() is
  // called many times and must be cheap and side-effect free (load a ring's counter); it and
  // on_slice() may throw, which ends the wait. See the header comment for spin and slices.
  template <class Ready, class OnSlice>
  bool wait(Ready&& ready, Clock::time_point deadline, std::chrono::nanoseconds spin_budget,
            OnSlice&& on_slice);
  template <class Ready>
  bool wait(Ready&& ready, Clock::time_point deadline, std::chrono::nanoseconds spin_budget) {
    return wait(ready, deadline, spin_budget, [] {});
  }

  // The longest single sleep, and so the longest gap between on_slice() calls (plus scheduling).
  std::chrono::milliseconds slice() const { return slice_; }
  void set_slice(std::chrono::milliseconds slice) { slice_ = slice; }
  // sched_yield() rounds wait() makes after spinning and before sleeping (0: none, the default).
  void set_yield_rounds(int rounds) { yield_rounds_ = rounds; }

  // Whether the owner has announced that it sleeps (W2) and no ringer has cleared it yet: for
  // tests and diagnostics ("rank 3 is asleep on its doorbell").
  bool has_sleeper() const;
  // How many times this view entered FUTEX_WAIT: tells a test that it really slept.
  uint64_t sleeps() const { return sleeps_; }

 private:
  explicit Doorbell(detail::DoorbellState* state) : state_(state) {}
  // W1 + W2: returns the word's value `seen`.
  uint32_t announce_sleep();
  // W4 + W5, at most `timeout` long.
  void sleep(uint32_t seen, std::chrono::nanoseconds timeout);
  void cancel_sleep();
  static void yield_core();

  detail::DoorbellState* state_;
  std::chrono::milliseconds slice_ = kDefaultSlice;
  int yield_rounds_ = 0;
  uint64_t sleeps_ = 0;
};

template <class Ready, class OnSlice>
bool Doorbell::wait(Ready&& ready, Clock::time_point deadline, std::chrono::nanoseconds spin_budget,
                    OnSlice&& on_slice) {
  if (ready()) return true;
  if (spin_budget.count() > 0) {
    Clock::time_point spin_end = std::min(deadline, Clock::now() + spin_budget);
    for (uint32_t i = 1;; ++i) {
      detail::cpu_relax();
      if (ready()) return true;
      // Reading the clock costs about as much as a ready(): check it every few rounds only.
      if (i % 16 == 0 && Clock::now() >= spin_end) break;
    }
  }
  for (int i = 0; i < yield_rounds_; ++i) {
    yield_core();
    if (ready()) return true;
  }
  Clock::time_point next_check = Clock::now() + slice_;
  for (;;) {
    uint32_t seen = announce_sleep();
    bool done = false;
    try {
      done = ready();  // W3
    } catch (...) {
      cancel_sleep();
      throw;
    }
    if (done) {
      cancel_sleep();
      return true;
    }
    Clock::time_point now = Clock::now();
    if (now >= deadline) {
      cancel_sleep();
      return false;
    }
    sleep(seen, std::min<Clock::duration>(deadline - now, slice_));
    if (ready()) return true;
    now = Clock::now();
    if (now >= next_check) {
      on_slice();
      next_check = now + slice_;
    }
  }
}

}  // namespace weft::tcp
