// StoreRequestParser on its own: a stream of every query type decodes to the same requests
// however it is split, and limits are enforced on the length fields themselves.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/store_protocol.h"
#include "runtime/store_request_parser.h"
#include "tests/store_protocol/raw_client.h"

namespace weft::test {
namespace {

using store_protocol::QueryType;

// One frame of every query type, with its expected decoding.
struct Case {
  Frame frame;
  StoreRequest want;
};

StoreRequest req(QueryType type, std::vector<std::string> keys, std::vector<std::string> values,
                 uint64_t number = 0, std::string mac = "") {
  return StoreRequest{type, std::move(keys), std::move(values), number, std::move(mac)};
}

std::vector<Case> every_query() {
  std::string mac(32, '\x5a');
  return {
      {Frame().u8(0).u32(0x3C85F7CE), req(QueryType::Validate, {}, {}, 0x3C85F7CE)},
      {Frame().u8(1).str("/k").str("v"), req(QueryType::Set, {"/k"}, {"v"})},
      {Frame().u8(2).str("/k").str("").str("d"), req(QueryType::CompareSet, {"/k"}, {"", "d"})},
      {Frame().u8(3).str("/k"), req(QueryType::Get, {"/k"}, {})},
      {Frame().u8(4).str("/n").i64(-9), req(QueryType::Add, {"/n"}, {}, uint64_t(-9))},
      {Frame().u8(5).u64(2).str("/a").str(""), req(QueryType::Check, {"/a", ""}, {})},
      {Frame().u8(6).u64(0), req(QueryType::Wait, {}, {})},
      {Frame().u8(7), req(QueryType::GetNumKeys, {}, {})},
      {Frame().u8(8).str("/k"), req(QueryType::DeleteKey, {"/k"}, {})},
      {Frame().u8(9).str("/k").str("xy"), req(QueryType::Append, {"/k"}, {"xy"})},
      {Frame().u8(10).u64(1).str("/m"), req(QueryType::MultiGet, {"/m"}, {})},
      {Frame().u8(11).u64(2).str("/a").str("1").str("/b").str(""),
       req(QueryType::MultiSet, {"/a", "/b"}, {"1", ""})},
      {Frame().u8(12), req(QueryType::CancelWait, {}, {})},
      {Frame().u8(13).u32(0xABCD), req(QueryType::Ping, {}, {}, 0xABCD)},
      {Frame().u8(14).str("/q").str("job"), req(QueryType::QueuePush, {"/q"}, {"job"})},
      {Frame().u8(15).str("/q"), req(QueryType::QueuePop, {"/q"}, {})},
      {Frame().u8(16).str("/q"), req(QueryType::QueueLen, {"/q"}, {})},
      {Frame().u8(0xC0), req(QueryType::AuthChallenge, {}, {})},
      {Frame().u8(0xC1).raw(mac), req(QueryType::AuthProof, {}, {}, 0, mac)},
  };
}

bool same(const StoreRequest& a, const StoreRequest& b) {
  return a.type == b.type && a.keys == b.keys && a.values == b.values && a.number == b.number &&
         a.mac == b.mac;
}

// Feeds the pieces in order and returns every request decoded; FAILs on a violation.
std::vector<StoreRequest> decode(const std::vector<std::string>& pieces) {
  StoreRequestParser parser{StoreRequestLimits{}};
  std::vector<StoreRequest> out;
  for (const std::string& piece : pieces) {
    auto* data = reinterpret_cast<const uint8_t*>(piece.data());
    size_t pos = 0;
    while (pos < piece.size()) {
      size_t used = 0;
      auto status = parser.feed(data + pos, piece.size() - pos, &used);
      pos += used;
      REQUIRE(status != StoreRequestParser::Status::Violation);
      if (status == StoreRequestParser::Status::Complete) out.push_back(parser.take_request());
    }
  }
  REQUIRE_FALSE(parser.mid_request());
  return out;
}

StoreRequestParser::Status feed_all(StoreRequestParser& parser, const std::string& bytes) {
  size_t used = 0;
  return parser.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &used);
}

}  // namespace

TEST_CASE("every query type decodes the same wherever the stream is split in two",
          "[store_protocol]") {
  std::vector<Case> cases = every_query();
  std::string stream;
  for (const Case& c : cases) stream += c.frame.data();
  for (size_t split = 0; split <= stream.size(); ++split) {
    auto got = decode({stream.substr(0, split), stream.substr(split)});
    REQUIRE(got.size() == cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      INFO("split at byte " << split << ", query " << i);
      CHECK(same(got[i], cases[i].want));
    }
  }
}

TEST_CASE("every query type decodes when fed one byte at a time", "[store_protocol]") {
  std::vector<Case> cases = every_query();
  std::vector<std::string> bytes;
  for (const Case& c : cases) {
    for (char b : c.frame.data()) bytes.emplace_back(1, b);
  }
  auto got = decode(bytes);
  REQUIRE(got.size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) CHECK(same(got[i], cases[i].want));
}

TEST_CASE("the parser refuses an over-limit length as soon as the length arrives",
          "[store_protocol]") {
  StoreRequestLimits limits;
  limits.max_key_bytes = 4;
  limits.max_value_bytes = 8;
  limits.max_keys_per_query = 2;
  limits.max_request_bytes = 100;
  SECTION("key") {
    StoreRequestParser parser(limits);
    CHECK(feed_all(parser, Frame().u8(1).u64(5).data()) == StoreRequestParser::Status::Violation);
    CHECK(parser.error().find("key of 5 bytes") != std::string::npos);
  }
  SECTION("value") {
    StoreRequestParser parser(limits);
    CHECK(feed_all(parser, Frame().u8(1).str("k").u64(9).data()) ==
          StoreRequestParser::Status::Violation);
  }
  SECTION("key count") {
    StoreRequestParser parser(limits);
    CHECK(feed_all(parser, Frame().u8(6).u64(3).data()) == StoreRequestParser::Status::Violation);
  }
  SECTION("bytes held by one query") {
    StoreRequestParser parser(limits);
    Frame f = Frame().u8(11).u64(2).str("a").str("12345678").str("b");
    // Each string is charged its bytes plus sizeof(std::string): 33 + 40 + 33 > 100.
    CHECK(feed_all(parser, f.data()) == StoreRequestParser::Status::Violation);
  }
  SECTION("at the limits it is accepted") {
    StoreRequestParser parser(limits);
    CHECK(feed_all(parser, Frame().u8(1).str("kkkk").str("12345678").data()) ==
          StoreRequestParser::Status::Complete);
    CHECK(parser.held_bytes() == 0);
  }
}

TEST_CASE("an unknown type byte is a violation naming the type", "[store_protocol]") {
  StoreRequestParser parser{StoreRequestLimits{}};
  CHECK(feed_all(parser, std::string(1, '\x11')) == StoreRequestParser::Status::Violation);
  CHECK(parser.error() == "unknown query type 17");
}

}  // namespace weft::test
