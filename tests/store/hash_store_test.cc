#include "weft/hash_store.h"

#include <future>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/store/store_contract.h"

namespace {

struct HashStoreFixture {
  std::shared_ptr<weft::HashStore> store = std::make_shared<weft::HashStore>();
  std::shared_ptr<weft::Store> client() { return store; }
};

}  // namespace

WEFT_STORE_CONTRACT_TESTS(HashStoreFixture, "HashStore", "[hash_store]")
WEFT_STORE_INPUT_TESTS(HashStoreFixture, "HashStore", "[hash_store]")

TEST_CASE("HashStore wakes each of 16 waiters with the value of its own key",
          "[store][hash_store]") {
  using namespace std::chrono_literals;
  weft::HashStore store;
  constexpr int kWaiters = 16;
  std::vector<std::future<std::string>> got;
  for (int i = 0; i < kWaiters; ++i) {
    got.push_back(std::async(std::launch::async, [&store, i] {
      return store.get_string("key " + std::to_string(i), 10s);
    }));
  }
  // Set in reverse order: a waiter woken by another key's set must go back to waiting.
  for (int i = kWaiters - 1; i >= 0; --i)
    store.set("key " + std::to_string(i), "value " + std::to_string(i));
  for (int i = 0; i < kWaiters; ++i) CHECK(got[i].get() == "value " + std::to_string(i));
}

TEST_CASE("HashStore queue_pop ignores the timeout when block is false", "[store][hash_store]") {
  using namespace std::chrono_literals;
  weft::HashStore store;
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(store.queue_pop("q", false, 10s), weft::Error);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}
