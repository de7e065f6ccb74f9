// The nccl backend's watchdog without a device: its Works end on fake end events (a
// DeviceCompletion the test controls), so completion, timeouts, device errors, abort and the
// group-failure record are checked here; tests/nccl/nccl_gpu_test.cc repeats the timeout and abort
// on a real device.
#include "backends/nccl/nccl_watchdog.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "weft/hash_store.h"

#include "backends/common/group_failure.h"

namespace weft::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// An end event that passes when the test says so, or reports a device error.
class FakeEnd final : public DeviceCompletion {
 public:
  bool query() override {
    if (broken) throw Error(ErrorCode::Internal, context, "cudaEventQuery: cuda error 700");
    return passed;
  }
  void block_stream(CudaStream) override {}
  std::atomic<bool> passed{false};
  std::atomic<bool> broken{false};
  ErrorContext context;
};

ErrorContext base() {
  ErrorContext context;
  context.rank = 0;
  context.size = 2;
  context.group = "world";
  return context;
}

ErrorContext op(uint64_t seq) {
  ErrorContext context = base();
  context.op = "all_reduce";
  context.seq = seq;
  return context;
}

// A pending Work for collective #seq, waited on the host (no device semantics: the watchdog is
// what completes it here).
std::shared_ptr<Work> work_for(uint64_t seq, milliseconds timeout = milliseconds(10'000)) {
  return std::make_shared<Work>(op(seq), timeout);
}

std::pair<ErrorCode, std::string> failure_of(const std::shared_ptr<Work>& work) {
  try {
    work->wait(milliseconds(10'000));
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  FAIL("the Work succeeded");
  return {};
}

TEST_CASE("the watchdog completes a Work once its end event passes", "[nccl]") {
  auto store = std::make_shared<HashStore>();
  Watchdog watchdog(store, base(), milliseconds(1));
  CHECK(watchdog.drain(Clock::now()));  // nothing pending
  auto work = work_for(1);
  auto end = std::make_shared<FakeEnd>();
  watchdog.track(work, end, 0, Clock::now() + milliseconds(10'000));
  CHECK_FALSE(work->is_completed());
  CHECK_FALSE(watchdog.drain(Clock::now() + milliseconds(20)));
  end->passed = true;
  work->wait(milliseconds(10'000));
  CHECK(work->is_success());
  CHECK(watchdog.drain(Clock::now() + milliseconds(10'000)));
  CHECK(watchdog.refusal(op(2)) == nullptr);
}

TEST_CASE(
    "a Work past its deadline fails with Timeout, the pending ones with it, and the group "
    "refuses later posts",
    "[nccl]") {
  auto store = std::make_shared<HashStore>();
  Watchdog watchdog(store, base(), milliseconds(1));
  auto late = work_for(1, milliseconds(100));
  auto behind = work_for(2);
  watchdog.track(late, std::make_shared<FakeEnd>(), 0, Clock::now() + milliseconds(100));
  watchdog.track(behind, std::make_shared<FakeEnd>(), 0, Clock::now() + milliseconds(10'000));
  const auto start = Clock::now();
  auto [code, what] = failure_of(late);
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  CHECK(code == ErrorCode::Timeout);
  CHECK(what ==
        "rank 0/2 group \"world\" all_reduce #1: Timeout: did not finish on cuda:0 within "
        "100 ms; the group's NCCL communicators were aborted (a rank is stuck, gone or "
        "issued other collectives; set WEFT_TIMEOUT)");
  auto [behind_code, behind_what] = failure_of(behind);
  CHECK(behind_code == ErrorCode::Timeout);
  CHECK(behind_what ==
        "rank 0/2 group \"world\" all_reduce #2: Timeout: failed with the group: "
        "rank 0/2 group \"world\" all_reduce #1 timed out on cuda:0");
  // Recorded for the other ranks, as the CPU backends do.
  backends::GroupFailure failure(store, 1);
  CHECK(failure.look_up().first == what);
  // Later posts fail at once with the same code.
  std::exception_ptr refusal = watchdog.refusal(op(3));
  REQUIRE(refusal != nullptr);
  auto refused = work_for(3);
  watchdog.track(refused, std::make_shared<FakeEnd>(), 0, Clock::now() + milliseconds(10'000));
  REQUIRE(refused->is_completed());
  auto [refused_code, refused_what] = failure_of(refused);
  CHECK(refused_code == ErrorCode::Timeout);
  CHECK(
      refused_what.starts_with("rank 0/2 group \"world\" all_reduce #3: Timeout: the group's "
                               "NCCL communicators were aborted after an earlier failure: " +
                               what));
  CHECK(watchdog.drain(Clock::now()));
}

TEST_CASE("a device error on an end event fails the group with Internal", "[nccl]") {
  auto store = std::make_shared<HashStore>();
  Watchdog watchdog(store, base(), milliseconds(1));
  auto work = work_for(5);
  auto other = work_for(6);
  auto end = std::make_shared<FakeEnd>();
  end->context = op(5);
  watchdog.track(work, end, 0, Clock::now() + milliseconds(10'000));
  watchdog.track(other, std::make_shared<FakeEnd>(), 0, Clock::now() + milliseconds(10'000));
  end->broken = true;
  auto [code, what] = failure_of(work);
  CHECK(code == ErrorCode::Internal);
  CHECK(what == "rank 0/2 group \"world\" all_reduce #5: Internal: cudaEventQuery: cuda error 700");
  auto [other_code, other_what] = failure_of(other);
  CHECK(other_code == ErrorCode::Internal);
  CHECK(other_what ==
        "rank 0/2 group \"world\" all_reduce #6: Internal: failed with the group: " + what);
}

TEST_CASE("abort fails pending and later Works with Aborted and the reason, once", "[nccl]") {
  auto store = std::make_shared<HashStore>();
  Watchdog watchdog(store, base(), milliseconds(1));
  auto pending = work_for(1);
  watchdog.track(pending, std::make_shared<FakeEnd>(), 0, Clock::now() + milliseconds(10'000));
  const auto start = Clock::now();
  watchdog.abort("shutting down");
  watchdog.abort("a second abort changes nothing");
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  auto [code, what] = failure_of(pending);
  CHECK(code == ErrorCode::Aborted);
  CHECK(what == "rank 0/2 group \"world\" all_reduce #1: Aborted: aborted: shutting down");
  auto later = work_for(2);
  watchdog.track(later, std::make_shared<FakeEnd>(), 0, Clock::now() + milliseconds(10'000));
  auto [later_code, later_what] = failure_of(later);
  CHECK(later_code == ErrorCode::Aborted);
  CHECK(later_what ==
        "rank 0/2 group \"world\" all_reduce #2: Aborted: issued after the group's "
        "nccl backend was aborted: shutting down");
  // A local abort is not a failure of the group for the other ranks.
  CHECK(backends::GroupFailure(store, 1).look_up().first.empty());
}

TEST_CASE("the watchdog's destructor returns with Works still pending", "[nccl]") {
  auto work = work_for(1);
  const auto start = Clock::now();
  {
    Watchdog watchdog(std::make_shared<HashStore>(), base(), milliseconds(1));
    watchdog.track(work, std::make_shared<FakeEnd>(), 0, Clock::now() + milliseconds(10'000));
  }
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  CHECK_FALSE(work->is_completed());  // the backend drains or aborts before; the thread only ends
}

}  // namespace
}  // namespace weft::nccl
