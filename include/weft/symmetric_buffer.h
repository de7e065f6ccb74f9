// weft/symmetric_buffer.h: memory that every rank of a group allocates together and that the
// ranks on one host map from one shared object, so collectives on it need no messages.
//
//   auto buffer = pg->allocate_symmetric(64 << 20);        // collective over the group
//   weft::Tensor grad = buffer->view<float>(0, n);          // this rank's floats [0, n)
//   fill(grad);
//   pg->all_reduce(grad)->wait();                           // zero-copy: peers read it in place
//
// A SymmetricBuffer holds size() bytes on every rank of the group that made it. Every rank's bytes
// lie in one mapping per host (one block per rank of that host), so each rank can read and write
// its local peers' blocks directly. A collective whose tensors all lie in symmetric buffers of its
// group, at the same offset on every rank, runs zero-copy (docs/symmetric-memory.md): each rank
// reduces or copies its share straight between the blocks, with a barrier in shared memory before
// and after; ranks on other hosts are reached over the transport between those (hierarchically).
// Tensors anywhere else take the usual message path. Every rank must make the same choice: a
// collective where some ranks pass symmetric tensors and others do not fails with Timeout (or
// Desync, when the ranks pass tensors at different offsets of the same buffer).
//
// Lifetime: the memory stays mapped while the handle lives, and while a collective posted on a
// tensor inside it has not completed (dropping the handle early is safe). The shared object's
// name is removed from /dev/shm as soon as every local rank has mapped it, so nothing is left
// behind when a rank crashes; the memory goes when the last rank unmaps it.
//
// Thread safety: data(), size() and the views are plain reads; release() may race with posting a
// collective on the buffer from another thread (one of them wins, the other is refused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "weft/dtype.h"
#include "weft/tensor.h"

namespace weft {

class SymmetricBuffer {
 public:
  virtual ~SymmetricBuffer() = default;

  // This rank's bytes, [data(), data() + size()); page-aligned. Null after release().
  virtual void* data() const = 0;
  // Bytes per rank, as asked of allocate_symmetric().
  virtual size_t size() const = 0;
  // The group that allocated it, and its number among that group's buffers (0, 1, ...).
  virtual const std::string& group_name() const = 0;
  virtual uint64_t id() const = 0;

  // Unmaps this rank's block now (the handle stays, data() turns null). Throws
  // Error(InvalidArgument) naming the collectives that still use it while any posted on a tensor
  // inside it has not completed: wait for them first. Idempotent.
  virtual void release() = 0;

  // `count` elements of `dtype` starting `offset_bytes` into this rank's block. Throws
  // Error(InvalidArgument) when the range does not lie inside the buffer or it was released.
  // Give offsets that are multiples of the dtype's size: the reduce kernels, as C++ does, read
  // elements at their alignment (as with any other Tensor).
  Tensor view(DType dtype, size_t offset_bytes, size_t count) const;
  // view() in elements of T: view<float>(i, n) is floats [i, i + n).
  template <typename T>
  Tensor view(size_t offset_elements, size_t count) const {
    return view(dtype_of_v<T>, offset_elements * sizeof(T), count);
  }

  // Where [p, p + bytes) lies in this rank's block: its offset in bytes; nullopt when p is not
  // inside the block. Throws Error(InvalidArgument) when it starts inside and ends past it.
  std::optional<size_t> offset_of(const void* p, size_t bytes) const;
};

}  // namespace weft
