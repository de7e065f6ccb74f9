// Binomial broadcast and reduce, linear gather and scatter: every world size 1..8, every root,
// counts {0, 1, 7, not divisible by P, many segments}; reduce also over every test dtype and op.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/binomial_tree.h"
#include "collectives/gather_scatter.h"
#include "tests/collectives/harness.h"

namespace weft::test {
namespace {

using collectives::Context;

Context context(Transport& transport, uint64_t seq, collectives::ScratchPool* scratch = nullptr) {
  return {.transport = transport, .seq = seq, .deadline = test_deadline(), .scratch = scratch};
}

// Two calls in three take scratch from the rank's pool, which then holds an earlier call's bytes;
// the third allocates its own: both paths of detail::Scratch give the same results.
collectives::ScratchPool* some_of_the_time(collectives::ScratchPool& pool, uint64_t seq) {
  return seq % 3 != 0 ? &pool : nullptr;
}

void report(const std::vector<std::string>& failures) {
  for (const std::string& failure : failures) UNSCOPED_INFO(failure);
  CHECK(failures.empty());
}

TEST_CASE("binomial broadcast copies the root's buffer to every rank, every root of 1..8",
          "[collectives][broadcast]") {
  for (int size = 1; size <= 8; ++size) {
    report(run_world(size, eager_limit_for(size), [&](Transport& transport, int rank, Failures& f) {
      uint64_t seq = 0;
      for (int root = 0; root < size; ++root) {
        for (size_t count : counts_for(size)) {
          // The root's data depends on the root, so a message from the wrong rank shows.
          const std::vector<std::byte> want = make_input(DType::Int32, ReduceOp::Sum, root, count);
          std::vector<std::byte> data =
              rank == root ? want : std::vector<std::byte>(want.size(), std::byte{0xCD});
          collectives::binomial_broadcast(context(transport, ++seq), data.data(), data.size(), root,
                                          kTestSegmentBytes);
          if (data != want) {
            f.add(fmt::format("{} ranks, root {}, rank {}: broadcast of {} int32 differs", size,
                              root, rank, count));
          }
        }
      }
    }));
  }
}

TEST_CASE("binomial reduce leaves the reduction on the root, every root, dtype and op of 1..8",
          "[collectives][reduce]") {
  for (int size = 1; size <= 8; ++size) {
    report(run_world(size, eager_limit_for(size), [&](Transport& transport, int rank, Failures& f) {
      collectives::ScratchPool pool;
      uint64_t seq = 0;
      for (int root = 0; root < size; ++root) {
        for (DType dtype : kTestDTypes) {
          for (ReduceOp op : ops_for(dtype)) {
            for (size_t count : counts_for(size)) {
              const std::vector<std::byte> input = make_input(dtype, op, rank, count);
              const std::vector<std::byte> pristine = input;
              // Non-roots pass a sentinel output that must stay untouched.
              std::vector<std::byte> output(input.size(), std::byte{0xEE});
              const std::vector<std::byte> sentinel = output;
              ++seq;
              collectives::binomial_reduce(context(transport, seq, some_of_the_time(pool, seq)),
                                           input.data(), output.data(), count, dtype, op, root);
              const std::string what = fmt::format("{} ranks, root {}, rank {}: {}", size, root,
                                                   rank, describe_case("reduce", dtype, op, count));
              if (input != pristine) f.add(what + ": the input was modified");
              if (rank != root) {
                if (output != sentinel) f.add(what + ": a non-root's output was written");
                continue;
              }
              for (size_t i = 0; i < count; ++i) {
                std::string shown;
                if (!matches(dtype, op, output.data() + i * dtype_size(dtype),
                             reference(dtype, op, size, i), &shown)) {
                  f.add(fmt::format("{}: element {}: {}", what, i, shown));
                  break;
                }
              }
            }
          }
        }
      }
    }));
  }
}

TEST_CASE("linear gather and scatter move rank-major blocks to and from every root of 1..8",
          "[collectives][gather][scatter]") {
  const DType dtypes[] = {DType::Int64, DType::Float16};
  for (int size = 1; size <= 8; ++size) {
    report(run_world(size, eager_limit_for(size), [&](Transport& transport, int rank, Failures& f) {
      uint64_t seq = 0;
      for (int root = 0; root < size; ++root) {
        for (DType dtype : dtypes) {
          const size_t element = dtype_size(dtype);
          for (size_t count : counts_for(size)) {
            for (bool in_place : {false, true}) {
              const std::string what =
                  fmt::format("{} ranks, root {}, rank {}{}: {} x {}", size, root, rank,
                              in_place ? " in place" : "", dtype_name(dtype), count);
              // Gather: block j of the root's output is rank j's input.
              const std::vector<std::byte> mine = make_input(dtype, ReduceOp::Sum, rank, count);
              std::vector<std::byte> whole(size * count * element, std::byte{0x11});
              const void* in = mine.data();
              if (in_place && rank == root) {
                std::copy(mine.begin(), mine.end(), whole.begin() + rank * count * element);
                in = whole.data() + rank * count * element;
              }
              collectives::linear_gather(context(transport, ++seq), in,
                                         rank == root ? whole.data() : nullptr, count, dtype, root);
              if (rank == root) {
                std::vector<std::byte> want;
                for (int j = 0; j < size; ++j) {
                  const auto block = make_input(dtype, ReduceOp::Sum, j, count);
                  want.insert(want.end(), block.begin(), block.end());
                }
                if (whole != want) f.add(what + ": gathered output differs");
              }
              // Scatter: the root's input is the blocks of every rank, offset by the root so
              // that a block from the wrong root shows.
              std::vector<std::byte> source;
              for (int j = 0; j < size; ++j) {
                const auto block = make_input(dtype, ReduceOp::Sum, j + root, count);
                source.insert(source.end(), block.begin(), block.end());
              }
              std::vector<std::byte> block(count * element, std::byte{0x22});
              void* out = block.data();
              if (in_place && rank == root) out = source.data() + rank * count * element;
              collectives::linear_scatter(context(transport, ++seq),
                                          rank == root ? source.data() : nullptr, out, count, dtype,
                                          root);
              const auto want = make_input(dtype, ReduceOp::Sum, rank + root, count);
              const auto* got = static_cast<const std::byte*>(out);
              if (!std::equal(want.begin(), want.end(), got)) {
                f.add(what + ": scattered block differs");
              }
            }
          }
        }
      }
    }));
  }
}

}  // namespace
}  // namespace weft::test
