// tests/store/store_contract.h: the behaviour every weft::Store must have, as one body of tests.
//
// Instantiate it once per store type, in a test file of that store's area:
//
//   struct HashStoreFixture {
//     std::shared_ptr<weft::HashStore> store = std::make_shared<weft::HashStore>();
//     std::shared_ptr<weft::Store> client() { return store; }
//   };
//   WEFT_STORE_CONTRACT_TESTS(HashStoreFixture, "HashStore", "[hash_store]")
//
// The fixture is default-constructible and owns one fresh store (and whatever serves it: a
// TcpStoreServer, a temporary file). client() returns a handle on that store: a new connection or
// object per call where the store has such (TCPStore, FileStore), the same object otherwise.
// Every TEST_CASE builds its own fixture, so checks never see each other's keys, and each test's
// name starts with the store's name, so a failure reads "FileStore: get waits until ...".
//
// Semantics checked are include/weft/store.h's (c10d's), nothing implementation-specific:
// counts are checked as differences, since a store may hold keys of its own.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/store.h"

namespace weft::test::store_contract {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ClientFactory = std::function<std::shared_ptr<Store>()>;

// Long enough never to expire on a loaded 2-core machine when the awaited event does happen.
constexpr auto kLongWait = 10s;
// Short timeouts for checks that expect one to expire.
constexpr auto kShortWait = 200ms;
// How long a store may overrun a timeout before the check calls it a hang: generous, because the
// test machine is shared.
constexpr auto kOverrun = 5s;
// How long a waiter must stay blocked while its keys are absent, to show that it waits.
constexpr auto kStillBlocked = 50ms;

inline Bytes bytes(std::string_view text) { return to_bytes(text); }

// n bytes of a fixed pseudo-random sequence (xorshift32), zeros included.
inline Bytes pattern(size_t n, uint32_t seed) {
  Bytes out(n);
  uint32_t x = seed | 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

// Runs call, which must throw Error(Timeout) after about `timeout`, its message naming each of
// `named`.
inline void require_timeout(const std::function<void()>& call, std::chrono::milliseconds timeout,
                            const std::vector<std::string>& named) {
  auto start = Clock::now();
  try {
    call();
    FAIL("expected Error(Timeout), but the call returned");
  } catch (const Error& e) {
    auto elapsed = Clock::now() - start;
    INFO("message: " << e.what());
    CHECK(e.code() == ErrorCode::Timeout);
    for (const auto& text : named) CHECK_THAT(e.what(), Catch::Contains(text));
    CHECK(elapsed >= timeout);
    CHECK(elapsed < timeout + kOverrun);
  }
}

// The checks, one per TEST_CASE of WEFT_STORE_CONTRACT_TESTS.

inline void set_get_round_trip(const ClientFactory& make) {
  auto store = make();
  Bytes binary(256);
  std::iota(binary.begin(), binary.end(), 0);  // every byte value, NUL first
  Bytes large = pattern(1 << 20, 7);
  store->set("empty", Bytes{});
  store->set("binary", binary);
  store->set("large", large);
  store->set("text", std::string_view("hello"));
  CHECK(store->get("empty", kLongWait).empty());
  CHECK(store->get("binary", kLongWait) == binary);
  CHECK(store->get("large", kLongWait) == large);
  CHECK(store->get_string("text", kLongWait) == "hello");
  // Another client sees the same values.
  auto other = make();
  CHECK(other->get("large", kLongWait) == large);
  CHECK(other->get("binary", kLongWait) == binary);
}

inline void set_replaces(const ClientFactory& make) {
  auto store = make();
  store->set("k", bytes("first, longer value"));
  store->set("k", bytes("second"));
  CHECK(store->get_string("k", kLongWait) == "second");
}

inline void get_waits_for_set(const ClientFactory& make) {
  auto reader = make();
  auto writer = make();
  auto value = pattern(1000, 3);
  auto got = std::async(std::launch::async, [&] { return reader->get("late", kLongWait); });
  REQUIRE(got.wait_for(kStillBlocked) == std::future_status::timeout);
  writer->set("late", value);
  CHECK(got.get() == value);
}

inline void get_times_out(const ClientFactory& make) {
  auto store = make();
  require_timeout([&] { store->get("never set", kShortWait); }, kShortWait, {"never set"});
  // kDefaultTimeout means the store's own timeout.
  store->set_timeout(kShortWait);
  require_timeout([&] { store->get("never set either"); }, kShortWait, {"never set either"});
}

inline void add_counts(const ClientFactory& make) {
  auto store = make();
  CHECK(store->add("c", 5) == 5);  // absent counts as 0
  CHECK(store->add("c", -7) == -2);
  CHECK(store->add("c", 0) == -2);
  CHECK(store->get_string("c", kLongWait) == "-2");  // decimal text
  store->set("n", std::string_view("40"));
  CHECK(store->add("n", 2) == 42);
  CHECK(make()->add("n", 1'000'000'000'000) == 1'000'000'000'042);
  CHECK(store->get_string("n", kLongWait) == "1000000000042");
}

inline void compare_set_cases(const ClientFactory& make) {
  auto store = make();
  // Absent, expected empty: stores desired.
  CHECK(store->compare_set("a", {}, bytes("one")) == bytes("one"));
  CHECK(store->get("a", kLongWait) == bytes("one"));
  // Absent, expected non-empty: stores nothing, returns expected.
  CHECK(store->compare_set("b", bytes("x"), bytes("y")) == bytes("x"));
  CHECK_FALSE(store->check({"b"}));
  // Present and equal to expected: swaps, returns desired.
  CHECK(store->compare_set("a", bytes("one"), bytes("two")) == bytes("two"));
  CHECK(store->get("a", kLongWait) == bytes("two"));
  // Present and different: keeps it, returns what is stored.
  CHECK(store->compare_set("a", bytes("one"), bytes("three")) == bytes("two"));
  CHECK(store->get("a", kLongWait) == bytes("two"));
}

inline void check_does_not_wait(const ClientFactory& make) {
  auto store = make();
  CHECK_FALSE(store->check({"x"}));
  store->set("x", Bytes{});
  CHECK(store->check({"x"}));
  CHECK_FALSE(store->check({"x", "y"}));
  make()->set("y", bytes("1"));
  CHECK(store->check({"x", "y"}));
}

inline void wait_for_several(const ClientFactory& make) {
  auto waiter = make();
  auto writer = make();
  auto done = std::async(std::launch::async, [&] { waiter->wait({"w1", "w2", "w3"}, kLongWait); });
  writer->set("w2", bytes("2"));
  writer->set("w1", bytes("1"));
  REQUIRE(done.wait_for(kStillBlocked) == std::future_status::timeout);
  writer->set("w3", bytes("3"));
  done.get();
  CHECK(waiter->check({"w1", "w2", "w3"}));
}

inline void wait_times_out_naming_missing(const ClientFactory& make) {
  auto store = make();
  store->set("present", bytes("p"));
  require_timeout([&] { store->wait({"present", "absent"}, kShortWait); }, kShortWait, {"absent"});
}

inline void delete_key_reports_existence(const ClientFactory& make) {
  auto store = make();
  store->set("d", bytes("v"));
  int64_t before = store->num_keys();
  CHECK(store->delete_key("d"));
  CHECK_FALSE(store->check({"d"}));
  CHECK(store->num_keys() == before - 1);
  CHECK_FALSE(store->delete_key("d"));
  CHECK_FALSE(store->delete_key("never existed"));
  require_timeout([&] { store->get("d", kShortWait); }, kShortWait, {"d"});
  store->set("d", bytes("again"));
  CHECK(store->get_string("d", kLongWait) == "again");
}

inline void num_keys_counts(const ClientFactory& make) {
  auto store = make();
  int64_t base = store->num_keys();
  store->set("k1", bytes("1"));
  store->set("k2", bytes("2"));
  CHECK(store->num_keys() == base + 2);
  store->add("k3", 1);
  CHECK(store->num_keys() == base + 3);
  store->set("k1", bytes("replaced"));
  CHECK(store->num_keys() == base + 3);
  store->delete_key("k2");
  CHECK(store->num_keys() == base + 2);
  CHECK(make()->num_keys() == base + 2);
}

inline void append_extends(const ClientFactory& make) {
  auto store = make();
  store->append("ap", bytes("ab"));  // creates
  CHECK(store->get("ap", kLongWait) == bytes("ab"));
  Bytes tail{0, 'c', 0};
  make()->append("ap", tail);
  CHECK(store->get("ap", kLongWait) == Bytes{'a', 'b', 0, 'c', 0});
  store->append("ap", Bytes{});
  CHECK(store->get("ap", kLongWait).size() == 5);
}

inline void multi_set_then_multi_get(const ClientFactory& make) {
  auto store = make();
  auto v3 = pattern(5000, 11);
  store->multi_set({"m1", "m2", "m3"}, {bytes("one"), Bytes{}, v3});
  auto got = make()->multi_get({"m3", "m1", "m2", "m1"}, kLongWait);
  REQUIRE(got.size() == 4);
  CHECK(got[0] == v3);
  CHECK(got[1] == bytes("one"));
  CHECK(got[2].empty());
  CHECK(got[3] == bytes("one"));
  CHECK(store->multi_get({}, kLongWait).empty());
}

inline void multi_get_waits_and_times_out(const ClientFactory& make) {
  auto reader = make();
  auto writer = make();
  auto got = std::async(std::launch::async, [&] {
    return reader->multi_get({"g1", "g2"}, kLongWait);
  });
  writer->set("g1", bytes("first"));
  REQUIRE(got.wait_for(kStillBlocked) == std::future_status::timeout);
  writer->set("g2", bytes("second"));
  CHECK(got.get() == std::vector<Bytes>{bytes("first"), bytes("second")});
  require_timeout([&] { reader->multi_get({"g1", "g9"}, kShortWait); }, kShortWait, {"g9"});
}

inline void queue_is_fifo(const ClientFactory& make) {
  auto store = make();
  CHECK(store->queue_len("fifo") == 0);
  store->queue_push("fifo", bytes("a"));
  make()->queue_push("fifo", Bytes{0, 1});
  store->queue_push("fifo", Bytes{});
  CHECK(store->queue_len("fifo") == 3);
  CHECK(store->queue_pop("fifo", false) == bytes("a"));
  CHECK(make()->queue_pop("fifo", true, kLongWait) == Bytes{0, 1});
  CHECK(store->queue_len("fifo") == 1);
  CHECK(store->queue_pop("fifo") == Bytes{});
  CHECK(store->queue_len("fifo") == 0);
  // Non-blocking pop on an empty queue fails at once.
  auto start = Clock::now();
  try {
    store->queue_pop("fifo", false);
    FAIL("queue_pop(block=false) on an empty queue returned");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Timeout);
    CHECK_THAT(e.what(), Catch::Contains("fifo\""));
  }
  CHECK(Clock::now() - start < kOverrun);
}

inline void queue_pop_waits_for_push(const ClientFactory& make) {
  auto popper = make();
  auto pusher = make();
  auto got =
      std::async(std::launch::async, [&] { return popper->queue_pop("jobs", true, kLongWait); });
  REQUIRE(got.wait_for(kStillBlocked) == std::future_status::timeout);
  pusher->queue_push("jobs", bytes("job 1"));
  CHECK(got.get() == bytes("job 1"));
  CHECK(pusher->queue_len("jobs") == 0);
  require_timeout([&] { popper->queue_pop("jobs", true, kShortWait); }, kShortWait, {"jobs"});
}

inline void queues_apart_from_keys(const ClientFactory& make) {
  auto store = make();
  int64_t base = store->num_keys();
  store->set("both", bytes("value"));
  CHECK(store->queue_len("both") == 0);
  store->queue_push("both", bytes("queued"));
  store->queue_push("only queue", bytes("queued"));
  CHECK(store->num_keys() == base + 1);
  CHECK(store->get("both", kLongWait) == bytes("value"));
  // check() and wait() see a non-empty queue (c10d: a TCPStore's blocking pop relies on it).
  CHECK(store->check({"only queue"}));
  store->wait({"only queue"}, kLongWait);
  CHECK(store->queue_pop("only queue", false) == bytes("queued"));
  CHECK_FALSE(store->check({"only queue"}));
  CHECK(store->delete_key("both"));
  CHECK(store->queue_len("both") == 1);
}

inline void concurrent_adds_sum_exactly(const ClientFactory& make) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 200;
  std::vector<std::shared_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) clients.push_back(make());
  std::vector<std::future<std::vector<int64_t>>> results;
  for (int t = 0; t < kThreads; ++t) {
    results.push_back(std::async(std::launch::async, [&clients, t] {
      std::vector<int64_t> seen;
      for (int i = 0; i < kAddsPerThread; ++i) seen.push_back(clients[t]->add("counter", 1));
      return seen;
    }));
  }
  std::vector<int64_t> all;
  for (auto& result : results) {
    auto seen = result.get();
    all.insert(all.end(), seen.begin(), seen.end());
  }
  // Every add returned a distinct value: 1..N, each once.
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kThreads * kAddsPerThread);
  std::iota(expected.begin(), expected.end(), 1);
  CHECK(all == expected);
  CHECK(make()->get_string("counter", kLongWait) == std::to_string(kThreads * kAddsPerThread));
}

}  // namespace weft::test::store_contract

// Defines one TEST_CASE per check above for the store that Fixture makes (see the top of this
// file). name and tags must be string literals.
#define WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, check, sentence)     \
  TEST_CASE(name ": " sentence, "[store][contract]" tags) {                \
    Fixture fixture;                                                       \
    ::weft::test::store_contract::check([&] { return fixture.client(); }); \
  }

#define WEFT_STORE_CONTRACT_TESTS(Fixture, name, tags)                                            \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, set_get_round_trip,                               \
                           "set then get returns the same bytes: empty, binary with NULs, 1 MiB") \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, set_replaces, "set replaces an earlier value")    \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, get_waits_for_set,                                \
                           "get waits until another client sets the key")                         \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, get_times_out,                                    \
                           "get of a missing key throws Timeout naming it after the timeout")     \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, add_counts,                                       \
                           "add counts from 0, takes negatives and stores decimal text")          \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, compare_set_cases,                                \
                           "compare_set follows c10d in all three cases")                         \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, check_does_not_wait,                              \
                           "check is true only when every key exists")                            \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, wait_for_several,                                 \
                           "wait returns once the last of several keys is set")                   \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, wait_times_out_naming_missing,                    \
                           "wait throws Timeout naming the missing key")                          \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, delete_key_reports_existence,                     \
                           "delete_key removes a key and reports whether it existed")             \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, num_keys_counts,                                  \
                           "num_keys counts new keys and drops deleted ones")                     \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, append_extends,                                   \
                           "append creates a key then extends its bytes")                         \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, multi_set_then_multi_get,                         \
                           "multi_get returns multi_set's values in the order asked")             \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, multi_get_waits_and_times_out,                    \
                           "multi_get waits for every key and times out naming the missing one")  \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, queue_is_fifo,                                    \
                           "queues pop in push order and an empty non-blocking pop throws")       \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, queue_pop_waits_for_push,                         \
                           "a blocking queue_pop is woken by another client's push")              \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, queues_apart_from_keys,                           \
                           "queues live apart from keys but check sees a non-empty one")          \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, concurrent_adds_sum_exactly,                      \
                           "8 threads adding at once get distinct results that sum exactly")

namespace weft::test::store_contract {

// Checks of weft's own input rules, for stores that apply them in-process (HashStore, FileStore,
// PrefixStore over either). Not part of the contract above: a TCPStore client talking to
// PyTorch's server cannot apply them (that server drops the connection on a non-integer add).

inline void add_refuses_non_integers(const ClientFactory& make) {
  auto store = make();
  for (const char* bad : {"abc", "12x", " 5", "1.5", "99999999999999999999"}) {
    INFO("value: " << bad);
    store->set("bad", std::string_view(bad));
    try {
      store->add("bad", 1);
      FAIL("add accepted a non-integer");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      CHECK_THAT(e.what(), Catch::Contains("bad\""));  // "bad" or "<prefix>/bad"
    }
    CHECK(store->get_string("bad", kLongWait) == bad);
  }
  store->set("max", std::to_string(INT64_MAX));
  CHECK_THROWS_AS(store->add("max", 1), Error);
  CHECK(store->get_string("max", kLongWait) == std::to_string(INT64_MAX));
  CHECK(store->add("max", -1) == INT64_MAX - 1);
}

inline void zero_and_negative_timeouts(const ClientFactory& make) {
  auto store = make();
  store->set("here", bytes("1"));
  // 0: look once, never wait.
  CHECK(store->get("here", 0ms) == bytes("1"));
  store->wait({"here"}, 0ms);
  require_timeout([&] { store->wait({"here", "not here"}, 0ms); }, 0ms, {"not here"});
  require_timeout([&] { store->get("not here", 0ms); }, 0ms, {"not here"});
  // Negative (other than kDefaultTimeout): the caller's mistake.
  try {
    store->get("here", -5ms);
    FAIL("a negative timeout was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
  }
}

inline void multi_set_refuses_mismatch(const ClientFactory& make) {
  auto store = make();
  int64_t base = store->num_keys();
  try {
    store->multi_set({"x1", "x2"}, {bytes("only one")});
    FAIL("multi_set accepted 2 keys with 1 value");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
  }
  CHECK(store->num_keys() == base);
  CHECK_FALSE(store->check({"x1"}));
}

}  // namespace weft::test::store_contract

#define WEFT_STORE_INPUT_TESTS(Fixture, name, tags)                                            \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, add_refuses_non_integers,                      \
                           "add on a non-integer or overflowing value throws InvalidArgument " \
                           "and keeps the value")                                              \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, zero_and_negative_timeouts,                    \
                           "a zero timeout looks once and a negative one is InvalidArgument")  \
  WEFT_STORE_CONTRACT_TEST(Fixture, name, tags, multi_set_refuses_mismatch,                    \
                           "multi_set with fewer values than keys throws and sets nothing")
