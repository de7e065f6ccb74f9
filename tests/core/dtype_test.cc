// Names, parsing and traits of DType, ReduceOp, Device and the Tensor view.
#include "weft/dtype.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/device.h"
#include "weft/error.h"
#include "weft/reduce_op.h"
#include "weft/tensor.h"

namespace weft {
namespace {

TEST_CASE("every dtype has its size and PyTorch name, and the name parses back", "[core][types]") {
  const std::vector<std::pair<std::string, size_t>> expected = {
      {"float32", 4}, {"float64", 8},       {"float16", 2},    {"bfloat16", 2}, {"int8", 1},
      {"uint8", 1},   {"int32", 4},         {"int64", 8},      {"bool", 1},     {"uint32", 4},
      {"uint64", 8},  {"float8_e4m3fn", 1}, {"float8_e5m2", 1}};
  REQUIRE(expected.size() == static_cast<size_t>(kNumDTypes));
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = kAllDTypes[i];
    CHECK(static_cast<int>(dtype) == i);
    CHECK(dtype_name(dtype) == expected[i].first);
    CHECK(dtype_size(dtype) == expected[i].second);
    CHECK(parse_dtype(dtype_name(dtype)) == dtype);
  }
  CHECK(dtype_name(static_cast<DType>(200)) == "invalid");
  CHECK(dtype_size(static_cast<DType>(200)) == 0);
  CHECK_FALSE(is_valid(static_cast<DType>(kNumDTypes)));
}

TEST_CASE("parse_dtype takes PyTorch and nccl-tests spellings in any case", "[core][types]") {
  CHECK(parse_dtype("float") == DType::Float32);
  CHECK(parse_dtype("double") == DType::Float64);
  CHECK(parse_dtype("half") == DType::Float16);
  CHECK(parse_dtype("HALF") == DType::Float16);
  CHECK(parse_dtype("bf16") == DType::BFloat16);
  CHECK(parse_dtype("BFloat16") == DType::BFloat16);
  CHECK(parse_dtype("int") == DType::Int32);
  CHECK(parse_dtype("long") == DType::Int64);
  CHECK(parse_dtype("uint8") == DType::UInt8);
  CHECK(parse_dtype("char") == DType::Int8);
  CHECK(parse_dtype("f8e4m3") == DType::Float8E4M3);  // nccl-tests' -d names
  CHECK(parse_dtype("f8e5m2") == DType::Float8E5M2);
  CHECK(parse_dtype("F8E4M3") == DType::Float8E4M3);
  CHECK(parse_dtype("Float8_E4M3FN") == DType::Float8E4M3);
  CHECK(parse_dtype("float8e5m2") == DType::Float8E5M2);  // ncclFloat8e5m2 without "ncc"
  CHECK(parse_dtype("fp8_e4m3") == DType::Float8E4M3);
  CHECK_FALSE(parse_dtype("float8_e4m3fnuz"));  // PyTorch's other fp8 formats are not these
  CHECK_FALSE(parse_dtype("float8_e5m2fnuz"));
  CHECK_FALSE(parse_dtype("fp8"));
  CHECK_FALSE(parse_dtype(""));
  CHECK_FALSE(parse_dtype("float8"));
  CHECK_FALSE(parse_dtype("float32 "));
  CHECK_FALSE(parse_dtype("complex64"));
}

TEST_CASE("floating and integral dtypes are classified as in PyTorch", "[core][types]") {
  std::set<DType> floating, integral;
  for (DType d : kAllDTypes) {
    if (is_floating(d)) floating.insert(d);
    if (is_integral(d)) integral.insert(d);
  }
  CHECK(floating == std::set<DType>{DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                    DType::Float8E4M3, DType::Float8E5M2});
  CHECK(integral == std::set<DType>{DType::Int8, DType::UInt8, DType::Int32, DType::Int64,
                                    DType::UInt32, DType::UInt64});
}

TEST_CASE("dtype_of maps C++ element types by width and signedness", "[core][types]") {
  STATIC_REQUIRE(dtype_of_v<float> == DType::Float32);
  STATIC_REQUIRE(dtype_of_v<const double> == DType::Float64);
  STATIC_REQUIRE(dtype_of_v<Half> == DType::Float16);
  STATIC_REQUIRE(dtype_of_v<BFloat16> == DType::BFloat16);
  STATIC_REQUIRE(dtype_of_v<int8_t> == DType::Int8);
  STATIC_REQUIRE(dtype_of_v<uint8_t> == DType::UInt8);
  STATIC_REQUIRE(dtype_of_v<int32_t> == DType::Int32);
  STATIC_REQUIRE(dtype_of_v<int64_t> == DType::Int64);
  STATIC_REQUIRE(dtype_of_v<long long> == DType::Int64);
  STATIC_REQUIRE(dtype_of_v<uint32_t> == DType::UInt32);
  STATIC_REQUIRE(dtype_of_v<uint64_t> == DType::UInt64);
  STATIC_REQUIRE(dtype_of_v<unsigned long long> == DType::UInt64);
  STATIC_REQUIRE(dtype_of_v<bool> == DType::Bool);
  STATIC_REQUIRE(sizeof(Half) == 2);
  STATIC_REQUIRE(sizeof(BFloat16) == 2);
  STATIC_REQUIRE(dtype_of_v<Float8E4M3> == DType::Float8E4M3);
  STATIC_REQUIRE(dtype_of_v<Float8E5M2> == DType::Float8E5M2);
  STATIC_REQUIRE(sizeof(Float8E4M3) == 1);
  STATIC_REQUIRE(sizeof(Float8E5M2) == 1);
}

TEST_CASE("reduce ops have c10d-style names and parse back", "[core][types]") {
  const std::vector<std::string> names = {"sum",        "prod", "min", "max", "avg",
                                          "premul_sum", "band", "bor", "bxor"};
  for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
    const ReduceOp op(static_cast<ReduceOp::Kind>(k));
    CHECK(reduce_op_name(op) == names[k]);
    CHECK(parse_reduce_op(names[k]) == op);
  }
  CHECK(reduce_op_name(ReduceOp(static_cast<ReduceOp::Kind>(9))) == "invalid");
  CHECK(parse_reduce_op("SUM") == ReduceOp::Sum);
  CHECK(parse_reduce_op("premul_sum:0.25") == ReduceOp::premul_sum(0.25));
  CHECK(parse_reduce_op("premul_sum(-2)") == ReduceOp::premul_sum(-2));
  CHECK_FALSE(parse_reduce_op("premul_sum:"));
  CHECK_FALSE(parse_reduce_op("premul_sum:inf"));
  CHECK_FALSE(parse_reduce_op("premul_sum:0.5x"));
  CHECK_FALSE(parse_reduce_op("premul_sum(0.5"));
  CHECK_FALSE(parse_reduce_op("mean"));
  CHECK_FALSE(parse_reduce_op(""));
}

TEST_CASE("ReduceOp converts from its kind and compares like c10d's", "[core][types]") {
  ReduceOp op = ReduceOp::Max;
  CHECK(op == ReduceOp::Max);
  CHECK(op.kind == ReduceOp::Max);
  CHECK(ReduceOp() == ReduceOp::Sum);
  const ReduceOp premul = ReduceOp::premul_sum(0.125);
  CHECK(premul == ReduceOp::PremulSum);  // a kind comparison ignores the factor
  CHECK(premul.factor == 0.125);
  CHECK_FALSE(premul == ReduceOp::premul_sum(0.25));
  CHECK(describe(premul) == "premul_sum(0.125)");
  CHECK(describe(ReduceOp::BXor) == "bxor");
  STATIC_REQUIRE(ReduceOp::premul_sum(2).factor == 2);
}

TEST_CASE("devices print as cpu and cuda:N and parse back", "[core][types]") {
  CHECK(device_name(Device{}) == "cpu");
  CHECK(device_name(Device::cuda(3)) == "cuda:3");
  CHECK(device_name(Device{DeviceKind::Cpu, 2}) == "cpu:2");
  CHECK(device_kind_name(DeviceKind::Cuda) == "cuda");
  CHECK(parse_device("cpu") == Device::cpu());
  CHECK(parse_device("cpu:0") == Device::cpu());
  CHECK(parse_device("cuda") == Device::cuda(0));
  CHECK(parse_device("CUDA:12") == Device::cuda(12));
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "cuda1", "cpu:1",
                          "cuda:99999", "cuda: 1", "cudas"}) {
    INFO(bad);
    CHECK_FALSE(parse_device(bad));
  }
}

TEST_CASE("Tensor::of views typed memory with its dtype, count and bytes", "[core][types]") {
  std::vector<double> values(10, 1.0);
  const Tensor t = Tensor::of(values.data(), values.size());
  CHECK(t.data == values.data());
  CHECK(t.count == 10);
  CHECK(t.dtype == DType::Float64);
  CHECK(t.device == Device::cpu());
  CHECK(t.nbytes() == 80);
  CHECK(t.data_as<double>() == values.data());
  CHECK_THROWS_AS(t.data_as<float>(), Error);
  CHECK(describe(t) == "float64 x 10 on cpu");

  const std::vector<int32_t> input(5, 7);
  const Tensor in = Tensor::of(input.data(), input.size(), Device::cuda(1));
  CHECK(in.dtype == DType::Int32);
  CHECK(describe(in) == "int32 x 5 on cuda:1");
  const Tensor designated{.data = values.data(), .count = 4, .dtype = DType::Float16};
  CHECK(designated.nbytes() == 8);
}

TEST_CASE("Tensor::slice views a sub-range and refuses one outside the view", "[core][types]") {
  std::vector<int64_t> values = {0, 1, 2, 3, 4, 5};
  const Tensor t = Tensor::of(values.data(), values.size());
  const Tensor mid = t.slice(2, 3);
  CHECK(mid.count == 3);
  CHECK(mid.data_as<int64_t>()[0] == 2);
  CHECK(t.slice(6, 0).count == 0);
  try {
    (void)t.slice(4, 3);
    FAIL("slice past the end was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("outside a view of 6 elements"));
  }
  CHECK_THROWS_AS(t.slice(SIZE_MAX, 2), Error);
  CHECK_THROWS_AS(t.slice(1, SIZE_MAX), Error);
}

}  // namespace
}  // namespace weft
