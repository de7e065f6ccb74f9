#include "backends/nccl/nccl_settings.h"

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"

namespace weft::nccl {
namespace {

// The watchdog period's bounds: below 1 ms the poll costs CPU for nothing (NCCL's own proxy
// thread polls at that rate); above 1 s a timeout or a peer's death goes unnoticed too long.
constexpr std::chrono::milliseconds kMinPoll{1};
constexpr std::chrono::milliseconds kMaxPoll{1000};

std::chrono::milliseconds parse_poll(const std::string& value, const std::string& name) {
  std::chrono::milliseconds poll = parse_duration(value, name.c_str());
  if (poll < kMinPoll || poll > kMaxPoll) {
    throw_error(
        ErrorCode::InvalidArgument, "configuration",
        fmt::format("{}=\"{}\" is not valid; expected a duration from 1ms to 1s", name, value));
  }
  return poll;
}

bool parse_flag(const std::string& value, const std::string& name) {
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "off") return false;
  throw_error(
      ErrorCode::InvalidArgument, "configuration",
      fmt::format("{}=\"{}\" is not valid; expected 1/true/yes/on or 0/false/no/off", name, value));
}

}  // namespace

NcclSettings parse_nccl_settings(const std::function<const char*(const char*)>& getenv,
                                 const std::map<std::string, std::string>& settings) {
  NcclSettings parsed;
  // Each knob: the variable first (empty counts as unset), then the group's setting over it.
  auto read = [&](const char* variable, const char* key, auto&& apply) {
    const char* value = getenv(variable);
    if (value != nullptr && value[0] != '\0') apply(std::string(value), std::string(variable));
    auto it = settings.find(key);
    if (it != settings.end()) apply(it->second, fmt::format("setting \"{}\"", key));
  };
  read("WEFT_NCCL_POLL", "nccl_poll", [&](const std::string& value, const std::string& name) {
    parsed.poll = parse_poll(value, name);
  });
  read("WEFT_NCCL_BLOCKING_WAIT", "nccl_blocking_wait",
       [&](const std::string& value, const std::string& name) {
         parsed.blocking_wait = parse_flag(value, name);
       });
  return parsed;
}

}  // namespace weft::nccl
