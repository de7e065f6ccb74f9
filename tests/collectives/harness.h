// tests/collectives/harness.h: ranks as threads over a LocalFabric, deterministic inputs, and an
// independent scalar reference for every reduction the algorithm tests check.
//
// run_world(P, eager_limit, body) runs body(transport, rank, failures) on P threads and returns the
// failures they recorded (empty when all went well). A rank that throws records the exception
// and aborts the fabric, so the others stop at once instead of waiting for their deadlines.
// Catch2 assertions are not thread-safe, so rank bodies record mismatches as strings through
// Failures and the test thread checks the list after joining.
//
// Inputs: input_value(dtype, op, rank, i) is a closed-form formula. Floating inputs are
// multiples of 1/4 in [-2, 2] (powers of two for Prod), so every partial sum and product of up
// to 8 ranks is exact in bfloat16, float16 and float32, and the reference does not depend on
// the algorithm's order; only Avg's division rounds (checked to one unit in the last place).
// Integer inputs use the whole range, so Sum, Prod and Avg wrap.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/reduce_op.h"

#include "collectives/local_transport.h"
#include "tests/core/reference.h"

namespace weft::test {

using collectives::Clock;
using collectives::LocalFabric;
using collectives::Transport;

// Mismatches recorded by rank threads; reports the first few of many.
class Failures {
 public:
  void add(std::string text) {
    std::lock_guard lock(mu_);
    if (list_.size() < 20) list_.push_back(std::move(text));
    ++count_;
  }
  std::vector<std::string> take() {
    std::lock_guard lock(mu_);
    if (count_ > list_.size()) list_.push_back(fmt::format("... {} failures in all", count_));
    return list_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> list_;
  size_t count_ = 0;
};

template <typename Body>
std::vector<std::string> run_world(int size, size_t eager_limit, Body body) {
  LocalFabric fabric(size, eager_limit);
  Failures failures;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(fabric.transport(rank), rank, failures);
      } catch (const std::exception& e) {
        failures.add(fmt::format("rank {} threw: {}", rank, e.what()));
        fabric.abort_all(fmt::format("rank {} failed", rank));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return failures.take();
}

// A deadline generous enough for a loaded 2-core machine, short enough that a hang fails fast.
inline Clock::time_point test_deadline() { return Clock::now() + std::chrono::seconds(10); }

// Integer inputs: a multiplicative hash of (rank, i) over the whole range.
inline uint64_t int_input(int rank, size_t i) {
  return (i + 1) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank + 1) * 0xBF58476D1CE4E5B9ull;
}

// Floating inputs as exact doubles (see the file comment).
inline double real_input(ReduceOp op, int rank, size_t i) {
  if (op.kind == ReduceOp::Prod) {
    static constexpr double kPowers[] = {1.0, 2.0, 0.5, -1.0, -2.0, 1.0, -0.5};
    return kPowers[(rank * 3 + i * 5) % 7];
  }
  return static_cast<double>(static_cast<int>((rank * 7 + i * 13 + 3) % 17) - 8) * 0.25;
}

// Writes element i of rank's input.
inline void write_input(DType dtype, ReduceOp op, int rank, size_t i, void* element) {
  if (is_floating(dtype)) {
    store_real(dtype, element, real_input(op, rank, i));
  } else {
    store_wrapped(dtype, element, static_cast<__int128>(int_input(rank, i)));
  }
}

inline std::vector<std::byte> make_input(DType dtype, ReduceOp op, int rank, size_t count,
                                         size_t first = 0) {
  std::vector<std::byte> data(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    write_input(dtype, op, rank, first + i, data.data() + i * dtype_size(dtype));
  }
  return data;
}

// Reference for element i of the reduction over ranks 0..size-1, as a double (floating) or as
// the wrapped integer's bits (integers), computed with plain scalar code.
struct Expected {
  double real = 0;
  uint64_t bits = 0;
};

inline Expected reference(DType dtype, ReduceOp op, int size, size_t i) {
  Expected e;
  if (is_floating(dtype)) {
    double acc = 0;
    for (int r = 0; r < size; ++r) {
      const double x = real_input(op, r, i) * (op.kind == ReduceOp::PremulSum ? op.factor : 1.0);
      if (r == 0) {
        acc = x;
      } else if (op.kind == ReduceOp::Prod) {
        acc *= x;
      } else if (op.kind == ReduceOp::Min) {
        acc = std::min(acc, x);
      } else if (op.kind == ReduceOp::Max) {
        acc = std::max(acc, x);
      } else {
        acc += x;
      }
    }
    e.real = op.kind == ReduceOp::Avg ? acc / size : acc;
    return e;
  }
  const int bits = static_cast<int>(dtype_size(dtype)) * 8;
  const uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
  auto as_signed = [&](uint64_t v) {  // sign-extend the low `bits` bits
    v &= mask;
    if (bits < 64 && (v >> (bits - 1)) & 1) v |= ~mask;
    return static_cast<int64_t>(v);
  };
  uint64_t acc = 0;
  for (int r = 0; r < size; ++r) {
    const uint64_t x = int_input(r, i) & mask;
    if (r == 0) {
      acc = x;
    } else if (op.kind == ReduceOp::Prod) {
      acc = (acc * x) & mask;
    } else if (op.kind == ReduceOp::Min) {
      acc = as_signed(x) < as_signed(acc) ? x : acc;
    } else if (op.kind == ReduceOp::Max) {
      acc = as_signed(x) > as_signed(acc) ? x : acc;
    } else if (op.kind == ReduceOp::BXor) {
      acc ^= x;
    } else {
      acc = (acc + x) & mask;
    }
  }
  if (op.kind == ReduceOp::Avg) acc = static_cast<uint64_t>(as_signed(acc) / size);
  e.bits = acc & mask;
  return e;
}

// Checks element `got` against `want`: integers bit for bit; floats exactly, or within one unit
// in the last place of the dtype when the op rounds (Avg).
inline bool matches(DType dtype, ReduceOp op, const void* got, const Expected& want,
                    std::string* shown) {
  if (is_floating(dtype)) {
    const double value = load_real(dtype, got);
    const int significand = dtype == DType::Float16    ? 11
                            : dtype == DType::BFloat16 ? 8
                            : dtype == DType::Float32  ? 24
                                                       : 53;
    const double ulp = std::ldexp(std::max(std::fabs(want.real), 1e-3), 1 - significand);
    const bool ok =
        op.kind == ReduceOp::Avg ? std::fabs(value - want.real) <= ulp : value == want.real;
    if (!ok) *shown = fmt::format("got {} want {}", value, want.real);
    return ok;
  }
  uint64_t bits = 0;
  std::memcpy(&bits, got, dtype_size(dtype));
  if (bits == want.bits) return true;
  *shown = fmt::format("got {:#x} want {:#x}", bits, want.bits);
  return false;
}

inline std::string describe_case(std::string_view what, DType dtype, ReduceOp op, size_t count) {
  return fmt::format("{} {} x {} {}", what, dtype_name(dtype), count, describe(op));
}

// The dtypes and ops every reduction test covers.
inline constexpr DType kTestDTypes[] = {DType::Float32, DType::Int32, DType::Int64, DType::BFloat16,
                                        DType::Float16};
inline std::vector<ReduceOp> ops_for(DType dtype) {
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                               ReduceOp::Avg};
  if (is_floating(dtype)) {
    ops.push_back(ReduceOp::premul_sum(0.5));
  } else {
    ops.push_back(ReduceOp::BXor);
  }
  return ops;
}

// Counts every algorithm is run with on P ranks: empty, one element, an odd prime, one not
// divisible by P, and one that spans many segments of the tests' tiny segment size.
inline std::vector<size_t> counts_for(int size) {
  return {0, 1, 7, static_cast<size_t>(size) * 5 + 1, 300};
}

// Even world sizes run with every send synchronous (eager limit 0), odd ones fully buffered, so
// each algorithm is shown both to need no buffering and to cope with unexpected messages.
inline size_t eager_limit_for(int size) { return size % 2 == 0 ? 0 : LocalFabric::kUnlimited; }

// Small enough that count 300 crosses many segments in every chunk.
inline constexpr size_t kTestSegmentBytes = 16;

}  // namespace weft::test
