// How the algorithms fail: a rank that never joins (Timeout), an abort (Aborted / PeerLost), ranks
// that disagree (Protocol), and bad arguments (InvalidArgument, before anything is sent).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "collectives/binomial_tree.h"
#include "collectives/bruck.h"
#include "collectives/dissemination.h"
#include "collectives/gather_scatter.h"
#include "collectives/local_transport.h"
#include "collectives/pairwise.h"
#include "collectives/recursive_doubling.h"
#include "collectives/ring.h"

namespace weft::collectives {
namespace {

using namespace std::chrono_literals;

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

// Runs `body` on ranks 0..size-2 of a group of `size`: the last rank never joins. Sends are
// synchronous (eager limit 0), so a send to the missing rank never completes either.
std::vector<Outcome> run_without_last(int size, const std::function<void(Transport&)>& body) {
  LocalFabric fabric(size, 0);
  std::vector<Outcome> outcomes(size - 1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank + 1 < size; ++rank) {
    threads.emplace_back(
        [&, rank] { outcomes[rank] = outcome_of([&] { body(fabric.transport(rank)); }); });
  }
  for (auto& thread : threads) thread.join();
  return outcomes;
}

TEST_CASE("every algorithm throws Timeout by its deadline when one rank never joins",
          "[collectives][failure]") {
  // Each rank passes its own buffers: in holds 64 floats, out 4 * 64.
  using Algorithm = std::function<void(const Context&, float* in, float* out)>;
  const std::vector<std::pair<const char*, Algorithm>> algorithms = {
      {"ring all_reduce",
       [](const Context& c, float* in, float* out) {
         ring_all_reduce(c, in, out, 64, DType::Float32, ReduceOp::Sum, 16);
       }},
      {"recursive_doubling all_reduce",
       [](const Context& c, float* in, float* out) {
         recursive_doubling_all_reduce(c, in, out, 64, DType::Float32, ReduceOp::Sum);
       }},
      {"ring reduce_scatter",
       [](const Context& c, float* in, float* out) {
         ring_reduce_scatter(c, out, in, 16, DType::Float32, ReduceOp::Sum);
       }},
      {"ring all_gather", [](const Context& c, float* in,
                             float* out) { ring_all_gather(c, in, out, 16, DType::Float32); }},
      {"bruck all_gather", [](const Context& c, float* in,
                              float* out) { bruck_all_gather(c, in, out, 16, DType::Float32); }},
      {"binomial broadcast",
       [](const Context& c, float* in, float*) { binomial_broadcast(c, in, 64, 0); }},
      {"binomial reduce",
       [](const Context& c, float* in, float* out) {
         binomial_reduce(c, in, out, 64, DType::Float32, ReduceOp::Sum, 0);
       }},
      {"linear gather", [](const Context& c, float* in,
                           float* out) { linear_gather(c, in, out, 16, DType::Float32, 0); }},
      {"linear scatter", [](const Context& c, float* in,
                            float* out) { linear_scatter(c, out, in, 16, DType::Float32, 0); }},
      {"pairwise all_to_all",
       [](const Context& c, float*, float* out) {
         pairwise_all_to_all(c, out, out, 16, DType::Float32);
       }},
      {"dissemination barrier", [](const Context& c, float*, float*) { dissemination_barrier(c); }},
  };
  for (const auto& [name, algorithm] : algorithms) {
    INFO(name);
    const auto start = Clock::now();
    const std::vector<Outcome> outcomes = run_without_last(4, [&](Transport& t) {
      std::vector<float> in(64, 1.0f), out(64 * 4, 0.0f);
      algorithm({.transport = t, .seq = 1, .deadline = Clock::now() + 100ms}, in.data(),
                out.data());
    });
    CHECK(Clock::now() - start < 10s);
    // Ranks that do not depend on the missing one may finish (rank 1 of a broadcast from 0);
    // every one that throws must time out, naming the algorithm, and someone must.
    int timeouts = 0;
    for (const Outcome& o : outcomes) {
      if (!o.threw) continue;
      INFO(o.message);
      CHECK(o.code == ErrorCode::Timeout);
      CHECK_THAT(o.message, Catch::StartsWith(name));
      ++timeouts;
    }
    CHECK(timeouts >= 1);
  }
}

TEST_CASE(
    "abort during all_reduce fails the aborted rank with Aborted and its peer with "
    "PeerLost long before the deadline",
    "[collectives][failure]") {
  LocalFabric fabric(3);
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  std::vector<Outcome> outcomes(2);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int rank = 0; rank < 2; ++rank) {  // rank 2 never joins, so both block
    threads.emplace_back([&, rank] {
      std::vector<int32_t> data(100, rank);
      {
        std::lock_guard lock(mu);
        ++entered;
      }
      cv.notify_all();
      outcomes[rank] = outcome_of([&] {
        ring_all_reduce(
            {.transport = fabric.transport(rank), .seq = 1, .deadline = Clock::now() + 60s},
            data.data(), data.data(), data.size(), DType::Int32, ReduceOp::Sum, 8);
      });
    });
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered == 2; });
  }
  fabric.transport(0).abort("operator pulled the plug");
  for (auto& thread : threads) thread.join();
  CHECK(Clock::now() - start < 30s);
  INFO(outcomes[0].message);
  INFO(outcomes[1].message);
  CHECK(outcomes[0].code == ErrorCode::Aborted);
  CHECK_THAT(outcomes[0].message, Catch::Contains("operator pulled the plug"));
  CHECK(outcomes[1].code == ErrorCode::PeerLost);  // its left neighbour is rank 0
  CHECK_THAT(outcomes[1].message, Catch::Contains("rank 0 aborted"));
}

TEST_CASE("all_to_all ranks that disagree on split sizes fail with Protocol, not a hang",
          "[collectives][failure]") {
  LocalFabric fabric(2, 0);
  std::vector<Outcome> outcomes(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<int32_t> in(8, rank), out(8, -1);
      // Rank 0 sends rank 1 three elements; rank 1 expects five.
      const std::vector<size_t> send =
          rank == 0 ? std::vector<size_t>{1, 3} : std::vector<size_t>{2, 2};
      const std::vector<size_t> recv =
          rank == 0 ? std::vector<size_t>{1, 2} : std::vector<size_t>{5, 2};
      outcomes[rank] = outcome_of([&] {
        pairwise_all_to_all(
            {.transport = fabric.transport(rank), .seq = 1, .deadline = Clock::now() + 20s},
            in.data(), out.data(), send, recv, DType::Int32);
      });
    });
  }
  for (auto& thread : threads) thread.join();
  for (const Outcome& o : outcomes) {
    INFO(o.message);
    CHECK(o.code == ErrorCode::Protocol);
  }
}

TEST_CASE("bad arguments throw InvalidArgument before anything is posted",
          "[collectives][failure]") {
  LocalFabric fabric(2);
  const Context ctx{.transport = fabric.transport(0), .seq = 1, .deadline = Clock::now() + 1s};
  std::vector<int32_t> a(16), b(16);
  auto invalid = [](const std::function<void()>& fn) {
    return outcome_of(fn).code == ErrorCode::InvalidArgument;
  };
  CHECK(invalid([&] { binomial_broadcast(ctx, a.data(), 4, 2); }));
  CHECK(invalid(
      [&] { binomial_reduce(ctx, a.data(), b.data(), 4, DType::Int32, ReduceOp::Sum, -1); }));
  CHECK(invalid([&] { linear_gather(ctx, a.data(), b.data(), 4, DType::Int32, 5); }));
  CHECK(invalid([&] {
    ring_all_reduce(ctx, a.data(), b.data(), 4, DType::Int32, ReduceOp::premul_sum(2.0));
  }));
  CHECK(invalid([&] {
    recursive_doubling_all_reduce(ctx, nullptr, b.data(), 4, DType::Int32, ReduceOp::Sum);
  }));
  CHECK(invalid([&] {  // overlapping but different buffers
    ring_all_reduce(ctx, a.data(), a.data() + 1, 8, DType::Int32, ReduceOp::Sum);
  }));
  CHECK(invalid(
      [&] { ring_all_reduce(ctx, a.data(), b.data(), 4, DType::Int32, ReduceOp::Sum, 0); }));
  CHECK(invalid([&] {
    ring_all_gather(ctx, a.data(), b.data(), std::vector<size_t>{1, 2, 3}, DType::Int32);
  }));
  CHECK(invalid([&] {
    ring_reduce_scatter(ctx, a.data(), b.data(), 4, static_cast<DType>(99), ReduceOp::Sum);
  }));
  CHECK(invalid([&] {
    pairwise_all_to_all(ctx, a.data(), b.data(), std::vector<size_t>{1, 1},
                        std::vector<size_t>{2, 1}, DType::Int32);  // rank 0 to itself: 1 vs 2
  }));
  CHECK(invalid([&] { bruck_all_gather(ctx, a.data(), b.data(), SIZE_MAX / 2, DType::Int32); }));
}

}  // namespace
}  // namespace weft::collectives
