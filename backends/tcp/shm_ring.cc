#include "backends/tcp/shm_ring.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "weft/error.h"

namespace weft::tcp {
namespace {

// "WEFTRING" in ASCII: tells a ring's header from stray memory.
constexpr uint64_t kMagic = 0x474E495254464557ull;
constexpr uint32_t kVersion = 1;

static_assert(sizeof(detail::ShmRingHeader) == ShmRing::kHeaderBytes);
static_assert(offsetof(detail::ShmRingHeader, head) == 128);
static_assert(offsetof(detail::ShmRingHeader, tail) == 256);

bool valid_capacity(uint64_t capacity) {
  return capacity >= ShmRing::kMinCapacity && std::has_single_bit(capacity);
}

}  // namespace

size_t ShmRing::footprint(size_t capacity) { return kHeaderBytes + capacity; }

ShmRing ShmRing::create(void* memory, size_t bytes, size_t capacity) {
  if (!valid_capacity(capacity)) {
    throw_error(ErrorCode::InvalidArgument, "shm ring create",
                fmt::format("capacity {} is not a power of two >= {}", capacity, kMinCapacity));
  }
  if (reinterpret_cast<uintptr_t>(memory) % kAlignment != 0) {
    throw_error(ErrorCode::InvalidArgument, "shm ring create",
                fmt::format("memory at {} is not {}-byte aligned", memory, kAlignment));
  }
  if (footprint(capacity) > bytes) {
    throw_error(ErrorCode::InvalidArgument, "shm ring create",
                fmt::format("a ring of capacity {} needs {} bytes, got {}", capacity,
                            footprint(capacity), bytes));
  }
  auto* header = new (memory) detail::ShmRingHeader{};
  header->version = kVersion;
  header->capacity = capacity;
  header->head.store(0, std::memory_order_relaxed);
  header->tail.store(0, std::memory_order_relaxed);
  // The magic last, with release: an attach() that sees it sees the rest of the header.
  std::atomic_ref<uint64_t>(header->magic).store(kMagic, std::memory_order_release);
  return ShmRing(header, static_cast<std::byte*>(memory) + kHeaderBytes, capacity);
}

ShmRing ShmRing::attach(void* memory, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(memory) % kAlignment != 0 || bytes < kHeaderBytes) {
    throw_error(ErrorCode::InvalidArgument, "shm ring attach",
                fmt::format("memory at {} ({} bytes) is not {}-byte aligned or too small for "
                            "a header",
                            memory, bytes, kAlignment));
  }
  auto* header = std::launder(reinterpret_cast<detail::ShmRingHeader*>(memory));
  uint64_t magic = std::atomic_ref<uint64_t>(header->magic).load(std::memory_order_acquire);
  if (magic != kMagic || header->version != kVersion) {
    throw_error(ErrorCode::Protocol, "shm ring attach",
                fmt::format("no ring here (magic {:#x}, version {}; want {:#x}, {}): not created "
                            "yet, or the ranks run different weft versions",
                            magic, header->version, kMagic, kVersion));
  }
  uint64_t capacity = header->capacity;
  if (!valid_capacity(capacity) || footprint(capacity) > bytes) {
    throw_error(ErrorCode::Protocol, "shm ring attach",
                fmt::format("header says capacity {}, which is not a power of two >= {} fitting "
                            "in {} bytes",
                            capacity, kMinCapacity, bytes));
  }
  // The counters are checked at each use, by the side that owns the other one: here they could
  // only be compared as two loads at different times, which a live ring legitimately fails.
  return ShmRing(header, static_cast<std::byte*>(memory) + kHeaderBytes, capacity);
}

ShmRing::ShmRing(detail::ShmRingHeader* header, std::byte* data, uint64_t capacity)
    : header_(header), data_(data), capacity_(capacity), mask_(capacity - 1) {
  // Each side starts from its own shared counter, so a view made mid-stream picks up where the
  // stream is. The other side's copy starts as "full" (producer) or "empty" (consumer), which
  // makes the first use load and check the real counter (invariant 6).
  tail_ = header_->tail.load(std::memory_order_acquire);
  head_ = header_->head.load(std::memory_order_acquire);
  cached_tail_ = head_ - capacity_;
  cached_head_ = tail_;
}

void ShmRing::refresh_tail() {
  uint64_t tail = header_->tail.load(std::memory_order_acquire);  // invariant 5
  if (head_ - tail > capacity_) {
    throw_error(ErrorCode::Protocol, "shm ring",
                fmt::format("consumer's tail {} is not within {} bytes below head {}: the "
                            "shared header is corrupted",
                            tail, capacity_, head_));
  }
  cached_tail_ = tail;
}

void ShmRing::refresh_head() {
  uint64_t head = header_->head.load(std::memory_order_acquire);  // invariant 4
  if (head - tail_ > capacity_) {
    throw_error(ErrorCode::Protocol, "shm ring",
                fmt::format("producer's head {} is not within {} bytes above tail {}: the "
                            "shared header is corrupted",
                            head, capacity_, tail_));
  }
  cached_head_ = head;
}

// --- Producer ---

size_t ShmRing::writable_bytes() {
  refresh_tail();
  return static_cast<size_t>(capacity_ - (head_ - cached_tail_));
}

std::span<std::byte> ShmRing::writable() {
  if (head_ - cached_tail_ == capacity_) refresh_tail();  // invariant 6
  uint64_t free = capacity_ - (head_ - cached_tail_);
  uint64_t offset = head_ & mask_;
  return {data_ + offset, static_cast<size_t>(std::min(free, capacity_ - offset))};
}

void ShmRing::commit(size_t n) {
  WEFT_CHECK(n <= capacity_ - (head_ - cached_tail_) && n <= capacity_ - (head_ & mask_),
             "commit() of more than writable() gave");
  head_ += n;
  header_->head.store(head_, std::memory_order_release);  // invariant 4
}

size_t ShmRing::write_some(const void* data, size_t bytes) {
  if (capacity_ - (head_ - cached_tail_) < bytes) refresh_tail();  // invariant 6
  uint64_t n = std::min<uint64_t>(bytes, capacity_ - (head_ - cached_tail_));
  if (n == 0) return 0;
  uint64_t offset = head_ & mask_;
  uint64_t first = std::min(n, capacity_ - offset);
  std::memcpy(data_ + offset, data, first);
  std::memcpy(data_, static_cast<const std::byte*>(data) + first, n - first);
  head_ += n;
  header_->head.store(head_, std::memory_order_release);  // invariant 4
  return static_cast<size_t>(n);
}

// --- Consumer ---

size_t ShmRing::readable_bytes() {
  refresh_head();
  return static_cast<size_t>(cached_head_ - tail_);
}

std::span<const std::byte> ShmRing::readable() {
  if (cached_head_ == tail_) refresh_head();  // invariant 6
  uint64_t used = cached_head_ - tail_;
  uint64_t offset = tail_ & mask_;
  return {data_ + offset, static_cast<size_t>(std::min(used, capacity_ - offset))};
}

void ShmRing::consume(size_t n) {
  WEFT_CHECK(n <= cached_head_ - tail_ && n <= capacity_ - (tail_ & mask_),
             "consume() of more than readable() gave");
  tail_ += n;
  header_->tail.store(tail_, std::memory_order_release);  // invariant 5
}

size_t ShmRing::read_some(void* data, size_t bytes) {
  if (cached_head_ - tail_ < bytes) refresh_head();  // invariant 6
  uint64_t n = std::min<uint64_t>(bytes, cached_head_ - tail_);
  if (n == 0) return 0;
  uint64_t offset = tail_ & mask_;
  uint64_t first = std::min(n, capacity_ - offset);
  std::memcpy(data, data_ + offset, first);
  std::memcpy(static_cast<std::byte*>(data) + first, data_, n - first);
  tail_ += n;
  header_->tail.store(tail_, std::memory_order_release);  // invariant 5
  return static_cast<size_t>(n);
}

}  // namespace weft::tcp
