// Halving-doubling reduce_scatter and all_reduce against the scalar reference in harness.h: every
// world size 1..8 (the powers of two and every fold: 3, 5, 6, 7), every test dtype and op, counts
// {0, 1, primes, not divisible by P, uneven per-rank blocks with empties}, in place and out of
// place, output inside input, with every send synchronous (eager limit 0: no deadlock) and fully
// buffered, with and without the rank's ScratchPool; then bit-identical results across ranks, and
// how it fails (Timeout naming the algorithm and step, bad arguments).
#include "collectives/halving_doubling.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "tests/collectives/harness.h"

namespace weft::test {
namespace {

using collectives::Context;
using namespace std::chrono_literals;

// Both buffering regimes for every world size (the other tests alternate by parity): eager limit
// 0 shows the algorithm needs no buffering, unlimited that it copes with unexpected messages.
constexpr size_t kEagerLimits[] = {0, LocalFabric::kUnlimited};

// counts_for() (0, 1, 7, 5P+1, 300) plus a count below P (some blocks empty) and larger primes.
std::vector<size_t> all_reduce_counts(int size) {
  std::vector<size_t> counts = counts_for(size);
  counts.insert(counts.end(), {3, 13, 1021});
  return counts;
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

// Checks `count` elements at `got` against the reference at indices first.., adding one failure.
void check_result(Failures& f, const std::string& what, DType dtype, ReduceOp op, int size,
                  const std::byte* got, size_t count, size_t first) {
  for (size_t i = 0; i < count; ++i) {
    std::string shown;
    if (!matches(dtype, op, got + i * dtype_size(dtype), reference(dtype, op, size, first + i),
                 &shown)) {
      f.add(fmt::format("{}: element {}: {}", what, i, shown));
      return;
    }
  }
}

TEST_CASE(
    "halving_doubling all_reduce matches the scalar reference on 1..8 ranks for every dtype, "
    "op and count, in place and out, synchronous and buffered",
    "[collectives][all_reduce][halving_doubling]") {
  for (int size = 1; size <= 8; ++size) {
    for (size_t eager_limit : kEagerLimits) {
      report(run_world(size, eager_limit, [&](Transport& transport, int rank, Failures& f) {
        // It needs no scratch, but a pool must not change anything either.
        collectives::ScratchPool pool;
        uint64_t seq = 0;
        for (DType dtype : kTestDTypes) {
          for (ReduceOp op : ops_for(dtype)) {
            for (size_t count : all_reduce_counts(size)) {
              ++seq;
              const bool in_place = seq % 2 == 0;
              std::vector<std::byte> input = make_input(dtype, op, rank, count);
              const std::vector<std::byte> pristine = input;
              std::vector<std::byte> output(in_place ? 0 : input.size());
              void* out = in_place ? input.data() : output.data();
              collectives::halving_doubling_all_reduce({.transport = transport,
                                                        .seq = seq,
                                                        .deadline = test_deadline(),
                                                        .scratch = seq % 3 != 0 ? &pool : nullptr},
                                                       input.data(), out, count, dtype, op);
              const std::string what = fmt::format("{} ranks (eager limit {}){}, rank {}: {}", size,
                                                   eager_limit, in_place ? " in place" : "", rank,
                                                   describe_case("all_reduce", dtype, op, count));
              if (!in_place && input != pristine) f.add(what + ": the input was modified");
              check_result(f, what, dtype, op, size, static_cast<const std::byte*>(out), count, 0);
            }
          }
        }
      }));
    }
  }
}

// How reduce_scatter is called: the equal-block overload, the per-rank overload, and the
// per-rank overload with output inside input, at this rank's block (the usual in-place use).
enum class Call { Equal, PerRank, OutputInInput };

TEST_CASE(
    "halving_doubling reduce_scatter gives each rank its block reduced over all ranks on "
    "1..8 ranks, equal and uneven blocks, output apart and inside input",
    "[collectives][reduce_scatter][halving_doubling]") {
  for (int size = 1; size <= 8; ++size) {
    for (size_t eager_limit : kEagerLimits) {
      report(run_world(size, eager_limit, [&](Transport& transport, int rank, Failures& f) {
        collectives::ScratchPool pool;
        uint64_t seq = 0;
        for (DType dtype : kTestDTypes) {
          const size_t element = dtype_size(dtype);
          for (ReduceOp op : ops_for(dtype)) {
            // Equal blocks of each test count (300 / 4 = 75 per rank), then uneven ones.
            for (int variant = 0; variant < 8; ++variant) {
              std::vector<size_t> counts;
              if (variant < 5) {
                counts.assign(size, counts_for(size)[variant] / (variant == 4 ? 4 : 1));
              } else {
                counts = uneven_counts(size, static_cast<size_t>(variant - 4));
              }
              std::vector<size_t> offsets(size + 1, 0);
              for (int j = 0; j < size; ++j) offsets[j + 1] = offsets[j] + counts[j];
              ++seq;
              const Call call = variant < 5 && seq % 3 == 0 ? Call::Equal
                                : seq % 2 == 0              ? Call::OutputInInput
                                                            : Call::PerRank;
              std::vector<std::byte> input = make_input(dtype, op, rank, offsets[size]);
              const std::vector<std::byte> pristine = input;
              std::vector<std::byte> separate(counts[rank] * element);
              std::byte* output = call == Call::OutputInInput
                                      ? input.data() + offsets[rank] * element
                                      : separate.data();
              const Context ctx{.transport = transport,
                                .seq = seq,
                                .deadline = test_deadline(),
                                .scratch = seq % 4 != 0 ? &pool : nullptr};
              if (call == Call::Equal) {
                collectives::halving_doubling_reduce_scatter(ctx, input.data(), output, counts[0],
                                                             dtype, op);
              } else {
                collectives::halving_doubling_reduce_scatter(ctx, input.data(), output, counts,
                                                             dtype, op);
              }
              const std::string what = fmt::format(
                  "{} ranks (eager limit {}), rank {}: {} (variant {}{})", size, eager_limit, rank,
                  describe_case("reduce_scatter", dtype, op, offsets[size]), variant,
                  call == Call::OutputInInput ? ", output inside input" : "");
              // Out of place the input must be untouched; in place, all but this rank's block.
              for (size_t b = 0; b < input.size(); ++b) {
                const bool mine = b >= offsets[rank] * element && b < offsets[rank + 1] * element;
                if (input[b] != pristine[b] && !(call == Call::OutputInInput && mine)) {
                  f.add(fmt::format("{}: input byte {} was modified", what, b));
                  break;
                }
              }
              check_result(f, what, dtype, op, size, output, counts[rank], offsets[rank]);
            }
          }
        }
      }));
    }
  }
}

TEST_CASE("halving_doubling all_reduce sums 6 ranks' float32 exactly on a large prime count",
          "[collectives][all_reduce][halving_doubling]") {
  constexpr size_t kCount = 100'003;  // prime: blocks of unequal size
  report(run_world(6, 0, [&](Transport& transport, int rank, Failures& f) {
    std::vector<float> data(kCount);
    for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>((rank + 1) * (i % 1000));
    collectives::halving_doubling_all_reduce(
        {.transport = transport, .seq = 1, .deadline = test_deadline()}, data.data(), data.data(),
        kCount, DType::Float32, ReduceOp::Sum);
    for (size_t i = 0; i < kCount; ++i) {
      const float want = static_cast<float>(21 * (i % 1000));  // (1+2+...+6) * (i % 1000)
      if (data[i] != want) {
        f.add(fmt::format("rank {} element {}: got {} want {}", rank, i, data[i], want));
        break;
      }
    }
  }));
}

TEST_CASE("halving_doubling all_reduce gives every rank bit-identical float results",
          "[collectives][all_reduce][halving_doubling]") {
  // Inputs whose sums round: the ranks must still agree with each other bit for bit.
  constexpr size_t kCount = 257;
  for (int size : {5, 6, 8}) {
    std::vector<std::vector<float>> results(size);
    report(run_world(size, 0, [&](Transport& transport, int rank, Failures&) {
      std::vector<float> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = 1.0f / static_cast<float>(rank * 31 + i + 3);
      collectives::halving_doubling_all_reduce(
          {.transport = transport, .seq = 1, .deadline = test_deadline()}, data.data(), data.data(),
          kCount, DType::Float32, ReduceOp::Sum);
      results[rank] = data;
    }));
    for (int rank = 1; rank < size; ++rank) {
      INFO(size << " ranks, rank " << rank);
      CHECK(std::memcmp(results[rank].data(), results[0].data(), kCount * sizeof(float)) == 0);
    }
  }
}

struct Outcome {
  ErrorCode code = ErrorCode::Io;
  std::string message;
  bool threw = false;
};

Outcome outcome_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return {e.code(), e.what(), true};
  }
  return {};
}

TEST_CASE(
    "halving_doubling throws Timeout naming the algorithm and step by its deadline when one "
    "rank never joins",
    "[collectives][failure][halving_doubling]") {
  using Body = std::function<void(const Context&, std::vector<float>& in, float* out)>;
  const std::vector<std::pair<std::string, Body>> algorithms = {
      {"halving_doubling all_reduce",
       [](const Context& c, std::vector<float>& in, float* out) {
         collectives::halving_doubling_all_reduce(c, in.data(), out, in.size(), DType::Float32,
                                                  ReduceOp::Sum);
       }},
      {"halving_doubling reduce_scatter",
       [](const Context& c, std::vector<float>& in, float* out) {
         collectives::halving_doubling_reduce_scatter(
             c, in.data(), out, in.size() / c.transport.size(), DType::Float32, ReduceOp::Sum);
       }},
  };
  // 4: no fold; 5 and 6: the folded pairs below wait, through their odd rank, on the missing one.
  for (int size : {4, 5, 6}) {
    for (const auto& [name, body] : algorithms) {
      INFO(name << " on " << size << " ranks, the last missing");
      LocalFabric fabric(size, 0);  // synchronous: a send to the missing rank never completes
      std::vector<Outcome> outcomes(size - 1);
      std::vector<std::thread> threads;
      const auto start = Clock::now();
      for (int rank = 0; rank + 1 < size; ++rank) {
        threads.emplace_back([&, rank] {
          std::vector<float> in(64 * size, 1.0f), out(64 * size, 0.0f);
          outcomes[rank] = outcome_of([&] {
            body({.transport = fabric.transport(rank), .seq = 1, .deadline = Clock::now() + 100ms},
                 in, out.data());
          });
        });
      }
      for (auto& thread : threads) thread.join();
      CHECK(Clock::now() - start < 10s);
      // Every rank depends on every other, so each one times out, saying where.
      for (const Outcome& o : outcomes) {
        INFO(o.message);
        CHECK(o.threw);
        CHECK(o.code == ErrorCode::Timeout);
        CHECK_THAT(o.message, Catch::StartsWith(name) && Catch::Contains(" step "));
      }
    }
  }
}

TEST_CASE("halving_doubling bad arguments throw InvalidArgument before anything is posted",
          "[collectives][failure][halving_doubling]") {
  LocalFabric fabric(2);
  const Context ctx{.transport = fabric.transport(0), .seq = 1, .deadline = Clock::now() + 1s};
  std::vector<int32_t> a(16), b(16);
  auto invalid = [](const std::function<void()>& fn) {
    const Outcome o = outcome_of(fn);
    INFO(o.message);
    return o.code == ErrorCode::InvalidArgument && o.message.find("halving_doubling") == 0;
  };
  using collectives::halving_doubling_all_reduce;
  using collectives::halving_doubling_reduce_scatter;
  CHECK(invalid([&] {  // overlapping but different buffers
    halving_doubling_all_reduce(ctx, a.data(), a.data() + 1, 8, DType::Int32, ReduceOp::Sum);
  }));
  CHECK(invalid([&] {
    halving_doubling_all_reduce(ctx, nullptr, b.data(), 4, DType::Int32, ReduceOp::Sum);
  }));
  CHECK(invalid([&] {
    halving_doubling_all_reduce(ctx, a.data(), b.data(), SIZE_MAX / 2, DType::Int32, ReduceOp::Sum);
  }));
  CHECK(invalid([&] {
    halving_doubling_reduce_scatter(ctx, a.data(), b.data(), std::vector<size_t>{1, 2, 3},
                                    DType::Int32, ReduceOp::Sum);
  }));
  CHECK(invalid([&] {
    halving_doubling_reduce_scatter(ctx, a.data(), nullptr, 4, DType::Int32, ReduceOp::Sum);
  }));
  CHECK(invalid([&] {
    halving_doubling_reduce_scatter(ctx, a.data(), b.data(), 4, static_cast<DType>(99),
                                    ReduceOp::Sum);
  }));
  // Unsupported pairs come from reduce::check_supported, which names the op, not the algorithm.
  CHECK(outcome_of([&] {
          halving_doubling_all_reduce(ctx, a.data(), b.data(), 4, DType::Int32,
                                      ReduceOp::premul_sum(2.0));
        }).code == ErrorCode::InvalidArgument);
}

}  // namespace
}  // namespace weft::test
