// Ring and recursive-doubling all_reduce against the scalar reference in harness.h: every world
// size 1..8, every test dtype and op, counts {0, 1, 7, not divisible by P, many segments}, in
// place and out of place (checking the input is left alone).
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/recursive_doubling.h"
#include "collectives/ring.h"
#include "tests/collectives/harness.h"

namespace weft::test {
namespace {

using collectives::Context;
using AllReduceFn =
    std::function<void(const Context&, const void*, void*, size_t, DType, ReduceOp)>;

void check_all_reduce(const std::string& name, const AllReduceFn& all_reduce) {
  for (int size = 1; size <= 8; ++size) {
    const std::vector<std::string> failures =
        run_world(size, eager_limit_for(size), [&](Transport& transport, int rank, Failures& f) {
          // Two calls in three take scratch from the rank's pool, which then holds an earlier
          // call's bytes; the third allocates its own: both paths must give the same results.
          collectives::ScratchPool pool;
          uint64_t seq = 0;
          for (DType dtype : kTestDTypes) {
            for (ReduceOp op : ops_for(dtype)) {
              for (size_t count : counts_for(size)) {
                ++seq;
                const bool in_place = seq % 2 == 0;
                std::vector<std::byte> input = make_input(dtype, op, rank, count);
                const std::vector<std::byte> pristine = input;
                std::vector<std::byte> output(in_place ? 0 : input.size());
                void* out = in_place ? input.data() : output.data();
                all_reduce({.transport = transport,
                            .seq = seq,
                            .deadline = test_deadline(),
                            .scratch = seq % 3 != 0 ? &pool : nullptr},
                           input.data(), out, count, dtype, op);
                const std::string what = fmt::format("{} on {} ranks{}, rank {}: {}", name, size,
                                                     in_place ? " in place" : "", rank,
                                                     describe_case("all_reduce", dtype, op, count));
                if (!in_place && input != pristine) f.add(what + ": the input was modified");
                const auto* result = static_cast<const std::byte*>(out);
                for (size_t i = 0; i < count; ++i) {
                  std::string shown;
                  if (!matches(dtype, op, result + i * dtype_size(dtype),
                               reference(dtype, op, size, i), &shown)) {
                    f.add(fmt::format("{}: element {}: {}", what, i, shown));
                    break;
                  }
                }
              }
            }
          }
        });
    for (const std::string& failure : failures) UNSCOPED_INFO(failure);
    CHECK(failures.empty());
  }
}

TEST_CASE("ring all_reduce matches the scalar reference on 1..8 ranks for every dtype and op",
          "[collectives][all_reduce]") {
  check_all_reduce("ring", [](const Context& ctx, const void* in, void* out, size_t count,
                              DType dtype, ReduceOp op) {
    collectives::ring_all_reduce(ctx, in, out, count, dtype, op, kTestSegmentBytes);
  });
}

TEST_CASE("recursive doubling all_reduce matches the scalar reference on 1..8 ranks",
          "[collectives][all_reduce]") {
  check_all_reduce("recursive_doubling", collectives::recursive_doubling_all_reduce);
}

TEST_CASE("ring all_reduce with the default segment size sums 5 ranks' float32 exactly",
          "[collectives][all_reduce]") {
  constexpr size_t kCount = 100'003;  // prime: chunks of unequal size, one segment each
  const auto failures = run_world(5, 0, [&](Transport& transport, int rank, Failures& f) {
    std::vector<float> data(kCount);
    for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>((rank + 1) * (i % 1000));
    collectives::ring_all_reduce({.transport = transport, .seq = 1, .deadline = test_deadline()},
                                 data.data(), data.data(), kCount, DType::Float32, ReduceOp::Sum);
    for (size_t i = 0; i < kCount; ++i) {
      const float want = static_cast<float>(15 * (i % 1000));  // (1+2+3+4+5) * (i % 1000)
      if (data[i] != want) {
        f.add(fmt::format("rank {} element {}: got {} want {}", rank, i, data[i], want));
        break;
      }
    }
  });
  for (const std::string& failure : failures) UNSCOPED_INFO(failure);
  CHECK(failures.empty());
}

TEST_CASE("all_reduce algorithms give every rank bit-identical float results",
          "[collectives][all_reduce]") {
  // Inputs whose sums round: the ranks must still agree with each other bit for bit.
  constexpr size_t kCount = 257;
  for (int algorithm = 0; algorithm < 2; ++algorithm) {
    std::vector<std::vector<float>> results(7);
    const auto failures = run_world(7, 0, [&](Transport& transport, int rank, Failures&) {
      std::vector<float> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = 1.0f / static_cast<float>(rank * 31 + i + 3);
      const Context ctx{.transport = transport, .seq = 1, .deadline = test_deadline()};
      if (algorithm == 0) {
        collectives::ring_all_reduce(ctx, data.data(), data.data(), kCount, DType::Float32,
                                     ReduceOp::Sum, 64);
      } else {
        collectives::recursive_doubling_all_reduce(ctx, data.data(), data.data(), kCount,
                                                   DType::Float32, ReduceOp::Sum);
      }
      results[rank] = data;
    });
    for (const std::string& failure : failures) UNSCOPED_INFO(failure);
    CHECK(failures.empty());
    for (int rank = 1; rank < 7; ++rank) {
      INFO("algorithm " << algorithm << " rank " << rank);
      CHECK(std::memcmp(results[rank].data(), results[0].data(), kCount * sizeof(float)) == 0);
    }
  }
}

}  // namespace
}  // namespace weft::test
