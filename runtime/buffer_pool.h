// runtime/buffer_pool.h: host buffers allocated once, touched once, and reused.
//
// On the machines weft targets, the first touch of fresh memory costs ~13 us per 4 KiB page
// (0.3 GB/s, against 17 GB/s for memcpy), and glibc gives blocks over 32 MiB back to the kernel
// when freed, so a buffer allocated per call pays that cost on every call. A BufferPool keeps
// every buffer it ever handed out: a lease takes the smallest free buffer that fits, or maps a new
// one (rounded up to a power of two, pre-faulted with MAP_POPULATE), and gives it back when the
// last copy of the lease is dropped. The pool never shrinks while it lives.
//
// Thread safety: acquire() and the release of leases may happen on any thread, concurrently (one
// mutex). Ownership: the pool owns the memory; a lease keeps the pool alive (shared_ptr), so a
// lease may outlive the pool's other owners.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace weft {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // A buffer of at least the requested size, 64-byte aligned, free again when the last copy of
  // the shared_ptr goes. get() is nullptr for a zero-byte request.
  using Lease = std::shared_ptr<void>;

  static std::shared_ptr<BufferPool> create() {
    return std::shared_ptr<BufferPool>(new BufferPool);
  }
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Throws Error(Io) when the memory cannot be mapped.
  Lease acquire(size_t bytes);

  // Bytes mapped in all (free and leased).
  size_t capacity() const;
  // Times a new buffer was mapped (a reused buffer does not count).
  size_t allocations() const;

 private:
  BufferPool() = default;
  struct Block {
    void* data = nullptr;
    size_t bytes = 0;
    bool leased = false;
  };
  void release(void* data);

  mutable std::mutex mutex_;
  std::vector<Block> blocks_;  // guarded by mutex_
  size_t allocations_ = 0;     // guarded by mutex_
};

}  // namespace weft
