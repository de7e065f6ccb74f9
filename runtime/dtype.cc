// Names and parsing of the core value types: DType, ReduceOp, Device, Tensor and CollectiveKind.
#include "weft/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "weft/backend.h"
#include "weft/device.h"
#include "weft/reduce_op.h"
#include "weft/tensor.h"

namespace weft {
namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Names a user may type, with what they mean. The canonical name of each dtype comes first.
constexpr std::array<std::pair<std::string_view, DType>, 33> kDTypeNames = {{
    {"float32", DType::Float32},
    {"float64", DType::Float64},
    {"float16", DType::Float16},
    {"bfloat16", DType::BFloat16},
    {"int8", DType::Int8},
    {"uint8", DType::UInt8},
    {"int32", DType::Int32},
    {"int64", DType::Int64},
    {"bool", DType::Bool},
    {"uint32", DType::UInt32},
    {"uint64", DType::UInt64},
    {"float8_e4m3fn", DType::Float8E4M3},
    {"float8_e5m2", DType::Float8E5M2},
    // PyTorch's aliases (torch.float, torch.double, torch.half, torch.int, torch.long) and the
    // nccl-tests / NCCL spellings (-d half, ncclFloat16, ncclBfloat16, ...).
    {"float", DType::Float32},
    {"double", DType::Float64},
    {"half", DType::Float16},
    {"bf16", DType::BFloat16},
    {"fp32", DType::Float32},
    {"fp64", DType::Float64},
    {"fp16", DType::Float16},
    {"int", DType::Int32},
    {"long", DType::Int64},
    {"char", DType::Int8},
    {"byte", DType::UInt8},
    {"uint8_t", DType::UInt8},
    {"uint32_t", DType::UInt32},
    {"uint64_t", DType::UInt64},
    // fp8: nccl-tests' -d names (f8e4m3, f8e5m2), NCCL's (ncclFloat8e4m3, "float8e4m3") and the
    // short fp8 spellings. torch.float8_e4m3fnuz / e5m2fnuz are other formats and stay unknown.
    {"f8e4m3", DType::Float8E4M3},
    {"f8e5m2", DType::Float8E5M2},
    {"float8e4m3", DType::Float8E4M3},
    {"float8e5m2", DType::Float8E5M2},
    {"fp8_e4m3", DType::Float8E4M3},
    {"fp8_e5m2", DType::Float8E5M2},
}};

constexpr std::array<std::string_view, ReduceOp::kNumKinds> kReduceOpNames = {
    "sum", "prod", "min", "max", "avg", "premul_sum", "band", "bor", "bxor"};

// Parses a whole string as a finite double; strtod needs a terminated string, hence the copy.
std::optional<double> parse_finite(std::string_view text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return std::nullopt;
  std::string copy(text);
  char* end = nullptr;
  double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  if (!is_valid(dtype)) return "invalid";
  return kDTypeNames[static_cast<size_t>(dtype)].first;
}

std::optional<DType> parse_dtype(std::string_view text) {
  const std::string lower = lowercase(text);
  for (const auto& [name, dtype] : kDTypeNames) {
    if (lower == name) return dtype;
  }
  return std::nullopt;
}

std::string_view reduce_op_name(ReduceOp op) {
  if (static_cast<int>(op.kind) >= ReduceOp::kNumKinds) return "invalid";
  return kReduceOpNames[op.kind];
}

std::string describe(ReduceOp op) {
  if (op.kind == ReduceOp::PremulSum) return fmt::format("premul_sum({})", op.factor);
  return std::string(reduce_op_name(op));
}

std::optional<ReduceOp> parse_reduce_op(std::string_view text) {
  const std::string lower = lowercase(text);
  std::string_view name = lower;
  for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
    if (name == kReduceOpNames[k]) return ReduceOp(static_cast<ReduceOp::Kind>(k));
  }
  // "premul_sum:0.25" or "premul_sum(0.25)".
  constexpr std::string_view kPremul = "premul_sum";
  if (!name.starts_with(kPremul)) return std::nullopt;
  std::string_view rest = name.substr(kPremul.size());
  if (rest.starts_with(':')) {
    rest.remove_prefix(1);
  } else if (rest.starts_with('(') && rest.ends_with(')')) {
    rest = rest.substr(1, rest.size() - 2);
  } else {
    return std::nullopt;
  }
  std::optional<double> factor = parse_finite(rest);
  if (!factor) return std::nullopt;
  return ReduceOp::premul_sum(*factor);
}

std::string_view device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::Cpu:
      return "cpu";
    case DeviceKind::Cuda:
      return "cuda";
  }
  return "invalid";
}

std::string device_name(Device device) {
  if (device.kind == DeviceKind::Cpu && device.index == 0) return "cpu";
  return fmt::format("{}:{}", device_kind_name(device.kind), device.index);
}

std::optional<Device> parse_device(std::string_view text) {
  const std::string lower = lowercase(text);
  std::string_view rest = lower;
  Device device;
  if (rest.starts_with("cuda")) {
    device.kind = DeviceKind::Cuda;
    rest.remove_prefix(4);
  } else if (rest.starts_with("cpu")) {
    rest.remove_prefix(3);
  } else {
    return std::nullopt;
  }
  if (rest.empty()) return device;
  if (!rest.starts_with(':') || rest.size() == 1) return std::nullopt;
  rest.remove_prefix(1);
  // Digits only: from_chars alone would accept a leading '-'.
  if (!std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  int index = 0;
  auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
  // 2^16: far above any machine's device count, and small enough that no index overflows.
  if (error != std::errc() || end != rest.data() + rest.size() || index >= (1 << 16)) {
    return std::nullopt;
  }
  if (device.kind == DeviceKind::Cpu && index != 0) return std::nullopt;
  device.index = index;
  return device;
}

std::string describe(const Tensor& tensor) {
  return fmt::format("{} x {} on {}", dtype_name(tensor.dtype), tensor.count,
                     device_name(tensor.device));
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce:
      return "all_reduce";
    case CollectiveKind::Reduce:
      return "reduce";
    case CollectiveKind::Broadcast:
      return "broadcast";
    case CollectiveKind::AllGather:
      return "all_gather";
    case CollectiveKind::ReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::Gather:
      return "gather";
    case CollectiveKind::Scatter:
      return "scatter";
    case CollectiveKind::AllToAll:
      return "all_to_all";
    case CollectiveKind::Barrier:
      return "barrier";
    case CollectiveKind::Send:
      return "send";
    case CollectiveKind::Recv:
      return "recv";
  }
  return "unknown";
}

}  // namespace weft
