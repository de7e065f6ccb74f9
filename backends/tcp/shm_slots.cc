#include "backends/tcp/shm_slots.h"

#include <sched.h>

#include <algorithm>

#include <fmt/format.h>

#include "weft/error.h"

#include "backends/common/transport_util.h"
#include "backends/tcp/doorbell.h"

namespace weft::tcp {
namespace {

constexpr size_t kLine = 128;
// [arrivals][sleepers][entered], then the two slots.
constexpr size_t kArrivalsAt = 0;
constexpr size_t kSleepersAt = kLine;
constexpr size_t kEnteredAt = 2 * kLine;
constexpr size_t kSlotsAt = 3 * kLine;
constexpr std::chrono::milliseconds kSlice{50};

size_t slot_stride(size_t capacity) { return kLine + (capacity + kLine - 1) / kLine * kLine; }

static_assert(sizeof(collectives::SlotCall) <= kLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

}  // namespace

size_t ShmSlots::footprint(size_t capacity) {
  return (kSlotsAt + 2 * slot_stride(capacity) + 4095) / 4096 * 4096;
}

ShmSlots::ShmSlots(std::vector<std::byte*> areas, int rank, size_t capacity, bool crowded,
                   std::chrono::nanoseconds spin, int yield_rounds, Hooks hooks)
    : areas_(std::move(areas)),
      rank_(rank),
      capacity_(capacity),
      crowded_(crowded),
      spin_(spin),
      yield_rounds_(yield_rounds),
      hooks_(std::move(hooks)) {}

std::atomic<uint32_t>& ShmSlots::arrivals_word() const {
  return *std::launder(reinterpret_cast<std::atomic<uint32_t>*>(areas_[0] + kArrivalsAt));
}

std::atomic<uint32_t>& ShmSlots::sleepers_word() const {
  return *std::launder(reinterpret_cast<std::atomic<uint32_t>*>(areas_[0] + kSleepersAt));
}

std::atomic<uint64_t>& ShmSlots::entered_word(int r) const {
  return *std::launder(
      reinterpret_cast<std::atomic<uint64_t>*>(areas_[static_cast<size_t>(r)] + kEnteredAt));
}

collectives::SlotCall& ShmSlots::call(int r, int parity) {
  std::byte* at = areas_[static_cast<size_t>(r)] + kSlotsAt + parity * slot_stride(capacity_);
  return *std::launder(reinterpret_cast<collectives::SlotCall*>(at));
}

std::byte* ShmSlots::data(int r, int parity) {
  return areas_[static_cast<size_t>(r)] + kSlotsAt + parity * slot_stride(capacity_) + kLine;
}

void ShmSlots::arrive_and_wait(collectives::Clock::time_point deadline) {
  using Clock = collectives::Clock;
  const int size = static_cast<int>(areas_.size());
  const uint64_t k = arrived_ + 1;
  target_ += static_cast<uint32_t>(size);
  const uint32_t target = target_;
  std::atomic<uint32_t>& arrivals = arrivals_word();
  std::atomic<uint32_t>& sleepers = sleepers_word();
  auto done = [&](uint32_t seen) { return static_cast<int32_t>(seen - target) >= 0; };
  // Release: the slot's call and data, written before, are seen by whoever sees the arrival.
  entered_word(rank_).store(k, std::memory_order_release);
  const uint32_t now = arrivals.fetch_add(1, std::memory_order_seq_cst) + 1;  // L1
  if (now == target) {
    if (sleepers.load(std::memory_order_seq_cst) > 0) detail::futex_wake_all(&arrivals);  // L2, L3
    arrived_ = k;
    return;
  }
  bool ready = done(arrivals.load(std::memory_order_acquire));
  if (!ready && spin_.count() > 0) {
    const Clock::time_point spin_end = std::min(deadline, Clock::now() + spin_);
    for (uint32_t i = 1; !ready; ++i) {
      detail::cpu_relax();
      ready = done(arrivals.load(std::memory_order_acquire));
      if (i % 16 == 0 && Clock::now() >= spin_end) break;
    }
  }
  for (int i = 0; !ready && i < yield_rounds_; ++i) {
    sched_yield();
    ready = done(arrivals.load(std::memory_order_acquire));
  }
  if (!ready) {
    hooks_.progress();
    ready = done(arrivals.load(std::memory_order_acquire));
  }
  Clock::time_point next_check = Clock::now() + kSlice;
  while (!ready) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);                // W1
    const uint32_t seen = arrivals.load(std::memory_order_seq_cst);  // W2
    ready = done(seen);
    const Clock::time_point before = Clock::now();
    if (!ready && before < deadline) {
      ++sleeps_;
      detail::futex_wait(&arrivals, seen, std::min<Clock::duration>(deadline - before, kSlice));
      ready = done(arrivals.load(std::memory_order_acquire));
    }
    sleepers.fetch_sub(1, std::memory_order_relaxed);  // W5
    if (ready) break;
    const Clock::time_point after = Clock::now();
    if (after >= deadline) {
      std::vector<int> absent;
      for (int r = 0; r < size; ++r) {
        if (entered_word(r).load(std::memory_order_acquire) < k) absent.push_back(r);
      }
      throw hooks_.error(
          ErrorCode::Timeout,
          fmt::format("slot barrier: {} (stopped, hung, or running another "
                      "collective)",
                      backends::ranks_that(absent, "had not arrived", "had not arrived")));
    }
    if (after >= next_check) {
      // A peer that arrived and then exited is no failure of this wait: checked only while not
      // every rank has arrived.
      if (done(arrivals.load(std::memory_order_acquire))) break;
      hooks_.progress();
      hooks_.check();
      next_check = after + kSlice;
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  arrived_ = k;
}

}  // namespace weft::tcp
