// runtime/argument_checks.h: the checks every collective of a ProcessGroup runs on the calling
// thread before it is numbered, each throwing Error(InvalidArgument) that names the argument and
// carries the sequence number the call would have taken.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "weft/tensor.h"

#include "runtime/process_group_state.h"
#include "runtime/reduce.h"

namespace weft {

// "[1, 2, 3]", or "[1, 2, 3, 4, ... 9 entries]" for long lists.
inline std::string join_counts(const std::vector<size_t>& counts) {
  if (counts.size() > 8) {
    return fmt::format("[{}, ... {} entries]", fmt::join(counts.begin(), counts.begin() + 4, ", "),
                       counts.size());
  }
  return fmt::format("[{}]", fmt::join(counts, ", "));
}

// The checks every collective runs on the calling thread; each names the argument.
class ArgumentChecker {
 public:
  ArgumentChecker(const ProcessGroup::State& state, std::string_view op) : state_(state), op_(op) {}

  [[noreturn]] void fail(std::string detail) const {
    throw Error(ErrorCode::InvalidArgument, state_.context(op_, state_.seq + 1), detail);
  }

  // A valid dtype, data for every element, and a byte size that neither overflows size_t nor
  // runs past the end of the address space (a wrapped size would move a few bytes and succeed).
  void tensor(const Tensor& t, std::string_view name) const {
    if (!is_valid(t.dtype)) fail(fmt::format("{} has an invalid dtype", name));
    if (t.count > 0 && t.data == nullptr) {
      fail(fmt::format("{} has {} elements but a null data pointer", name, t.count));
    }
    const size_t element = dtype_size(t.dtype);
    if (t.count > SIZE_MAX / element) {
      fail(fmt::format("{} has {} elements of {}: {} bytes each overflows size_t", name, t.count,
                       dtype_name(t.dtype), element));
    }
    if (reinterpret_cast<uintptr_t>(t.data) > UINTPTR_MAX - t.count * element) {
      fail(fmt::format("{} has {} elements of {} from {}: past the end of the address space", name,
                       t.count, dtype_name(t.dtype), t.data));
    }
  }
  void same_kind(const Tensor& t, const Tensor& reference, std::string_view name,
                 std::string_view reference_name) const {
    if (t.dtype != reference.dtype) {
      fail(fmt::format("{} is {} but {} is {}", name, dtype_name(t.dtype), reference_name,
                       dtype_name(reference.dtype)));
    }
    if (t.device != reference.device) {
      fail(fmt::format("{} is on {} but {} is on {}", name, device_name(t.device), reference_name,
                       device_name(reference.device)));
    }
  }
  void count(const Tensor& t, size_t expected, std::string_view name, std::string_view why) const {
    if (t.count != expected) {
      fail(fmt::format("{} has {} elements; expected {} ({})", name, t.count, expected, why));
    }
  }
  void root(int root, std::string_view name = "root") const {
    if (root < 0 || root >= state_.size) {
      fail(fmt::format("{} {} is out of range for a group of {} ranks", name, root, state_.size));
    }
  }
  void op(DType dtype, ReduceOp op) const {
    try {
      reduce::check_supported(dtype, op);
    } catch (const Error& e) {
      fail(fmt::format("op {} cannot reduce {}: {}", describe(op), dtype_name(dtype), e.what()));
    }
  }
  void list(const std::vector<Tensor>& tensors, std::string_view name) const {
    if (tensors.size() != static_cast<size_t>(state_.size)) {
      fail(fmt::format("{} has {} tensors; expected one per rank ({})", name, tensors.size(),
                       state_.size));
    }
  }
  void counts(const std::vector<size_t>& counts, std::string_view name) const {
    if (counts.size() != static_cast<size_t>(state_.size)) {
      fail(fmt::format("{} has {} entries; expected one per rank ({})", name, counts.size(),
                       state_.size));
    }
  }
  // The sum of `counts`, refused when it overflows size_t (a wrapped sum could match a tensor's
  // count and pass the size check).
  size_t sum(const std::vector<size_t>& counts, std::string_view name) const {
    size_t total = 0;
    for (size_t c : counts) {
      if (c > SIZE_MAX - total)
        fail(fmt::format("the sum of {} {} overflows size_t", name, join_counts(counts)));
      total += c;
    }
    return total;
  }
  // n * size(), refused when it overflows size_t.
  size_t per_rank(size_t n, std::string_view name) const {
    const auto ranks = static_cast<size_t>(state_.size);
    if (n > SIZE_MAX / ranks) {
      fail(fmt::format("{} {} times {} ranks overflows size_t", name, n, ranks));
    }
    return n * ranks;
  }

 private:
  const ProcessGroup::State& state_;
  std::string_view op_;
};

// Whether two views start at the same memory (the in-place spelling of a collective).
inline bool same_memory(const Tensor& a, const Tensor& b) { return a.data == b.data; }

}  // namespace weft
