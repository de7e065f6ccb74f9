#include "weft/prefix_store.h"

#include <chrono>
#include <memory>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/hash_store.h"

#include "tests/store/store_contract.h"

namespace {

using namespace std::chrono_literals;
using weft::to_bytes;

struct PrefixStoreFixture {
  std::shared_ptr<weft::HashStore> base = std::make_shared<weft::HashStore>();
  // A new PrefixStore per client, all over one HashStore, as sub-groups of one job would be.
  std::shared_ptr<weft::Store> client() { return std::make_shared<weft::PrefixStore>("pg", base); }
};

}  // namespace

WEFT_STORE_CONTRACT_TESTS(PrefixStoreFixture, "PrefixStore", "[prefix_store]")
WEFT_STORE_INPUT_TESTS(PrefixStoreFixture, "PrefixStore", "[prefix_store]")

TEST_CASE("two PrefixStores over one store never see each other's keys or queues",
          "[store][prefix_store]") {
  auto base = std::make_shared<weft::HashStore>();
  weft::PrefixStore one("pg1", base);
  weft::PrefixStore two("pg2", base);
  one.set("k", std::string_view("from one"));
  CHECK_FALSE(two.check({"k"}));
  two.set("k", std::string_view("from two"));
  CHECK(one.get_string("k", 1s) == "from one");
  CHECK(two.get_string("k", 1s) == "from two");
  CHECK(one.add("count", 3) == 3);
  CHECK(two.add("count", 5) == 5);
  one.queue_push("q", to_bytes("job"));
  CHECK(two.queue_len("q") == 0);
  CHECK(one.delete_key("k"));
  CHECK(two.get_string("k", 1s) == "from two");
  // The underlying store holds c10d's "<prefix>/<key>".
  CHECK(base->get_string("pg2/k", 1s) == "from two");
  CHECK(base->get_string("pg1/count", 1s) == "3");
  CHECK(base->queue_len("pg1/q") == 1);
  CHECK_FALSE(base->check({"k", "pg1/k"}));
}

TEST_CASE("nested PrefixStores join their prefixes outermost last", "[store][prefix_store]") {
  auto base = std::make_shared<weft::HashStore>();
  auto outer = std::make_shared<weft::PrefixStore>("a", base);
  weft::PrefixStore inner("b", outer);
  inner.set("k", std::string_view("v"));
  CHECK(base->get_string("a/b/k", 1s) == "v");
  CHECK(outer->get_string("b/k", 1s) == "v");
}

TEST_CASE("PrefixStore num_keys counts the whole underlying store", "[store][prefix_store]") {
  auto base = std::make_shared<weft::HashStore>();
  weft::PrefixStore one("pg1", base);
  base->set("unprefixed", std::string_view("x"));
  weft::PrefixStore("pg2", base).set("k", std::string_view("y"));
  one.set("k", std::string_view("z"));
  CHECK(one.num_keys() == 3);
  CHECK(one.num_keys() == base->num_keys());
}

TEST_CASE("PrefixStore errors name the full key and its timeout defaults to the underlying one",
          "[store][prefix_store]") {
  auto base = std::make_shared<weft::HashStore>();
  base->set_timeout(150ms);
  weft::PrefixStore store("pg", base);
  CHECK(store.timeout() == 150ms);
  try {
    store.get("missing");
    FAIL("get of a missing key returned");
  } catch (const weft::Error& e) {
    CHECK(e.code() == weft::ErrorCode::Timeout);
    CHECK_THAT(e.what(), Catch::Contains("\"pg/missing\""));
  }
  // Its own timeout, once set, is what kDefaultTimeout means for it, not the base's.
  store.set_timeout(0ms);
  base->set_timeout(10s);
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(store.wait({"missing"}), weft::Error);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("PrefixStore refuses a null underlying store", "[store][prefix_store]") {
  try {
    weft::PrefixStore store("pg", nullptr);
    FAIL("constructed over nullptr");
  } catch (const weft::Error& e) {
    CHECK(e.code() == weft::ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("\"pg\""));
  }
}
