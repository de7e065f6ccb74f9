// fsdp/kit/tensor.h: the kit's owned tensor, and the memory tracker that counts every byte.
//
// A kit::Tensor is a shape, a dtype (float32 or bfloat16) and a reference-counted block of host
// memory, or a view into another tensor's block (same memory, another offset and shape). Copies
// share memory (like torch.Tensor); clone() copies the data. Tensors are always contiguous and
// row-major. Every block is counted by the MemoryTracker under the MemKind it was made with, from
// allocation to release; views count nothing.
//
//   kit::Tensor w = kit::Tensor::zeros({out, in}, kit::DType::Float32, kit::MemKind::Params);
//   kit::Tensor row = w.view(3 * in, {in});   // row 3, shares w's memory
//
// FSDP swaps a parameter's data between a view of a gathered flat buffer and an empty tensor
// (resharded), so code must not keep raw pointers to parameter data across module calls.
//
// Thread safety: a Tensor is a value; concurrent reads are fine, writes need the caller's
// ordering. The tracker is thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft::kit {

enum class DType : uint8_t { Float32 = 0, BFloat16 = 1 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "bfloat16"

// What a block of memory is for, as the tracker reports it.
enum class MemKind : uint8_t {
  Params = 0,       // parameters: sharded masters, unsharded gathered buffers
  Grads = 1,        // gradients, sharded and unsharded
  Optimizer = 2,    // optimizer state (AdamW's moments)
  Activations = 3,  // forward values kept for backward, and backward temporaries
  Comm = 4,         // communication staging buffers
  Host = 5,         // the offload pool (the CPU stand-in for host memory)
  Other = 6,
};
constexpr int kNumMemKinds = 7;
const char* mem_kind_name(MemKind kind);  // "params", "grads", ...

// Bytes per kind, current and peak, process-wide.
class MemoryTracker {
 public:
  static MemoryTracker& global();
  void add(MemKind kind, int64_t bytes);  // negative to release
  int64_t current(MemKind kind) const;
  int64_t peak(MemKind kind) const;
  int64_t current_total() const;
  int64_t peak_total() const;  // peak of the sum, not the sum of peaks
  // Sets every peak to the current value (start of a measured step).
  void reset_peaks();

 private:
  std::atomic<int64_t> current_[kNumMemKinds] = {};
  std::atomic<int64_t> peak_[kNumMemKinds] = {};
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> peak_total_{0};
};

class Tensor {
 public:
  Tensor() = default;  // empty: no memory, shape {}, numel() == 0, defined() false

  static Tensor empty(std::vector<int64_t> shape, DType dtype, MemKind kind);
  static Tensor zeros(std::vector<int64_t> shape, DType dtype, MemKind kind);
  // A float32 tensor holding `values` (size must match the shape's product).
  static Tensor from(std::vector<int64_t> shape, const std::vector<float>& values, MemKind kind);
  // `shape` elements of `dtype` at `data`, memory that `owner` keeps alive (a pool's, a
  // communication library's): tensors on it hold `owner`, and its bytes are counted under `kind`
  // while any of them lives, as if it were a block of its own. So memory reserved once and reused
  // is counted when in use, the way the rest of the kit's memory is (a pool's idle reserve is
  // for its owner to report).
  static Tensor borrow(void* data, std::vector<int64_t> shape, DType dtype, MemKind kind,
                       std::shared_ptr<const void> owner);

  bool defined() const { return block_ != nullptr; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const;  // shape()[i], negative i from the end
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  MemKind kind() const;

  void* data();
  const void* data() const;
  float* f32();  // data() as float*; throws std::logic_error unless Float32
  const float* f32() const;
  uint16_t* bf16();  // raw bfloat16 bits; throws unless BFloat16
  const uint16_t* bf16() const;

  // `shape`'s elements starting `offset` elements into this tensor's memory, sharing it.
  Tensor view(int64_t offset, std::vector<int64_t> shape) const;
  // The same memory with another shape of equal numel.
  Tensor reshape(std::vector<int64_t> shape) const;
  Tensor clone(MemKind kind) const;
  // This tensor's values in `dtype` (a copy; bfloat16 rounds to nearest even).
  Tensor to(DType dtype, MemKind kind) const;
  // This tensor when it is float32 (or empty), else a float32 copy counted as `kind`.
  Tensor as_float32(MemKind kind) const;
  void fill(float value);
  // Element i (row-major) as float, whatever the dtype; for tests and printing.
  float item(int64_t i) const;
  std::vector<float> to_vector() const;

  std::string describe() const;  // "float32[4, 8]"

 private:
  struct Block;
  std::shared_ptr<Block> block_;
  int64_t offset_ = 0;  // elements
  std::vector<int64_t> shape_;
  DType dtype_ = DType::Float32;
};

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);  // round to nearest even, NaN stays NaN

}  // namespace weft::kit
