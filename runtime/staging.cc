#include "runtime/staging.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "runtime/cuda_runtime.h"

namespace weft {
namespace {

// CUDA lists stage through device memory of their own: allocated per call and freed when the
// lease goes (after the collective has finished on the device). A fallback for the list forms;
// the contiguous forms need none of it.
BufferPool::Lease device_lease(int device, size_t bytes) {
  CudaRuntime& cuda = cuda_runtime();
  void* memory = cuda.device_alloc(device, std::max<size_t>(bytes, 1));
  return BufferPool::Lease(memory, [](void* p) {
    try {
      cuda_runtime().device_free(p);
    } catch (...) {
      // Nothing to do: the memory is lost, the program goes on.
    }
  });
}

// Where a collective of this rank takes its input in place inside its output: the one overlap of
// the two that every algorithm handles.
const void* in_place_input(const Collective& c, int rank) {
  const Tensor& in = c.inputs[0];
  const Tensor& out = c.outputs[0];
  const size_t element = dtype_size(in.dtype);
  switch (c.kind) {
    case CollectiveKind::AllGather: {
      const size_t before = std::accumulate(c.counts.begin(), c.counts.begin() + rank, size_t{0});
      return static_cast<const char*>(out.data) + before * element;
    }
    case CollectiveKind::Gather:
      return static_cast<const char*>(out.data) + rank * in.count * element;
    case CollectiveKind::ReduceScatter: {
      // The output is this rank's block of the input.
      const size_t before = std::accumulate(c.counts.begin(), c.counts.begin() + rank, size_t{0});
      return static_cast<const char*>(out.data) - before * element;
    }
    case CollectiveKind::Scatter:
      return static_cast<const char*>(out.data) - rank * out.count * element;
    default:
      return out.data;
  }
}

}  // namespace

std::optional<Tensor> as_contiguous(const std::vector<Tensor>& list) {
  if (list.empty()) return std::nullopt;
  const size_t element = dtype_size(list[0].dtype);
  char* start = static_cast<char*>(list[0].data);
  size_t total = 0;
  for (const Tensor& t : list) {
    if (t.count > 0 && static_cast<char*>(t.data) != start + total * element) return std::nullopt;
    total += t.count;
  }
  if (total > 0 && start == nullptr) return std::nullopt;
  return Tensor{start, total, list[0].dtype, list[0].device};
}

std::pair<BufferPool::Lease, Tensor> stage_in(BufferPool& pool, const std::vector<Tensor>& list,
                                              const Tensor& like) {
  const size_t element = dtype_size(like.dtype);
  size_t total = 0;
  for (const Tensor& t : list) total += t.count;
  if (like.device.kind == DeviceKind::Cuda) {
    // Device to device, in the caller's stream's order: the collective waits for that stream.
    BufferPool::Lease lease = device_lease(like.device.index, total * element);
    char* to = static_cast<char*>(lease.get());
    for (const Tensor& t : list) {
      if (t.count > 0) {
        cuda_runtime().copy_async(to, t.data, t.count * element, current_cuda_stream());
      }
      to += t.count * element;
    }
    return {lease, Tensor{lease.get(), total, like.dtype, like.device}};
  }
  BufferPool::Lease lease = pool.acquire(total * element);
  char* to = static_cast<char*>(lease.get());
  for (const Tensor& t : list) {
    if (t.count > 0) std::memcpy(to, t.data, t.count * element);
    to += t.count * element;
  }
  return {lease, Tensor{lease.get(), total, like.dtype, like.device}};
}

std::pair<Tensor, Epilogue> stage_out(BufferPool& pool, const std::vector<Tensor>& list,
                                      const Tensor& like) {
  const size_t element = dtype_size(like.dtype);
  size_t total = 0;
  for (const Tensor& t : list) total += t.count;
  if (like.device.kind == DeviceKind::Cuda) {
    // The epilogue runs once the collective has finished on the device (its Work completed):
    // synchronous copies out, so the list's Work completes with its tensors written.
    BufferPool::Lease lease = device_lease(like.device.index, total * element);
    Tensor staged{lease.get(), total, like.dtype, like.device};
    return {staged, [lease, list, element] {
              const char* from = static_cast<const char*>(lease.get());
              for (const Tensor& t : list) {
                if (t.count > 0) cuda_runtime().copy(t.data, from, t.count * element);
                from += t.count * element;
              }
            }};
  }
  BufferPool::Lease lease = pool.acquire(total * element);
  Tensor staged{lease.get(), total, like.dtype, like.device};
  return {staged, [lease, list, element] {
            const char* from = static_cast<const char*>(lease.get());
            for (const Tensor& t : list) {
              if (t.count > 0) std::memcpy(t.data, from, t.count * element);
              from += t.count * element;
            }
          }};
}

std::optional<BufferPool::Lease> stage_overlapping_input(BufferPool& pool, Collective& c,
                                                         int rank) {
  if (c.inputs.size() != 1 || c.outputs.size() != 1) return std::nullopt;
  Tensor& in = c.inputs[0];
  const Tensor& out = c.outputs[0];
  if (in.device.kind != DeviceKind::Cpu || out.device.kind != DeviceKind::Cpu) return std::nullopt;
  const auto a = reinterpret_cast<uintptr_t>(in.data);
  const auto b = reinterpret_cast<uintptr_t>(out.data);
  const size_t a_bytes = in.nbytes(), b_bytes = out.nbytes();
  const bool overlap = a_bytes > 0 && b_bytes > 0 && a < b + b_bytes && b < a + a_bytes;
  if (!overlap || in.data == in_place_input(c, rank)) return std::nullopt;
  BufferPool::Lease lease = pool.acquire(a_bytes);
  std::memcpy(lease.get(), in.data, a_bytes);
  in.data = lease.get();
  return lease;
}

}  // namespace weft
