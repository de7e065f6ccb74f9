// weft/device.h: where a tensor's memory lives: the host, or one CUDA device.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace weft {

enum class DeviceKind : uint8_t { Cpu = 0, Cuda = 1 };

// "cpu", "cuda".
std::string_view device_kind_name(DeviceKind kind);

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;  // the CUDA ordinal; 0 for the host, which has one

  static constexpr Device cpu() { return Device{}; }
  static constexpr Device cuda(int index) { return Device{DeviceKind::Cuda, index}; }

  constexpr bool operator==(const Device&) const = default;
};

// "cpu", "cuda:1" (the index is always printed for CUDA; a CPU index other than 0, which no
// valid Device has, prints as "cpu:N" so that a bad value is visible in a message).
std::string device_name(Device device);

// Accepts "cpu", "cpu:0", "cuda" (index 0) and "cuda:N" with N a decimal ordinal below 2^16.
// nullopt for anything else ("gpu", "cuda:", "cuda:-1", "cpu:1", "cuda:1x").
std::optional<Device> parse_device(std::string_view text);

}  // namespace weft
