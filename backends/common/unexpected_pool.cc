#include "backends/common/unexpected_pool.h"

#include <algorithm>
#include <bit>

namespace weft::backends {

size_t UnexpectedPool::capacity_for(size_t bytes) {
  return std::bit_ceil(std::max<size_t>(bytes, 64));
}

PooledBuffer UnexpectedPool::acquire(size_t bytes) {
  size_t capacity = capacity_for(bytes);
  // From the top of the stack down: in a stream of equal messages the match is the first look.
  for (size_t i = free_.size(); i-- > 0;) {
    if (free_[i].capacity != capacity) continue;
    PooledBuffer buffer = std::move(free_[i]);
    free_[i] = std::move(free_.back());
    free_.pop_back();
    pooled_bytes_ -= buffer.capacity;
    return buffer;
  }
  return PooledBuffer{std::unique_ptr<uint8_t[]>(new uint8_t[capacity]), capacity};
}

void UnexpectedPool::release(PooledBuffer buffer) {
  if (!buffer.data || pooled_bytes_ + buffer.capacity > max_pooled_bytes_) return;
  pooled_bytes_ += buffer.capacity;
  free_.push_back(std::move(buffer));
}

}  // namespace weft::backends
