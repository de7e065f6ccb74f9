#include "weft/work.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/config.h"
#include "weft/error.h"

#include "tests/work/gate.h"

namespace weft {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using testing::Gate;

ErrorContext all_reduce_context() {
  return ErrorContext{
      .rank = 2, .size = 4, .group = "dp", .op = "all_reduce", .seq = 17, .op_detail = {}};
}

// The message and code of the weft::Error that `fn` throws; fails the test if it throws
// anything else or nothing.
template <typename Fn>
Error caught_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected a weft::Error");
  return Error(ErrorCode::Io, "unreachable");
}

TEST_CASE("a pending Work is neither completed nor successful and has no exception", "[work]") {
  Work work(all_reduce_context(), milliseconds(1000));
  CHECK_FALSE(work.is_completed());
  CHECK_FALSE(work.is_success());
  CHECK(work.exception() == nullptr);
  CHECK(work.timeout() == milliseconds(1000));
  CHECK(work.context().describe() == "rank 2/4 group \"dp\" all_reduce #17");
}

TEST_CASE("a Work created with the default timeout takes WEFT_TIMEOUT's value", "[work]") {
  Work work(ErrorContext{});
  CHECK(work.timeout() == config().timeout);
}

TEST_CASE("a negative timeout other than kDefaultTimeout is refused as InvalidArgument", "[work]") {
  CHECK(caught_error([] { Work work(all_reduce_context(), milliseconds(-5)); }).code() ==
        ErrorCode::InvalidArgument);
  Work work(all_reduce_context(), milliseconds(1000));
  Error e = caught_error([&] { work.wait(milliseconds(-2)); });
  CHECK(e.code() == ErrorCode::InvalidArgument);
  CHECK_THAT(e.what(), Catch::Contains("all_reduce #17") && Catch::Contains("-2 ms"));
}

TEST_CASE("complete() from another thread wakes every thread blocked in wait()",
          "[work][threads]") {
  // Repeated so that some rounds certainly block before the completion arrives; a missing wake-up
  // would turn into a Timeout after 10 s.
  constexpr int kRounds = 50;
  constexpr int kWaiters = 4;
  for (int round = 0; round < kRounds; ++round) {
    auto work = std::make_shared<Work>(all_reduce_context(), milliseconds(10'000));
    std::atomic<int> woken{0};
    std::vector<std::thread> waiters;
    for (int i = 0; i < kWaiters; ++i) {
      waiters.emplace_back([&] {
        work->wait();
        woken.fetch_add(1);
      });
    }
    std::thread completer([&] { work->complete(); });
    completer.join();
    for (auto& t : waiters) t.join();
    REQUIRE(woken.load() == kWaiters);
    REQUIRE(work->is_success());
  }
}

TEST_CASE(
    "wait past its timeout throws Timeout naming rank, group, op and seq, and the Work "
    "completes later",
    "[work][threads]") {
  auto work = std::make_shared<Work>(all_reduce_context(), milliseconds(50));
  auto start = Clock::now();
  Error e = caught_error([&] { work->wait(); });
  auto waited = Clock::now() - start;
  CHECK(e.code() == ErrorCode::Timeout);
  CHECK(waited >= milliseconds(50));
  CHECK(waited < milliseconds(5000));
  CHECK_THAT(e.what(), Catch::StartsWith("rank 2/4 group \"dp\" all_reduce #17: Timeout: "));
  CHECK_THAT(e.what(), Catch::Contains("did not complete within 50 ms"));
  CHECK_FALSE(work->is_completed());

  std::thread completer([&] { work->complete(); });
  work->wait(milliseconds(10'000));
  completer.join();
  CHECK(work->is_success());
}

TEST_CASE("wait(0) checks once: Timeout while pending, success once completed", "[work]") {
  Work work(all_reduce_context(), milliseconds(10'000));
  Error e = caught_error([&] { work.wait(milliseconds(0)); });
  CHECK(e.code() == ErrorCode::Timeout);
  CHECK_THAT(e.what(), Catch::Contains("within 0 ms"));
  work.complete();
  work.wait(milliseconds(0));
}

TEST_CASE("a timeout too large to add to the clock waits without overflowing", "[work][threads]") {
  auto work = std::make_shared<Work>(all_reduce_context(), milliseconds::max());
  std::thread completer([&] { work->complete(); });
  work->wait();
  work->wait(milliseconds::max());
  completer.join();
  CHECK(work->is_success());
}

TEST_CASE("a failed Work rethrows the exact Error, code and message, to every waiter",
          "[work][threads]") {
  auto work = std::make_shared<Work>(all_reduce_context(), milliseconds(10'000));
  const Error original(ErrorCode::PeerLost, work->context(), "rank 1 gone at ring step 3/6");
  std::vector<std::string> messages(3);
  std::vector<ErrorCode> codes(3, ErrorCode::Io);
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < messages.size(); ++i) {
    waiters.emplace_back([&, i] {
      Error e = caught_error([&] { work->wait(); });
      messages[i] = e.what();
      codes[i] = e.code();
    });
  }
  std::thread failer([&] { work->fail(std::make_exception_ptr(original)); });
  failer.join();
  for (auto& t : waiters) t.join();
  for (size_t i = 0; i < messages.size(); ++i) {
    CHECK(codes[i] == ErrorCode::PeerLost);
    CHECK(messages[i] ==
          "rank 2/4 group \"dp\" all_reduce #17: PeerLost: rank 1 gone at ring step 3/6");
  }
  CHECK(work->is_completed());
  CHECK_FALSE(work->is_success());
  REQUIRE(work->exception() != nullptr);
  Error stored = caught_error([&] { std::rethrow_exception(work->exception()); });
  CHECK(stored.what() == std::string(original.what()));
}

TEST_CASE("a Work failed with a non-weft exception rethrows that exception unchanged", "[work]") {
  Work work(all_reduce_context(), milliseconds(1000));
  work.fail(std::make_exception_ptr(std::out_of_range("index 9 past 8")));
  CHECK_THROWS_MATCHES(work.wait(), std::out_of_range, Catch::Message("index 9 past 8"));
}

TEST_CASE("completing a Work twice, or failing it with no error, is an internal check failure",
          "[work]") {
  Work succeeded(all_reduce_context(), milliseconds(1000));
  succeeded.complete();
  CHECK_THROWS_AS(succeeded.complete(), std::logic_error);
  CHECK_THROWS_AS(succeeded.fail(std::make_exception_ptr(std::runtime_error("late"))),
                  std::logic_error);
  CHECK(succeeded.is_success());
  CHECK(succeeded.exception() == nullptr);

  Work failed(all_reduce_context(), milliseconds(1000));
  failed.fail(std::make_exception_ptr(std::runtime_error("first")));
  CHECK_THROWS_AS(failed.complete(), std::logic_error);
  CHECK_THROWS_MATCHES(failed.wait(), std::runtime_error, Catch::Message("first"));

  Work pending(all_reduce_context(), milliseconds(1000));
  CHECK_THROWS_AS(pending.fail(nullptr), std::logic_error);
  CHECK_FALSE(pending.is_completed());
}

TEST_CASE(
    "callbacks registered before completion run once each, in order, on the completing "
    "thread",
    "[work][threads]") {
  auto work = std::make_shared<Work>(all_reduce_context(), milliseconds(1000));
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 3; ++i) {
    work->on_complete([&, i](const Work& done) {
      CHECK(done.is_success());
      CHECK(&done == work.get());
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  }
  CHECK(order.empty());
  std::thread::id completer_id;
  std::thread completer([&] {
    completer_id = std::this_thread::get_id();
    work->complete();
  });
  completer.join();
  CHECK(order == std::vector<int>{0, 1, 2});
  REQUIRE(threads.size() == 3);
  for (auto id : threads) CHECK(id == completer_id);
}

TEST_CASE("a callback registered after completion runs at once on the registering thread",
          "[work]") {
  Work work(all_reduce_context(), milliseconds(1000));
  work.fail(std::make_exception_ptr(Error(ErrorCode::Desync, "mismatch")));
  int calls = 0;
  std::thread::id ran_on;
  work.on_complete([&](const Work& done) {
    ++calls;
    ran_on = std::this_thread::get_id();
    CHECK_FALSE(done.is_success());
  });
  CHECK(calls == 1);
  CHECK(ran_on == std::this_thread::get_id());
}

TEST_CASE("a throwing callback neither reaches the completer nor stops later callbacks", "[work]") {
  Work work(all_reduce_context(), milliseconds(1000));
  int later_calls = 0;
  work.on_complete([](const Work&) { throw std::runtime_error("callback bug"); });
  work.on_complete([](const Work&) { throw 42; });
  work.on_complete([&](const Work&) { ++later_calls; });
  CHECK_NOTHROW(work.complete());
  CHECK(later_calls == 1);
  CHECK_NOTHROW(work.on_complete([](const Work&) { throw std::runtime_error("late bug"); }));
  CHECK(work.is_success());
}

TEST_CASE("callbacks registered while another thread completes run exactly once each",
          "[work][threads]") {
  constexpr int kRounds = 200;
  for (int round = 0; round < kRounds; ++round) {
    auto work = std::make_shared<Work>(all_reduce_context(), milliseconds(1000));
    std::atomic<int> calls{0};
    Gate go;
    std::thread completer([&] {
      go.wait();
      work->complete();
    });
    go.open();
    for (int i = 0; i < 10; ++i) work->on_complete([&](const Work&) { calls.fetch_add(1); });
    completer.join();
    REQUIRE(calls.load() == 10);
  }
}

TEST_CASE("Work::completed() is already successful and Work::failed() already failed", "[work]") {
  auto done = Work::completed(all_reduce_context());
  CHECK(done->is_completed());
  CHECK(done->is_success());
  done->wait(milliseconds(0));
  CHECK(done->context().seq == 17);

  auto refused = Work::failed(all_reduce_context(),
                              std::make_exception_ptr(Error(ErrorCode::Aborted, "group aborted")));
  CHECK(refused->is_completed());
  CHECK_FALSE(refused->is_success());
  CHECK(caught_error([&] { refused->wait(); }).code() == ErrorCode::Aborted);
  CHECK_THROWS_AS(Work::failed(ErrorContext{}, nullptr), std::logic_error);
}

TEST_CASE("wait_all returns once every Work has succeeded", "[work][threads]") {
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 8; ++i) works.push_back(std::make_shared<Work>(ErrorContext{}));
  std::thread completer([&] {
    // Reverse order: wait_all must not depend on the order completions arrive in.
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->complete();
  });
  wait_all(works, milliseconds(10'000));
  completer.join();
  for (const auto& work : works) CHECK(work->is_success());
  wait_all({});
}

TEST_CASE("wait_all throws the first failure in list order", "[work]") {
  std::vector<std::shared_ptr<Work>> works{
      Work::completed(),
      Work::failed({}, std::make_exception_ptr(Error(ErrorCode::PeerLost, "first"))),
      Work::failed({}, std::make_exception_ptr(Error(ErrorCode::Desync, "second")))};
  Error e = caught_error([&] { wait_all(works); });
  CHECK(e.code() == ErrorCode::PeerLost);
  CHECK(std::string(e.what()) == "first");
}

TEST_CASE("wait_all throws Timeout naming the first Work still pending at the shared deadline",
          "[work]") {
  ErrorContext second = all_reduce_context();
  second.seq = 18;
  std::vector<std::shared_ptr<Work>> works{Work::completed(all_reduce_context()),
                                           std::make_shared<Work>(second, milliseconds(30)),
                                           std::make_shared<Work>(ErrorContext{})};
  auto start = Clock::now();
  Error e = caught_error([&] { wait_all(works); });
  CHECK(Clock::now() - start < milliseconds(5000));
  CHECK(e.code() == ErrorCode::Timeout);
  CHECK_THAT(e.what(), Catch::StartsWith("rank 2/4 group \"dp\" all_reduce #18: Timeout: "));

  Error explicit_timeout = caught_error([&] { wait_all(works, milliseconds(0)); });
  CHECK_THAT(explicit_timeout.what(), Catch::Contains("#18") && Catch::Contains("within 0 ms"));
}

TEST_CASE("wait_all refuses a null entry and a negative timeout as InvalidArgument", "[work]") {
  std::vector<std::shared_ptr<Work>> works{Work::completed(), nullptr};
  Error null_entry = caught_error([&] { wait_all(works); });
  CHECK(null_entry.code() == ErrorCode::InvalidArgument);
  CHECK_THAT(null_entry.what(), Catch::Contains("entry 1 of 2"));
  CHECK(caught_error([&] { wait_all({}, milliseconds(-3)); }).code() == ErrorCode::InvalidArgument);
}

// ---- then() and get_future(): c10d's Future habits.

TEST_CASE("then() runs the callback on completion and its Work completes after it, in chains",
          "[work][then]") {
  auto work = std::make_shared<Work>(all_reduce_context(), milliseconds(5000));
  std::vector<int> order;
  auto first = work->then([&](const Work& w) {
    REQUIRE(w.is_success());
    order.push_back(1);
  });
  auto second = first->then([&](const Work& w) {
    REQUIRE(w.is_success());
    order.push_back(2);
  });
  CHECK_FALSE(first->is_completed());
  CHECK(order.empty());
  std::thread completer([&] { work->complete(); });
  second->wait();
  completer.join();
  CHECK(order == std::vector<int>{1, 2});
  CHECK(first->is_success());
  CHECK(first->context().seq == 17);
  CHECK(first->timeout() == milliseconds(5000));
  // On a completed Work the callback runs at once, on this thread.
  int ran = 0;
  auto late = work->then([&](const Work&) { ++ran; });
  CHECK(ran == 1);
  CHECK(late->is_success());
}

TEST_CASE("then(): the callback sees a failure; w.wait() passes it on, a throw fails the next Work",
          "[work][then]") {
  auto work = std::make_shared<Work>(all_reduce_context(), milliseconds(5000));
  // Passing the failure on: wait() in the callback rethrows the same error.
  auto passed = work->then([](const Work& w) { w.wait(); });
  // Handling it: the callback returns, so the next Work succeeds (c10d's semantics).
  bool saw_failure = false;
  auto handled = work->then([&](const Work& w) { saw_failure = !w.is_success(); });
  work->fail(
      std::make_exception_ptr(Error(ErrorCode::PeerLost, all_reduce_context(), "rank 1 gone")));
  Error e = caught_error([&] { passed->wait(); });
  CHECK(e.code() == ErrorCode::PeerLost);
  CHECK(std::string(e.what()) == "rank 2/4 group \"dp\" all_reduce #17: PeerLost: rank 1 gone");
  CHECK(saw_failure);
  CHECK(handled->is_success());
  // A callback that throws on success fails the next Work with what it threw.
  auto ok = Work::completed(all_reduce_context());
  auto thrown = ok->then([](const Work&) { throw std::runtime_error("checksum mismatch"); });
  REQUIRE(thrown->is_completed());
  CHECK_FALSE(thrown->is_success());
  CHECK_THROWS_WITH(thrown->wait(), "checksum mismatch");
}

TEST_CASE("get_future() is ready on completion and rethrows the Work's error", "[work][then]") {
  auto work = std::make_shared<Work>(all_reduce_context(), milliseconds(5000));
  std::shared_future<void> future = work->get_future();
  CHECK(future.wait_for(milliseconds(0)) == std::future_status::timeout);
  std::thread completer([&] { work->complete(); });
  future.get();
  completer.join();
  CHECK(work->is_success());

  auto failing = std::make_shared<Work>(all_reduce_context(), milliseconds(5000));
  std::shared_future<void> bad = failing->get_future();
  failing->fail(std::make_exception_ptr(Error(ErrorCode::Timeout, all_reduce_context(), "late")));
  Error e = caught_error([&] { bad.get(); });
  CHECK(e.code() == ErrorCode::Timeout);
  CHECK(std::string(e.what()) == "rank 2/4 group \"dp\" all_reduce #17: Timeout: late");
}

}  // namespace
}  // namespace weft
