// Ring reduce_scatter (equal and per-rank block sizes), ring all_gather (equal and uneven) and
// Bruck all_gather against independent references on every world size 1..8.
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/bruck.h"
#include "collectives/ring.h"
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

// Per-rank block sizes with zeros and unequal sizes: block j of variant v.
std::vector<size_t> uneven_counts(int size, size_t variant) {
  std::vector<size_t> counts(size);
  for (int j = 0; j < size; ++j) counts[j] = (static_cast<size_t>(j) * 3 + variant) % 5 * variant;
  return counts;
}

void report(const std::vector<std::string>& failures) {
  for (const std::string& failure : failures) UNSCOPED_INFO(failure);
  CHECK(failures.empty());
}

TEST_CASE(
    "ring reduce_scatter gives each rank its block reduced over all ranks, 1..8 ranks, "
    "from one tensor, from a list and with per-rank block sizes",
    "[collectives][reduce_scatter]") {
  for (int size = 1; size <= 8; ++size) {
    report(run_world(size, eager_limit_for(size), [&](Transport& transport, int rank, Failures& f) {
      collectives::ScratchPool pool;
      uint64_t seq = 0;
      for (DType dtype : kTestDTypes) {
        for (ReduceOp op : ops_for(dtype)) {
          // Equal blocks of each test count, then uneven blocks (variants 1..3, with empties).
          for (int variant = 0; variant < 8; ++variant) {
            std::vector<size_t> counts;
            if (variant < 5) {
              counts.assign(size, counts_for(size)[variant] / (variant == 4 ? 4 : 1));
            } else {
              counts = uneven_counts(size, static_cast<size_t>(variant - 4));
            }
            const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
            std::vector<size_t> offsets(size + 1, 0);
            for (int j = 0; j < size; ++j) offsets[j + 1] = offsets[j] + counts[j];
            const std::vector<std::byte> input = make_input(dtype, op, rank, total);
            const std::vector<std::byte> pristine = input;
            std::vector<std::byte> output(counts[rank] * dtype_size(dtype));
            ++seq;
            if (variant < 5 && seq % 2 == 0) {
              collectives::ring_reduce_scatter(context(transport, seq, some_of_the_time(pool, seq)),
                                               input.data(), output.data(), counts[0], dtype, op,
                                               kTestSegmentBytes);
            } else if (variant < 5) {  // the list form, each block in its own allocation
              std::vector<std::vector<std::byte>> copies;
              std::vector<const void*> blocks;
              for (int j = 0; j < size; ++j) {
                const auto* begin = input.data() + offsets[j] * dtype_size(dtype);
                copies.emplace_back(begin, begin + counts[j] * dtype_size(dtype));
              }
              for (const auto& copy : copies) blocks.push_back(copy.data());
              collectives::ring_reduce_scatter(context(transport, seq, some_of_the_time(pool, seq)),
                                               blocks, output.data(), counts[0], dtype, op,
                                               kTestSegmentBytes);
            } else {
              collectives::ring_reduce_scatter(context(transport, seq, some_of_the_time(pool, seq)),
                                               input.data(), output.data(), counts, dtype, op,
                                               kTestSegmentBytes);
            }
            const std::string what =
                fmt::format("{} ranks, rank {}: {} (variant {})", size, rank,
                            describe_case("reduce_scatter", dtype, op, total), variant);
            if (input != pristine) f.add(what + ": the input was modified");
            for (size_t i = 0; i < counts[rank]; ++i) {
              std::string shown;
              if (!matches(dtype, op, output.data() + i * dtype_size(dtype),
                           reference(dtype, op, size, offsets[rank] + i), &shown)) {
                f.add(fmt::format("{}: element {}: {}", what, i, shown));
                break;
              }
            }
          }
        }
      }
    }));
  }
}

enum class Gather { RingEqual, RingUneven, Bruck };

void check_all_gather(Gather algorithm) {
  const DType dtypes[] = {DType::Int32, DType::BFloat16, DType::Int64};
  for (int size = 1; size <= 8; ++size) {
    report(run_world(size, eager_limit_for(size), [&](Transport& transport, int rank, Failures& f) {
      uint64_t seq = 0;
      for (DType dtype : dtypes) {
        const size_t element = dtype_size(dtype);
        for (size_t variant = 0; variant < 5; ++variant) {
          std::vector<size_t> counts(size, counts_for(size)[variant]);
          if (algorithm == Gather::RingUneven) counts = uneven_counts(size, variant + 1);
          std::vector<size_t> offsets(size + 1, 0);
          for (int j = 0; j < size; ++j) offsets[j + 1] = offsets[j] + counts[j];
          // Rank j's block is the input formula at indices offsets[j].., distinct per rank.
          const std::vector<std::byte> input =
              make_input(dtype, ReduceOp::Sum, rank, counts[rank], offsets[rank]);
          for (bool in_place : {false, true}) {
            std::vector<std::byte> output(offsets[size] * element, std::byte{0xAB});
            const void* in = input.data();
            if (in_place) {
              std::copy(input.begin(), input.end(), output.begin() + offsets[rank] * element);
              in = output.data() + offsets[rank] * element;
            }
            const Context ctx = context(transport, ++seq);
            if (algorithm == Gather::Bruck) {
              collectives::bruck_all_gather(ctx, in, output.data(), counts[0], dtype);
            } else if (algorithm == Gather::RingEqual) {
              collectives::ring_all_gather(ctx, in, output.data(), counts[0], dtype,
                                           kTestSegmentBytes);
            } else {
              collectives::ring_all_gather(ctx, in, output.data(), counts, dtype,
                                           kTestSegmentBytes);
            }
            for (int j = 0; j < size; ++j) {
              const std::vector<std::byte> want =
                  make_input(dtype, ReduceOp::Sum, j, counts[j], offsets[j]);
              if (!std::equal(want.begin(), want.end(), output.begin() + offsets[j] * element)) {
                f.add(fmt::format(
                    "{} ranks, rank {}{}: all_gather {} variant {}: block of rank "
                    "{} differs",
                    size, rank, in_place ? " in place" : "", dtype_name(dtype), variant, j));
              }
            }
          }
        }
      }
    }));
  }
}

TEST_CASE("ring all_gather fills every rank's output rank-major on 1..8 ranks",
          "[collectives][all_gather]") {
  check_all_gather(Gather::RingEqual);
}

TEST_CASE("ring all_gather with uneven per-rank counts, zeros included, on 1..8 ranks",
          "[collectives][all_gather]") {
  check_all_gather(Gather::RingUneven);
}

TEST_CASE("bruck all_gather fills every rank's output rank-major on 1..8 ranks",
          "[collectives][all_gather]") {
  check_all_gather(Gather::Bruck);
}

}  // namespace
}  // namespace weft::test
