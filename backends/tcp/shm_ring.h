// backends/tcp/shm_ring.h: a single-producer single-consumer byte ring in shared memory.
//
// One ring carries bytes one way between two processes on a host: the producer copies in (or
// builds data in place with writable() + commit()), the consumer reads out (or reduces straight
// from readable() into its destination, with no staging copy, then consume()s). The ring never
// blocks: when it is full or empty the caller waits on the other side's Doorbell (doorbell.h)
// and rings its peer's after each commit/consume.
//
// Layout (ShmRing::footprint(capacity) bytes at a 128-byte aligned address in a ShmSegment):
//   [0, 128)    header: magic, version, capacity; written once by create()
//   [128, 256)  head: total bytes ever committed; written by the producer only
//   [256, 384)  tail: total bytes ever consumed; written by the consumer only
//   [384, 384 + capacity)  data; byte n of the stream lives at data[n mod capacity]
// head and tail sit 128 bytes apart, not just 64, because x86 prefetches cache lines in pairs:
// sharing a pair would bounce it between the two cores on every commit and consume. Both are
// 64-bit and only ever grow, so they never wrap (2^64 bytes at 100 GB/s is 5 years).
//
// Invariants (h = head, t = tail, C = capacity, a power of two):
//   1. 0 <= h - t <= C, always, as seen by either side.
//   2. Only the producer stores h, only the consumer stores t; each stores only larger values.
//   3. Stream bytes [t, h) are written and belong to the consumer; stream positions
//      [h, t + C) belong to the producer, who may write them. No byte belongs to both sides.
//   4. The producer writes bytes, then stores h with release; the consumer loads h with
//      acquire before it reads them: it sees every byte below the h it loaded.
//   5. The consumer reads bytes, then stores t with release; the producer loads t with acquire
//      before it reuses their positions: the consumer's reads happen before the overwrite.
//   6. Each side keeps a private copy of the other side's counter and reloads it only when its
//      copy says there is no room (producer) or nothing to read (consumer), so the steady state
//      touches the other side's cache line once per batch, not once per call.
// A counter from shared memory is not trusted: one that breaks invariant 1 (a corrupted or
// hostile peer) throws Error(Protocol) instead of letting a copy run past the data.
//
// Thread safety: lock-free; acquire/release atomics only. At any time one thread (in any
// process) may use the producer methods and one the consumer methods; each side's methods must
// not be called concurrently with each other. A ShmRing is a view: the one calling producer
// methods must be the only producer (it keeps head privately), likewise for the consumer.
// Ownership: the ring borrows its memory; the ShmSegment must outlive every view of it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

namespace weft::tcp {

namespace detail {
// The ring's shared header. Address-free atomics: the same object is mapped by two processes.
struct ShmRingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t capacity;
  alignas(128) std::atomic<uint64_t> head;
  alignas(128) std::atomic<uint64_t> tail;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics need lock-free");
}  // namespace detail

class ShmRing {
 public:
  static constexpr size_t kHeaderBytes = 384;
  static constexpr size_t kAlignment = 128;
  // A cache line: also a multiple of every dtype's size, so that a ring carrying whole elements
  // never splits one at the wrap (see readable()).
  static constexpr size_t kMinCapacity = 64;

  // Bytes a ring of `capacity` occupies: kHeaderBytes + capacity.
  static size_t footprint(size_t capacity);

  // Formats an empty ring in `memory` (zero-filled or not) and returns a view of it. Peers must
  // not attach before create() has returned (publish the segment only after it).
  // Throws Error(InvalidArgument) when capacity is not a power of two >= kMinCapacity, memory
  // is not kAlignment-aligned, or footprint(capacity) > bytes.
  static ShmRing create(void* memory, size_t bytes, size_t capacity);

  // A view of a ring that create() formatted, possibly in another process. Throws
  // Error(Protocol) when the header is not a ring's (wrong magic or version, or a capacity that
  // is not a power of two or does not fit in `bytes`). The counters are checked as they are used.
  static ShmRing attach(void* memory, size_t bytes);

  size_t capacity() const { return static_cast<size_t>(capacity_); }

  // --- Producer ---
  // Copies min(bytes, writable_bytes()) bytes from data into the ring, commits them and returns
  // how many; 0 when the ring is full.
  size_t write_some(const void* data, size_t bytes);
  // The contiguous free space at the head: write into it, then commit(n). Empty when full; may
  // be shorter than writable_bytes() when the free space wraps around the end of the buffer.
  std::span<std::byte> writable();
  // Publishes n bytes written into the span the last writable() returned.
  // REQUIRES: n <= that span's size (a bug otherwise: WEFT_CHECK).
  void commit(size_t n);
  // Free bytes (reloads the consumer's tail: use it in a Doorbell predicate).
  size_t writable_bytes();

  // --- Consumer ---
  // The contiguous readable bytes at the tail; may be shorter than readable_bytes() when they
  // wrap. When every commit is a multiple of an element size that divides the capacity (any
  // dtype and kMinCapacity), the span is one too, so it can be reduced from directly.
  std::span<const std::byte> readable();
  // Releases the first n bytes of the last readable() span to the producer.
  // REQUIRES: n <= that span's size (a bug otherwise: WEFT_CHECK).
  void consume(size_t n);
  // Copies up to `bytes` bytes out, consumes them and returns how many; 0 when empty.
  size_t read_some(void* data, size_t bytes);
  // Committed, unconsumed bytes (reloads the producer's head: use it in a Doorbell predicate).
  size_t readable_bytes();

 private:
  ShmRing(detail::ShmRingHeader* header, std::byte* data, uint64_t capacity);
  // Reload the other side's counter, checking invariant 1.
  void refresh_tail();
  void refresh_head();

  detail::ShmRingHeader* header_;
  std::byte* data_;
  uint64_t capacity_;
  uint64_t mask_;
  // Producer's private state: its own head, and the last tail it loaded.
  uint64_t head_;
  uint64_t cached_tail_;
  // Consumer's private state: its own tail, and the last head it loaded.
  uint64_t tail_;
  uint64_t cached_head_;
};

}  // namespace weft::tcp
