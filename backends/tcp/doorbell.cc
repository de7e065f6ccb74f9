#include "backends/tcp/doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "weft/error.h"

namespace weft::tcp {
namespace {

constexpr uint32_t kMagic = 0x4C4C4542;  // "BELL"

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: waiter and waker are different processes sharing the mapping.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

namespace detail {

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Returns 0 when woken, or -1 with EAGAIN (the word moved before the call), ETIMEDOUT or EINTR:
  // in every case the caller re-checks its condition and deadline.
  if (futex(word, FUTEX_WAIT, seen, &ts) < 0) {
    int err = errno;
    WEFT_CHECK(err == EAGAIN || err == ETIMEDOUT || err == EINTR, "FUTEX_WAIT failed");
  }
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  if (futex(word, FUTEX_WAKE, INT_MAX, nullptr) < 0) {
    // FUTEX_WAKE fails only on a bad address, which would be a bug in the mapping's user.
    WEFT_CHECK(false, "FUTEX_WAKE failed");
  }
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace detail

Doorbell Doorbell::create(void* memory) {
  if (reinterpret_cast<uintptr_t>(memory) % kAlignment != 0) {
    throw_error(ErrorCode::InvalidArgument, "doorbell create",
                fmt::format("memory at {} is not {}-byte aligned", memory, kAlignment));
  }
  auto* state = new (memory) detail::DoorbellState{};
  state->word.store(0, std::memory_order_relaxed);
  state->sleeping.store(0, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(state->magic).store(kMagic, std::memory_order_release);
  return Doorbell(state);
}

Doorbell Doorbell::attach(void* memory) {
  if (reinterpret_cast<uintptr_t>(memory) % kAlignment != 0) {
    throw_error(ErrorCode::InvalidArgument, "doorbell attach",
                fmt::format("memory at {} is not {}-byte aligned", memory, kAlignment));
  }
  auto* state = std::launder(reinterpret_cast<detail::DoorbellState*>(memory));
  uint32_t magic = std::atomic_ref<uint32_t>(state->magic).load(std::memory_order_acquire);
  if (magic != kMagic) {
    throw_error(
        ErrorCode::Protocol, "doorbell attach",
        fmt::format("no doorbell here (magic {:#x}, want {:#x}): not created yet?", magic, kMagic));
  }
  return Doorbell(state);
}

void Doorbell::ring() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // R2
  // R3: a plain load first, so that ringing nobody writes nothing to the shared line.
  if (state_->sleeping.load(std::memory_order_relaxed) == 0) return;
  // acquire pairs with W2's release: the waiter's W1 happens before R4, so it read an older word.
  if (state_->sleeping.exchange(0, std::memory_order_acq_rel) == 0) return;  // another woke it
  state_->word.fetch_add(1, std::memory_order_relaxed);                      // R4
  detail::futex_wake_all(&state_->word);
}

bool Doorbell::has_sleeper() const { return state_->sleeping.load(std::memory_order_acquire) != 0; }

uint32_t Doorbell::announce_sleep() {
  uint32_t seen = state_->word.load(std::memory_order_relaxed);  // W1
  state_->sleeping.store(1, std::memory_order_release);          // W2
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return seen;
}

void Doorbell::cancel_sleep() { state_->sleeping.store(0, std::memory_order_relaxed); }

void Doorbell::sleep(uint32_t seen, std::chrono::nanoseconds timeout) {
  ++sleeps_;
  // W4: a word moved since W1 (a ringer came between) returns at once.
  detail::futex_wait(&state_->word, seen, timeout);
  cancel_sleep();  // W5
}

void Doorbell::yield_core() { sched_yield(); }

}  // namespace weft::tcp
