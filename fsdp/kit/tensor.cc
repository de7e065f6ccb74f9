// fsdp/kit/tensor.cc: blocks, views, conversions and the memory tracker.
#include "fsdp/kit/tensor.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/half.h"

#include "fsdp/kit/check.h"

namespace weft::kit {

size_t dtype_size(DType dtype) { return dtype == DType::BFloat16 ? 2 : 4; }

const char* dtype_name(DType dtype) { return dtype == DType::BFloat16 ? "bfloat16" : "float32"; }

const char* mem_kind_name(MemKind kind) {
  switch (kind) {
    case MemKind::Params:
      return "params";
    case MemKind::Grads:
      return "grads";
    case MemKind::Optimizer:
      return "optimizer";
    case MemKind::Activations:
      return "activations";
    case MemKind::Comm:
      return "comm";
    case MemKind::Host:
      return "host";
    case MemKind::Other:
      return "other";
  }
  return "unknown";
}

// ---- MemoryTracker ----

namespace {
void raise_to(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

MemoryTracker& MemoryTracker::global() {
  // Never destroyed: blocks held by static tensors are released after other statics die.
  static MemoryTracker* tracker = new MemoryTracker;
  return *tracker;
}

void MemoryTracker::add(MemKind kind, int64_t bytes) {
  const int k = static_cast<int>(kind);
  const int64_t now = current_[k].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const int64_t total = total_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (bytes > 0) {
    raise_to(peak_[k], now);
    raise_to(peak_total_, total);
  }
}

int64_t MemoryTracker::current(MemKind kind) const {
  return current_[static_cast<int>(kind)].load(std::memory_order_relaxed);
}
int64_t MemoryTracker::peak(MemKind kind) const {
  return peak_[static_cast<int>(kind)].load(std::memory_order_relaxed);
}
int64_t MemoryTracker::current_total() const { return total_.load(std::memory_order_relaxed); }
int64_t MemoryTracker::peak_total() const { return peak_total_.load(std::memory_order_relaxed); }

void MemoryTracker::reset_peaks() {
  for (int k = 0; k < kNumMemKinds; ++k) peak_[k].store(current_[k].load());
  peak_total_.store(total_.load());
}

// ---- Tensor ----

// One allocation, counted under `kind` from construction to destruction. 64-byte aligned so
// every row of a view that starts on a multiple of 16 floats is cache-line aligned.
struct Tensor::Block {
  Block(size_t bytes, MemKind kind) : bytes(bytes), kind(kind) {
    if (bytes > 0) {
      ptr = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      if (ptr == nullptr) throw std::bad_alloc();
    }
    MemoryTracker::global().add(kind, static_cast<int64_t>(bytes));
  }
  // Tensor::borrow(): someone else's memory, counted all the same.
  Block(void* data, size_t bytes, MemKind kind, std::shared_ptr<const void> owner)
      : ptr(data), bytes(bytes), kind(kind), owner(std::move(owner)) {
    MemoryTracker::global().add(kind, static_cast<int64_t>(bytes));
  }
  ~Block() {
    if (!owner) std::free(ptr);
    MemoryTracker::global().add(kind, -static_cast<int64_t>(bytes));
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  void* ptr = nullptr;
  size_t bytes;
  MemKind kind;
  std::shared_ptr<const void> owner;  // set when borrowed: the memory is not ours to free
};

namespace {
int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    WEFT_KIT_CHECK(d >= 0, "negative dimension {} in shape [{}]", d, fmt::join(shape, ", "));
    n *= d;
  }
  return n;
}
}  // namespace

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, MemKind kind) {
  Tensor t;
  const int64_t n = product(shape);
  t.block_ = std::make_shared<Block>(static_cast<size_t>(n) * dtype_size(dtype), kind);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::borrow(void* data, std::vector<int64_t> shape, DType dtype, MemKind kind,
                      std::shared_ptr<const void> owner) {
  WEFT_KIT_CHECK(owner != nullptr, "Tensor::borrow: no owner for the memory at {}", data);
  Tensor t;
  const int64_t n = product(shape);
  t.block_ = std::make_shared<Block>(data, static_cast<size_t>(n) * dtype_size(dtype), kind,
                                     std::move(owner));
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, MemKind kind) {
  Tensor t = empty(std::move(shape), dtype, kind);
  if (t.nbytes() > 0) std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from(std::vector<int64_t> shape, const std::vector<float>& values, MemKind kind) {
  Tensor t = empty(std::move(shape), DType::Float32, kind);
  WEFT_KIT_CHECK(static_cast<int64_t>(values.size()) == t.numel(),
                 "Tensor::from: {} values for shape {}", values.size(), t.describe());
  if (!values.empty()) std::memcpy(t.data(), values.data(), t.nbytes());
  return t;
}

int64_t Tensor::dim(int i) const {
  const int rank = static_cast<int>(shape_.size());
  const int j = i < 0 ? i + rank : i;
  WEFT_KIT_CHECK(j >= 0 && j < rank, "dim({}) of {}", i, describe());
  return shape_[j];
}

int64_t Tensor::numel() const { return defined() ? product(shape_) : 0; }

MemKind Tensor::kind() const { return defined() ? block_->kind : MemKind::Other; }

void* Tensor::data() {
  if (!defined()) return nullptr;
  return static_cast<char*>(block_->ptr) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}
const void* Tensor::data() const { return const_cast<Tensor*>(this)->data(); }

float* Tensor::f32() {
  if (dtype_ != DType::Float32 || !defined())
    throw std::logic_error(fmt::format("f32() of {}: not a defined float32 tensor", describe()));
  return static_cast<float*>(data());
}
const float* Tensor::f32() const { return const_cast<Tensor*>(this)->f32(); }

uint16_t* Tensor::bf16() {
  if (dtype_ != DType::BFloat16 || !defined())
    throw std::logic_error(fmt::format("bf16() of {}: not a defined bfloat16 tensor", describe()));
  return static_cast<uint16_t*>(data());
}
const uint16_t* Tensor::bf16() const { return const_cast<Tensor*>(this)->bf16(); }

Tensor Tensor::view(int64_t offset, std::vector<int64_t> shape) const {
  WEFT_KIT_CHECK(defined(), "view of an empty tensor");
  const int64_t n = product(shape);
  const int64_t capacity = static_cast<int64_t>(block_->bytes / dtype_size(dtype_));
  WEFT_KIT_CHECK(offset >= 0 && offset_ + offset + n <= capacity,
                 "view at element {} of shape [{}] runs past {} (block of {} elements at {})",
                 offset, fmt::join(shape, ", "), describe(), capacity, offset_);
  Tensor t = *this;
  t.offset_ = offset_ + offset;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  WEFT_KIT_CHECK(product(shape) == numel(), "reshape of {} to [{}]: element counts differ",
                 describe(), fmt::join(shape, ", "));
  return view(0, std::move(shape));
}

Tensor Tensor::clone(MemKind kind) const {
  if (!defined()) return Tensor();
  Tensor t = empty(shape_, dtype_, kind);
  if (nbytes() > 0) std::memcpy(t.data(), data(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype, MemKind kind) const {
  if (dtype == dtype_ || !defined()) {
    Tensor t = clone(kind);
    return t;
  }
  Tensor t = empty(shape_, dtype, kind);
  const int64_t n = numel();
  if (dtype == DType::Float32) {
    const uint16_t* in = bf16();
    float* out = t.f32();
    for (int64_t i = 0; i < n; ++i) out[i] = weft::bf16_to_float(in[i]);
  } else {
    const float* in = f32();
    uint16_t* out = t.bf16();
    for (int64_t i = 0; i < n; ++i) out[i] = weft::float_to_bf16(in[i]);
  }
  return t;
}

Tensor Tensor::as_float32(MemKind kind) const {
  if (!defined() || dtype_ == DType::Float32) return *this;
  return to(DType::Float32, kind);
}

void Tensor::fill(float value) {
  const int64_t n = numel();
  if (dtype_ == DType::Float32) {
    float* p = f32();
    for (int64_t i = 0; i < n; ++i) p[i] = value;
  } else if (n > 0) {
    const uint16_t bits = float_to_bf16(value);
    uint16_t* p = bf16();
    for (int64_t i = 0; i < n; ++i) p[i] = bits;
  }
}

float Tensor::item(int64_t i) const {
  WEFT_KIT_CHECK(i >= 0 && i < numel(), "item({}) of {}", i, describe());
  return dtype_ == DType::Float32 ? f32()[i] : bf16_to_float(bf16()[i]);
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = item(static_cast<int64_t>(i));
  return out;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return fmt::format("{}[{}]", dtype_name(dtype_), fmt::join(shape_, ", "));
}

// weft/half.h is header-only (inline, no link to libweft): the same conversions as the
// runtime's bfloat16 reductions, so the kit and the wire round alike.
float bf16_to_float(uint16_t bits) { return weft::bf16_to_float(bits); }
uint16_t float_to_bf16(float value) { return weft::float_to_bf16(value); }

}  // namespace weft::kit
