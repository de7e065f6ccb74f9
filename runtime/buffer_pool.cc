#include "runtime/buffer_pool.h"

#include <sys/mman.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "weft/error.h"

#include "runtime/log.h"

namespace weft {

BufferPool::~BufferPool() {
  for (Block& block : blocks_) munmap(block.data, block.bytes);
}

BufferPool::Lease BufferPool::acquire(size_t bytes) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  Block* best = nullptr;
  for (Block& block : blocks_) {
    if (!block.leased && block.bytes >= bytes && (!best || block.bytes < best->bytes)) {
      best = &block;
    }
  }
  if (!best) {
    const size_t rounded = std::bit_ceil(std::max<size_t>(bytes, 4096));
    void* data = mmap(nullptr, rounded, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (data == MAP_FAILED) {
      throw_error(
          ErrorCode::Io, "buffer pool",
          std::string("cannot map ") + std::to_string(rounded) + " bytes: " + std::strerror(errno));
    }
    blocks_.push_back(Block{data, rounded, false});
    ++allocations_;
    WEFT_LOG_DEBUG("buffer pool: mapped {} bytes ({} buffers)", rounded, blocks_.size());
    best = &blocks_.back();
  }
  best->leased = true;
  void* data = best->data;
  std::shared_ptr<BufferPool> self = shared_from_this();
  return Lease(data, [self](void* p) { self->release(p); });
}

void BufferPool::release(void* data) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Block& block : blocks_) {
    if (block.data == data) {
      block.leased = false;
      return;
    }
  }
}

size_t BufferPool::capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const Block& block : blocks_) total += block.bytes;
  return total;
}

size_t BufferPool::allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_;
}

}  // namespace weft
