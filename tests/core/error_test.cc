// weft::Error: code names, ErrorContext::describe, message formats and WEFT_CHECK.
#include "weft/error.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

namespace weft {
namespace {

TEST_CASE("every error code prints as its enumerator name", "[core][error]") {
  CHECK(error_code_name(ErrorCode::Timeout) == "Timeout");
  CHECK(error_code_name(ErrorCode::PeerLost) == "PeerLost");
  CHECK(error_code_name(ErrorCode::InvalidArgument) == "InvalidArgument");
  CHECK(error_code_name(ErrorCode::Unsupported) == "Unsupported");
  CHECK(error_code_name(ErrorCode::Aborted) == "Aborted");
  CHECK(error_code_name(ErrorCode::Desync) == "Desync");
  CHECK(error_code_name(ErrorCode::Protocol) == "Protocol");
  CHECK(error_code_name(ErrorCode::Io) == "Io");
  CHECK(error_code_name(static_cast<ErrorCode>(99)) == "Unknown");
  // The C API returns these numbers: they must never change.
  CHECK(static_cast<int>(ErrorCode::Timeout) == 1);
  CHECK(static_cast<int>(ErrorCode::Io) == 8);
}

// Built by assignment: GCC 12's -Wmissing-field-initializers flags designated initializers that
// omit ErrorContext's string members (they have no default member initializer).
ErrorContext context(int rank, int size, std::string group, std::string op, uint64_t seq,
                     std::string op_detail) {
  ErrorContext c;
  c.rank = rank;
  c.size = size;
  c.group = std::move(group);
  c.op = std::move(op);
  c.seq = seq;
  c.op_detail = std::move(op_detail);
  return c;
}

TEST_CASE("ErrorContext::describe names rank, group, op, sequence and detail when set",
          "[core][error]") {
  CHECK(context(2, 4, "dp", "all_reduce", 17, "float32 x 1048576, sum").describe() ==
        "rank 2/4 group \"dp\" all_reduce #17 (float32 x 1048576, sum)");
  CHECK(ErrorContext{}.describe() == "");
  CHECK(context(3, -1, "", "", 0, "").describe() == "rank 3");
  CHECK(context(-1, -1, "world", "barrier", 0, "").describe() == "group \"world\" barrier");
  CHECK(context(-1, 8, "", "barrier", 5, "").describe() == "barrier #5");  // size alone: no rank
  CHECK(context(-1, -1, "", "", 9, "x").describe() == "(x)");              // a sequence needs an op
}

TEST_CASE("an Error built from a context reads context, code, then detail", "[core][error]") {
  const Error e(ErrorCode::PeerLost, context(2, 4, "dp", "all_reduce", 17, ""),
                "rank 1 gone at step 3/6");
  CHECK(e.code() == ErrorCode::PeerLost);
  CHECK(std::string(e.what()) ==
        "rank 2/4 group \"dp\" all_reduce #17: PeerLost: rank 1 gone "
        "at step 3/6");
  const Error bare(ErrorCode::Aborted, ErrorContext{}, "group aborted");
  CHECK(std::string(bare.what()) == "Aborted: group aborted");
  const Error verbatim(ErrorCode::Io, "as given");
  CHECK(std::string(verbatim.what()) == "as given");
  CHECK(verbatim.code() == ErrorCode::Io);
}

TEST_CASE("throw_error throws an Error reading where, code, then detail", "[core][error]") {
  try {
    throw_error(ErrorCode::Timeout, "store 127.0.0.1:29500 get", "after 30 s waiting for \"k\"");
    FAIL("throw_error returned");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Timeout);
    CHECK(std::string(e.what()) ==
          "store 127.0.0.1:29500 get: Timeout: after 30 s waiting for \"k\"");
  }
}

TEST_CASE("Error is a std::runtime_error, so generic handlers catch it", "[core][error]") {
  CHECK_THROWS_AS(throw_error(ErrorCode::Io, "x", "y"), std::runtime_error);
}

TEST_CASE("WEFT_CHECK reports file, line, condition and reason as a logic error", "[core][error]") {
  const int value = 3;
  try {
    WEFT_CHECK(value == 4, "value must be four");
    FAIL("WEFT_CHECK let a false condition through");
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::StartsWith("weft internal error at ") &&
                         Catch::Contains("error_test.cc:") &&
                         Catch::EndsWith("check failed: value == 4: value must be four"));
  }
  try {
    WEFT_CHECK(value < 0);
    FAIL("WEFT_CHECK let a false condition through");
  } catch (const std::logic_error& e) {
    CHECK_THAT(std::string(e.what()), Catch::EndsWith("check failed: value < 0"));
  }
  WEFT_CHECK(value == 3);  // a true condition does nothing
}

}  // namespace
}  // namespace weft
