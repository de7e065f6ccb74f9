// benchmarks/nccl_tests_table.h: the column header of nccl-tests' result table, which weft-perf
// and benchmarks/gpu/nccl_raw print alike (tools that parse nccl-tests' output read both).
#pragma once

#include <fmt/format.h>

namespace weft::bench {

// The three header lines: the out-of-place / in-place banner, the column names, their units.
inline void print_nccl_tests_columns() {
  fmt::print(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                 "
      "      in-place          \n",
      "", "", "", "", "");
  fmt::print(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  "
      "{:>6}  {:>6}  {:>6} \n",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
      "busbw", "#wrong");
  fmt::print(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  "
      "{:>6}  {:>6}  {:>6} \n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
      "");
}

}  // namespace weft::bench
