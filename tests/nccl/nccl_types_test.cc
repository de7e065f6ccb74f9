// What the nccl backend decides without a device: the dtype and op mapping (with its refusals and
// their messages), its settings, and the unique-id exchange over a store. Runs everywhere the
// module builds; no CUDA call is made.
#include "backends/nccl/nccl_types.h"

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/half.h"
#include "weft/hash_store.h"

#include "backends/nccl/nccl_settings.h"
#include "backends/nccl/unique_id_exchange.h"

namespace weft::nccl {
namespace {

ErrorContext test_context() {
  ErrorContext context;
  context.rank = 1;
  context.size = 4;
  context.group = "dp";
  context.op = "all_reduce";
  context.seq = 7;
  return context;
}

const std::string kPrefix = "rank 1/4 group \"dp\" all_reduce #7";

// The error `f` throws: its code and message. FAILs when it throws nothing.
template <typename F>
std::pair<ErrorCode, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  FAIL("no error thrown");
  return {};
}

TEST_CASE("every weft dtype maps to the NCCL type of its width and kind", "[nccl]") {
  const std::map<DType, ncclDataType_t> expected = {
      {DType::Float32, ncclFloat32},
      {DType::Float64, ncclFloat64},
      {DType::Float16, ncclFloat16},
      {DType::BFloat16, ncclBfloat16},
      {DType::Int8, ncclInt8},
      {DType::UInt8, ncclUint8},
      {DType::Int32, ncclInt32},
      {DType::Int64, ncclInt64},
      {DType::Bool, ncclUint8},
      {DType::UInt32, ncclUint32},
      {DType::UInt64, ncclUint64},
      {DType::Float8E4M3, ncclFloat8e4m3},
      {DType::Float8E5M2, ncclFloat8e5m2},
  };
  for (DType dtype : kAllDTypes) {
    INFO(dtype_name(dtype));
    REQUIRE(expected.contains(dtype));
    const std::optional<ncclDataType_t> mapped = to_nccl_dtype(dtype);
    REQUIRE(mapped.has_value());
    CHECK(*mapped == expected.at(dtype));
    CHECK(require_nccl_dtype(dtype, test_context()) == expected.at(dtype));
  }
  CHECK(std::string(nccl_dtype_name(ncclBfloat16)) == "ncclBfloat16");
}

TEST_CASE("a dtype NCCL has no type for is Unsupported, naming backend and dtype", "[nccl]") {
  const DType unknown = static_cast<DType>(200);
  CHECK_FALSE(to_nccl_dtype(unknown).has_value());
  auto [code, what] = error_of([&] { require_nccl_dtype(unknown, test_context()); });
  CHECK(code == ErrorCode::Unsupported);
  CHECK(what.starts_with(kPrefix));
  CHECK(what.find("backend \"nccl\" does not support dtype invalid") != std::string::npos);
}

TEST_CASE("sum, prod, min, max and avg map to NCCL's ops on every non-bool dtype", "[nccl]") {
  const std::map<ReduceOp::Kind, ncclRedOp_t> expected = {
      {ReduceOp::Sum, ncclSum}, {ReduceOp::Prod, ncclProd}, {ReduceOp::Min, ncclMin},
      {ReduceOp::Max, ncclMax}, {ReduceOp::Avg, ncclAvg},
  };
  for (DType dtype : kAllDTypes) {
    if (dtype == DType::Bool) continue;
    for (auto [kind, op] : expected) {
      INFO(dtype_name(dtype) << " " << reduce_op_name(kind));
      const NcclReduction r = to_nccl_reduction(kind, dtype, test_context());
      CHECK(r.op == op);
      CHECK_FALSE(r.premul);
    }
  }
}

TEST_CASE("bool reduces as uint8: sum, max and bor by max; prod, min and band by min", "[nccl]") {
  for (ReduceOp::Kind kind : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::BOr}) {
    CHECK(to_nccl_reduction(kind, DType::Bool, test_context()).op == ncclMax);
  }
  for (ReduceOp::Kind kind : {ReduceOp::Prod, ReduceOp::Min, ReduceOp::BAnd}) {
    CHECK(to_nccl_reduction(kind, DType::Bool, test_context()).op == ncclMin);
  }
  auto [xor_code, xor_what] =
      error_of([] { to_nccl_reduction(ReduceOp::BXor, DType::Bool, test_context()); });
  CHECK(xor_code == ErrorCode::Unsupported);
  CHECK(xor_what == kPrefix +
                        ": Unsupported: bxor on bool: backend \"nccl\" has no exclusive or (NCCL "
                        "has no bitwise reduction)");
  for (ReduceOp op : {ReduceOp(ReduceOp::Avg), ReduceOp::premul_sum(0.5)}) {
    auto [code, what] = error_of([&] { to_nccl_reduction(op, DType::Bool, test_context()); });
    CHECK(code == ErrorCode::InvalidArgument);
    CHECK(what.find(": InvalidArgument: ") != std::string::npos);
    CHECK(what.find("on bool: no boolean meaning") != std::string::npos);
  }
}

TEST_CASE("bitwise ops on integers are Unsupported: NCCL has none", "[nccl]") {
  for (DType dtype : kAllDTypes) {
    if (!is_integral(dtype)) continue;
    for (ReduceOp::Kind kind : {ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor}) {
      auto [code, what] = error_of([&] { to_nccl_reduction(kind, dtype, test_context()); });
      INFO(what);
      CHECK(code == ErrorCode::Unsupported);
      CHECK(what.starts_with(kPrefix + ": Unsupported: " + std::string(reduce_op_name(kind)) +
                             " on " + std::string(dtype_name(dtype))));
      CHECK(what.find("backend \"nccl\" does not support bitwise reductions") != std::string::npos);
    }
  }
}

TEST_CASE("premul_sum carries its factor as one element of the dtype", "[nccl]") {
  const double factor = 0.25;
  NcclReduction r = to_nccl_reduction(ReduceOp::premul_sum(factor), DType::Float32, {});
  CHECK(r.premul);
  float f32;
  std::memcpy(&f32, r.scalar, sizeof(f32));
  CHECK(f32 == 0.25f);
  r = to_nccl_reduction(ReduceOp::premul_sum(factor), DType::Float64, {});
  double f64;
  std::memcpy(&f64, r.scalar, sizeof(f64));
  CHECK(f64 == 0.25);
  r = to_nccl_reduction(ReduceOp::premul_sum(factor), DType::Float16, {});
  uint16_t bits;
  std::memcpy(&bits, r.scalar, sizeof(bits));
  CHECK(bits == float_to_half(0.25f));
  CHECK(half_to_float(bits) == 0.25f);
  r = to_nccl_reduction(ReduceOp::premul_sum(factor), DType::BFloat16, {});
  std::memcpy(&bits, r.scalar, sizeof(bits));
  CHECK(bits == float_to_bf16(0.25f));
  // fp8: one byte, 0.25 exactly in both formats.
  r = to_nccl_reduction(ReduceOp::premul_sum(factor), DType::Float8E4M3, {});
  CHECK(static_cast<uint8_t>(r.scalar[0]) == float_to_e4m3fn(0.25f));
  CHECK(e4m3fn_to_float(static_cast<uint8_t>(r.scalar[0])) == 0.25f);
  r = to_nccl_reduction(ReduceOp::premul_sum(factor), DType::Float8E5M2, {});
  CHECK(static_cast<uint8_t>(r.scalar[0]) == float_to_e5m2(0.25f));
  CHECK(e5m2_to_float(static_cast<uint8_t>(r.scalar[0])) == 0.25f);
  for (DType dtype : kAllDTypes) {
    if (!is_integral(dtype)) continue;
    auto [code, what] =
        error_of([&] { to_nccl_reduction(ReduceOp::premul_sum(2.0), dtype, test_context()); });
    CHECK(code == ErrorCode::InvalidArgument);
    CHECK(what.find("offered for floating dtypes only") != std::string::npos);
  }
}

TEST_CASE("NCCL results map to weft codes: remote errors are PeerLost", "[nccl]") {
  CHECK(error_code_for(ncclRemoteError) == ErrorCode::PeerLost);
  CHECK(error_code_for(ncclInvalidArgument) == ErrorCode::InvalidArgument);
  CHECK(error_code_for(ncclInvalidUsage) == ErrorCode::InvalidArgument);
  CHECK(error_code_for(ncclSystemError) == ErrorCode::Internal);
  CHECK(error_code_for(ncclUnhandledCudaError) == ErrorCode::Internal);
  CHECK(error_code_for(ncclInternalError) == ErrorCode::Internal);
  CHECK(describe_nccl_result(ncclRemoteError, nullptr).starts_with("ncclRemoteError ("));
}

TEST_CASE("settings: defaults, variables, and group settings over variables", "[nccl]") {
  std::map<std::string, std::string> env;
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  NcclSettings s = parse_nccl_settings(getenv, {});
  CHECK(s.poll == std::chrono::milliseconds(1));
  CHECK_FALSE(s.blocking_wait);

  env = {{"WEFT_NCCL_POLL", "5ms"}, {"WEFT_NCCL_BLOCKING_WAIT", "1"}};
  s = parse_nccl_settings(getenv, {});
  CHECK(s.poll == std::chrono::milliseconds(5));
  CHECK(s.blocking_wait);

  s = parse_nccl_settings(getenv, {{"nccl_poll", "0.5"}, {"nccl_blocking_wait", "off"}});
  CHECK(s.poll == std::chrono::milliseconds(500));
  CHECK_FALSE(s.blocking_wait);

  env = {{"WEFT_NCCL_POLL", ""}};  // empty counts as unset
  CHECK(parse_nccl_settings(getenv, {}).poll == std::chrono::milliseconds(1));
}

TEST_CASE("settings: a malformed or out-of-range value is InvalidArgument naming it", "[nccl]") {
  std::map<std::string, std::string> env;
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  env = {{"WEFT_NCCL_POLL", "2s"}};
  auto [code, what] = error_of([&] { parse_nccl_settings(getenv, {}); });
  CHECK(code == ErrorCode::InvalidArgument);
  CHECK(what ==
        "configuration: InvalidArgument: WEFT_NCCL_POLL=\"2s\" is not valid; expected a "
        "duration from 1ms to 1s");
  env = {{"WEFT_NCCL_POLL", "soon"}};
  std::tie(code, what) = error_of([&] { parse_nccl_settings(getenv, {}); });
  CHECK(code == ErrorCode::InvalidArgument);
  CHECK(what.find("WEFT_NCCL_POLL=\"soon\" is not a duration") != std::string::npos);
  env = {{"WEFT_NCCL_BLOCKING_WAIT", "maybe"}};
  std::tie(code, what) = error_of([&] { parse_nccl_settings(getenv, {}); });
  CHECK(what ==
        "configuration: InvalidArgument: WEFT_NCCL_BLOCKING_WAIT=\"maybe\" is not valid; "
        "expected 1/true/yes/on or 0/false/no/off");
  env.clear();
  std::tie(code, what) = error_of([&] {
    parse_nccl_settings(getenv, {{"nccl_blocking_wait", "2"}});
  });
  CHECK(what.find("setting \"nccl_blocking_wait\"=\"2\" is not valid") != std::string::npos);
}

TEST_CASE("unique id: rank 0 publishes, the others read the same bytes, per communicator index",
          "[nccl]") {
  auto store = std::make_shared<HashStore>();
  const size_t kBytes = 128;
  int made = 0;
  auto make = [&](uint8_t fill) {
    return [&made, fill] {
      ++made;
      return std::vector<uint8_t>(kBytes, fill);
    };
  };
  // Called on rank 1's thread too, where Catch's FAIL must not run: a throw fails the exchange.
  auto never = []() -> std::vector<uint8_t> { throw std::logic_error("only rank 0 makes the id"); };
  const std::chrono::milliseconds timeout(10'000);
  // Rank 1 starts first and waits for rank 0.
  std::vector<uint8_t> seen_by_1;
  std::thread rank1([&] {
    seen_by_1 = exchange_unique_id(*store, 1, 0, timeout, kBytes, never, test_context());
  });
  std::vector<uint8_t> id0 = exchange_unique_id(*store, 0, 0, timeout, kBytes, make(0xab), {});
  rank1.join();
  CHECK(id0 == std::vector<uint8_t>(kBytes, 0xab));
  CHECK(seen_by_1 == id0);
  CHECK(made == 1);
  CHECK(unique_id_key(0) == "nccl/uid/0");
  // The group's second communicator (another device) has an id of its own.
  std::vector<uint8_t> id1 = exchange_unique_id(*store, 0, 1, timeout, kBytes, make(0xcd), {});
  CHECK(exchange_unique_id(*store, 2, 1, timeout, kBytes, never, {}) == id1);
  CHECK(exchange_unique_id(*store, 3, 0, timeout, kBytes, never, {}) == id0);
}

TEST_CASE("unique id: a rank 0 that never publishes is a Timeout naming the key", "[nccl]") {
  auto store = std::make_shared<HashStore>();
  auto never = []() -> std::vector<uint8_t> { return {}; };
  const auto start = std::chrono::steady_clock::now();
  auto [code, what] = error_of([&] {
    exchange_unique_id(*store, 1, 3, std::chrono::milliseconds(200), 128, never, test_context());
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(code == ErrorCode::Timeout);
  CHECK(what.starts_with(kPrefix + ": Timeout: waiting 200 ms for rank 0's NCCL unique id "
                                   "(store key \"nccl/uid/3\")"));
}

TEST_CASE("unique id: a value of the wrong size is a Protocol error", "[nccl]") {
  auto store = std::make_shared<HashStore>();
  store->set(unique_id_key(0), std::vector<uint8_t>(5, 1));
  auto never = []() -> std::vector<uint8_t> { return {}; };
  auto [code, what] = error_of([&] {
    exchange_unique_id(*store, 1, 0, std::chrono::milliseconds(1000), 128, never, test_context());
  });
  CHECK(code == ErrorCode::Protocol);
  CHECK(what.find("has 5 bytes, not 128") != std::string::npos);
}

}  // namespace
}  // namespace weft::nccl
