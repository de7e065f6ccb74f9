// backends/common/unexpected_pool.h: the buffers of messages that arrive before their receive.
//
// One of weft's three pools, each for one kind of memory: UnexpectedPool (here: a transport's
// early messages), collectives::ScratchPool (an algorithm's scratch) and the process group's
// BufferPool (staging of list collectives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace weft::backends {

// A block of memory with its capacity.
struct PooledBuffer {
  std::unique_ptr<uint8_t[]> data;
  size_t capacity = 0;
};

// Keeps the buffers of unexpected messages for reuse. A fresh block costs its first touch
// (~13 us per 4 KiB page here: 3 ms for 1 MiB, more than sending it over loopback), and glibc
// maps and unmaps every block over its mmap threshold, so allocating per message would pay that
// on every message a receiver is late for.
//
// Capacities are powers of two (at least 64 bytes) so that messages of similar sizes share
// buffers. At most `max_pooled_bytes` are kept; beyond that, released buffers are freed.
//
// Thread safety: none; used by the one thread that drives its transport.
class UnexpectedPool {
 public:
  explicit UnexpectedPool(size_t max_pooled_bytes) : max_pooled_bytes_(max_pooled_bytes) {}
  // The capacity acquire(bytes) returns.
  static size_t capacity_for(size_t bytes);
  // A buffer of capacity_for(bytes) (uninitialised): a pooled one if any.
  PooledBuffer acquire(size_t bytes);
  void release(PooledBuffer buffer);
  size_t pooled_bytes() const { return pooled_bytes_; }

 private:
  size_t max_pooled_bytes_;
  size_t pooled_bytes_ = 0;
  std::vector<PooledBuffer> free_;  // a stack: the most recently released (warmest) first
};

}  // namespace weft::backends
