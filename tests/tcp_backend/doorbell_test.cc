// Doorbell: cross-process wake-ups by futex, deadlines, liveness slices, and a ping-pong long
// enough that a lost wake-up would show.
#include "backends/tcp/doorbell.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "tests/support/multiproc.h"
#include "tests/tcp_backend/shm_test_util.h"

namespace weft::tcp {
namespace {

using namespace std::chrono_literals;
using test::Clock;
using test::unique_name;

// Shared by the processes of one test: a doorbell per process, then plain words they exchange.
struct Shared {
  alignas(64) std::byte bells[2][Doorbell::kFootprint];
  alignas(64) std::atomic<uint32_t> flag[2];
  std::atomic<int64_t> rang_at_ns;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

ShmSegment make_shared(const std::string& name) {
  ShmSegment segment = ShmSegment::create(name, sizeof(Shared));
  auto* shared = new (segment.data()) Shared{};
  Doorbell::create(shared->bells[0]);
  Doorbell::create(shared->bells[1]);
  return segment;
}

Shared& open_shared(ShmSegment& segment) {
  return *std::launder(reinterpret_cast<Shared*>(segment.data()));
}

TEST_CASE("a process asleep on its doorbell is woken by another process's ring()",
          "[doorbell][multiproc]") {
  std::string name = unique_name("wake");
  ShmSegment segment = make_shared(name);
  weft::test::run_ranks_ok(
      2,
      [&](int rank) {
        ShmSegment mapped = ShmSegment::open(name);
        Shared& shared = open_shared(mapped);
        Doorbell bell = Doorbell::attach(shared.bells[0]);
        // A round proves the wake-up only if rank 0 really slept: rank 1 rings as soon as rank 0
        // announces its sleep, and rank 0 may still see the flag before it enters the futex
        // (preempted between the two). Rounds repeat until one slept; every round must wake.
        constexpr uint32_t kMaxRounds = 50;
        if (rank == 0) {
          // Slices far longer than the test: only the ring can end this sleep in time.
          bell.set_slice(std::chrono::hours(1));
          for (uint32_t round = 1; round <= kMaxRounds; ++round) {
            const uint64_t slept_before = bell.sleeps();
            bool ready =
                bell.wait([&] { return shared.flag[0].load() == round; }, Clock::now() + 20s, 0ns);
            int64_t woke_ns = now_ns();
            RANK_CHECK(ready, "round {}", round);
            double latency_ms = (woke_ns - shared.rang_at_ns.load()) / 1e6;
            RANK_CHECK(latency_ms < 2000, "round {}: woke {} ms after the ring", round, latency_ms);
            const bool slept = bell.sleeps() > slept_before;
            shared.flag[1].store(slept ? 2 : 1);  // tells rank 1 whether to go on
            if (slept) return;
          }
          RANK_CHECK(false, "never slept in {} rounds: the test proves nothing", kMaxRounds);
        } else {
          for (uint32_t round = 1; round <= kMaxRounds; ++round) {
            // Synchronise on the doorbell itself: ring only once the owner announced its sleep.
            auto deadline = Clock::now() + 20s;
            while (!bell.has_sleeper()) {
              RANK_CHECK(Clock::now() < deadline, "round {}: rank 0 never went to sleep", round);
              std::this_thread::yield();
            }
            shared.flag[1].store(0);
            shared.rang_at_ns.store(now_ns());
            shared.flag[0].store(round);
            bell.ring();
            // Set again only if rank 0, awake, already reported and started the next round.
            const bool sleeper = bell.has_sleeper();
            RANK_CHECK(!sleeper || shared.flag[1].load() != 0, "ring() leaves the flag set");
            while (shared.flag[1].load() == 0) {
              RANK_CHECK(Clock::now() < deadline, "round {}: rank 0 never reported", round);
              std::this_thread::yield();
            }
            if (shared.flag[1].load() == 2) return;
          }
        }
      },
      30s);
}

TEST_CASE("10000 blocking ping-pongs between two processes lose no wake-up",
          "[doorbell][multiproc]") {
  std::string name = unique_name("pingpong");
  ShmSegment segment = make_shared(name);
  const uint32_t rounds = 10000;
  auto start = Clock::now();
  weft::test::run_ranks_ok(
      2,
      [&](int rank) {
        ShmSegment mapped = ShmSegment::open(name);
        Shared& shared = open_shared(mapped);
        Doorbell mine = Doorbell::attach(shared.bells[rank]);
        Doorbell peer = Doorbell::attach(shared.bells[1 - rank]);
        mine.set_slice(std::chrono::hours(1));  // a lost wake-up fails at the deadline
        auto deadline = Clock::now() + 20s;
        // flag[r] counts the balls rank r has received; rank 0 serves first.
        for (uint32_t i = 0; i < rounds; ++i) {
          if (rank == 0) {
            shared.flag[1].store(i + 1, std::memory_order_release);
            peer.ring();
            RANK_CHECK(
                mine.wait([&] { return shared.flag[0].load(std::memory_order_acquire) == i + 1; },
                          deadline, 0ns),
                "round {}: no answer", i);
          } else {
            RANK_CHECK(
                mine.wait([&] { return shared.flag[1].load(std::memory_order_acquire) == i + 1; },
                          deadline, 0ns),
                "round {}: no serve", i);
            shared.flag[0].store(i + 1, std::memory_order_release);
            peer.ring();
          }
        }
        RANK_CHECK(mine.sleeps() > 0, "never slept: the test proves nothing");
      },
      30s);
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / rounds;
  WARN("10000 blocking round trips: " << us << " us each, process start-up included");
}

TEST_CASE("wait() returns false at its deadline, within a small tolerance", "[doorbell]") {
  std::string name = unique_name("deadline");
  ShmSegment segment = make_shared(name);
  Doorbell bell = Doorbell::attach(open_shared(segment).bells[0]);
  for (auto spin : {0ns, std::chrono::nanoseconds(10s)}) {  // a spin budget past the deadline too
    INFO("spin budget " << spin.count() << " ns");
    auto start = Clock::now();
    bool ready = bell.wait([] { return false; }, start + 120ms, spin);
    auto elapsed = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    CHECK_FALSE(ready);
    CHECK(elapsed >= 120);
    CHECK(elapsed < 120 + 100);       // scheduling on a loaded two-core machine
    CHECK_FALSE(bell.has_sleeper());  // the flag is cleared on the way out
  }
}

TEST_CASE(
    "wait() calls on_slice() every slice while it sleeps, and an exception from it ends "
    "the wait",
    "[doorbell]") {
  std::string name = unique_name("slice");
  ShmSegment segment = make_shared(name);
  Doorbell bell = Doorbell::attach(open_shared(segment).bells[0]);
  bell.set_slice(10ms);
  int calls = 0;
  auto start = Clock::now();
  try {
    bell.wait([] { return false; }, start + 10s, 0ns,
              [&] {
                if (++calls == 3) throw_error(ErrorCode::PeerLost, "test", "rank 1 gone");
              });
    FAIL("wait() returned");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::PeerLost);
  }
  auto elapsed = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  CHECK(calls == 3);
  CHECK(elapsed >= 30);
  CHECK(elapsed < 1000);
  CHECK_FALSE(bell.has_sleeper());
}

TEST_CASE("a condition already true returns at once without sleeping", "[doorbell]") {
  std::string name = unique_name("ready");
  ShmSegment segment = make_shared(name);
  Doorbell bell = Doorbell::attach(open_shared(segment).bells[0]);
  CHECK(bell.wait([] { return true; }, Clock::now() - 1s, 0ns));  // even past the deadline
  CHECK(bell.sleeps() == 0);
  bell.ring();  // nobody sleeps: nothing to do
  CHECK_FALSE(bell.has_sleeper());
}

TEST_CASE("attach refuses memory that holds no doorbell", "[doorbell]") {
  alignas(64) std::byte memory[Doorbell::kFootprint] = {};
  CHECK_THROWS_AS(Doorbell::attach(memory), Error);
  CHECK_THROWS_AS(Doorbell::create(memory + 8), Error);
}

TEST_CASE("the spin budget is zero when ranks outnumber cores", "[doorbell]") {
  unsigned cores = std::thread::hardware_concurrency();
  CHECK(spin_budget_for(static_cast<int>(cores) + 1).count() == 0);
  CHECK(spin_budget_for(1, 5us) == 5us);
}

}  // namespace
}  // namespace weft::tcp
