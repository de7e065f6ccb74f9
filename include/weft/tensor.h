// weft/tensor.h: the view of memory a collective reads and writes.
//
// A Tensor is a borrowed, contiguous run of `count` elements of `dtype` at `data` on `device`:
// no shape, no strides, no ownership. Shapes belong to the caller, who flattens before calling;
// the memory must outlive the Work of every collective it is passed to.
//
//   std::vector<float> grad(n);  // pg: a std::shared_ptr<weft::ProcessGroup>
//   pg->all_reduce(weft::Tensor::of(grad.data(), grad.size()), weft::ReduceOp::Avg)->wait();
//
// (tests/public_api/installed_test.sh compiles and runs these two lines against an install.)
//
// Thread safety: a Tensor is a plain value. Ownership: none; it never frees `data`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "weft/device.h"
#include "weft/dtype.h"
#include "weft/error.h"

namespace weft {

struct Tensor {
  void* data = nullptr;
  size_t count = 0;  // elements, not bytes
  DType dtype = DType::Float32;
  Device device{};

  // A view of `count` elements of T at `data` (T: float, double, Half, BFloat16, Float8E4M3,
  // Float8E5M2, bool, or an 8/32/64-bit integer). A const T is accepted for inputs that the
  // collective only reads.
  template <typename T>
  static Tensor of(T* data, size_t count, Device device = Device{}) {
    return Tensor{const_cast<std::remove_cv_t<T>*>(data), count, dtype_of_v<T>, device};
  }

  // count * dtype_size(dtype). Throws Error(InvalidArgument) when that overflows size_t, so that
  // an absurd count can never wrap into a small byte size (2^62 + 4 float32s are not 16 bytes).
  size_t nbytes() const {
    const size_t element = dtype_size(dtype);
    if (element != 0 && count > SIZE_MAX / element) {
      throw_error(ErrorCode::InvalidArgument, "Tensor::nbytes",
                  std::to_string(count) + " elements of " + std::string(dtype_name(dtype)) +
                      " overflow size_t bytes");
    }
    return count * element;
  }

  // The elements [offset, offset + n) as a view on the same memory. Throws
  // Error(InvalidArgument) when the range does not lie inside this view.
  Tensor slice(size_t offset, size_t n) const {
    if (offset > count || n > count - offset) {
      throw_error(ErrorCode::InvalidArgument, "Tensor::slice",
                  "range [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
                      std::to_string(n) + ") is outside a view of " + std::to_string(count) +
                      " elements");
    }
    return Tensor{static_cast<char*>(data) + offset * dtype_size(dtype), n, dtype, device};
  }

  // `data` as a T*. Throws Error(InvalidArgument) when T is not this view's dtype.
  template <typename T>
  T* data_as() const {
    if (dtype_of_v<T> != dtype) {
      throw_error(ErrorCode::InvalidArgument, "Tensor::data_as",
                  std::string("the view holds ") + std::string(dtype_name(dtype)) + ", not " +
                      std::string(dtype_name(dtype_of_v<T>)));
    }
    return static_cast<T*>(data);
  }
};

// "float32 x 1048576 on cuda:1": the form error messages use for a tensor.
std::string describe(const Tensor& tensor);

}  // namespace weft
