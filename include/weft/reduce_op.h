// weft/reduce_op.h: the reduction a collective applies (sum, prod, min, max, avg, premul_sum and
// the bitwise ops), shaped like c10d's ReduceOp so that `ReduceOp op = ReduceOp::Sum;` works.
//
// What each op means for each dtype (NaN, signed zeros, integer wrap, Bool, integer Avg) is
// specified once, in runtime/reduce.h, and every backend that reduces on the CPU follows it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weft {

struct ReduceOp {
  // The numeric values are stable: the C API and the desync check send them.
  enum Kind : uint8_t {
    Sum = 0,
    Prod = 1,
    Min = 2,
    Max = 3,
    Avg = 4,        // sum, then divided by the number of contributing ranks
    PremulSum = 5,  // each input scaled by `factor`, then summed (floating dtypes only)
    BAnd = 6,       // bitwise ops: integer and Bool dtypes only
    BOr = 7,
    BXor = 8,
  };
  static constexpr int kNumKinds = 9;

  // Implicit on purpose: `ReduceOp op = ReduceOp::Max;` and `{.op = ReduceOp::Avg}` read as in
  // c10d.
  constexpr ReduceOp(Kind k = Sum) : kind(k) {}

  // PremulSum with its scale: the inputs are multiplied by `factor` before they are summed
  // (FSDP's gradient pre-division, NCCL's ncclRedOpCreatePreMulSum).
  static constexpr ReduceOp premul_sum(double factor) {
    ReduceOp op(PremulSum);
    op.factor = factor;
    return op;
  }

  // `op == ReduceOp::PremulSum` holds whatever the factor, as in c10d.
  constexpr bool operator==(Kind k) const { return kind == k; }
  // Two ops are equal when their kinds are and, for PremulSum, their factors are.
  constexpr bool operator==(const ReduceOp& other) const {
    return kind == other.kind && (kind != PremulSum || factor == other.factor);
  }

  Kind kind;
  double factor = 1.0;  // meaningful for PremulSum only
};

// "sum", "prod", "min", "max", "avg", "premul_sum", "band", "bor", "bxor"; "invalid" for a kind
// outside the enum (a corrupted or hostile value from the wire).
std::string_view reduce_op_name(ReduceOp op);

// reduce_op_name(), plus the factor for PremulSum: "premul_sum(0.25)". For messages and logs.
std::string describe(ReduceOp op);

// Accepts the names above case-insensitively, and "premul_sum:F" / "premul_sum(F)" with a finite
// factor F ("premul_sum" alone has factor 1). nullopt for anything else.
std::optional<ReduceOp> parse_reduce_op(std::string_view text);

}  // namespace weft
