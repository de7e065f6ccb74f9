#include "weft/config.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/log.h"

extern char** environ;

namespace weft {
namespace {

// Every variable weft reads. Kept beside the parser so that a new one cannot be forgotten here.
// WEFT_JOB_ID is a launcher variable (runtime/launch_env.h reads it), and WEFT_LIBRARY and
// WEFT_TORCH_HOST belong to the Python package: listed so that they are not taken for typos.
constexpr std::array<std::string_view, 24> kKnownVariables = {
    "WEFT_LOG",           "WEFT_TIMEOUT",        "WEFT_STORE_TOKEN",     "WEFT_SHM",
    "WEFT_DEBUG",         "WEFT_ALGO",           "WEFT_SPIN_US",         "WEFT_PLUGIN_PATH",
    "WEFT_JOB_ID",        "WEFT_UCX_KEEPALIVE",  "WEFT_BACKEND",         "WEFT_HOST_ADDR",
    "WEFT_SOCKET_IFNAME", "WEFT_LIBRARY",        "WEFT_TORCH_HOST",      "WEFT_TRACE_BUFFER",
    "WEFT_TRACE_DIR",     "WEFT_TRACE_POLL",     "WEFT_NCCL_POLL",       "WEFT_NCCL_BLOCKING_WAIT",
    "WEFT_CUDA_HOME",     "WEFT_SHM_SLOT_BYTES", "WEFT_UCX_SINGLE_COPY", "WEFT_UCX_HOST_MEMORY",
};

// WEFT_TIMEOUT bounds every blocking call, rendezvous and connection set-up included, which take
// a few store round trips and connect retries (10 ms backoff, doubling): below a second, a
// healthy job on a loaded host fails at init with a Timeout that says nothing about the cause.
constexpr std::chrono::milliseconds kMinTimeout{1000};

[[noreturn]] void bad_value(const char* name, const char* value, std::string_view accepted) {
  throw_error(ErrorCode::InvalidArgument, "configuration",
              fmt::format("{}=\"{}\" is not valid; expected {}", name, value, accepted));
}

bool parse_bool(const char* name, const char* value) {
  std::string_view v(value);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  bad_value(name, value, "1/true/yes/on or 0/false/no/off");
}

LogLevel parse_log_level(const char* value) {
  std::string_view v(value);
  for (int i = 0; i <= static_cast<int>(LogLevel::Trace); ++i) {
    if (v == log_level_name(static_cast<LogLevel>(i))) return static_cast<LogLevel>(i);
  }
  bad_value("WEFT_LOG", value, "error, warn, info, debug or trace");
}

}  // namespace

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Error:
      return "error";
    case LogLevel::Warn:
      return "warn";
    case LogLevel::Info:
      return "info";
    case LogLevel::Debug:
      return "debug";
    case LogLevel::Trace:
      return "trace";
  }
  return "?";
}

std::chrono::milliseconds parse_duration(const std::string& text, const char* what) {
  auto fail = [&]() -> std::chrono::milliseconds {
    throw_error(ErrorCode::InvalidArgument, "configuration",
                fmt::format("{}=\"{}\" is not a duration; expected seconds (\"300\", \"2.5\") or a "
                            "number with a unit (\"500ms\", \"30s\", \"5m\", \"1h\")",
                            what, text));
  };
  // strtod alone would also take leading blanks, hex ("0x10") and exponents: accept only plain
  // decimal numbers.
  if (text.empty() || text.find_first_not_of("0123456789.msh") != std::string::npos) return fail();
  errno = 0;
  char* end = nullptr;
  double number = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || !std::isfinite(number) || number < 0) return fail();
  std::string_view unit(end);
  double ms_per_unit = 0;
  if (unit.empty() || unit == "s") {
    ms_per_unit = 1000;
  } else if (unit == "ms") {
    ms_per_unit = 1;
  } else if (unit == "m") {
    ms_per_unit = 60'000;
  } else if (unit == "h") {
    ms_per_unit = 3'600'000;
  } else {
    return fail();
  }
  double ms = number * ms_per_unit;
  if (ms > 1e15) return fail();
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

Config Config::from_env(const std::function<const char*(const char*)>& lookup) {
  Config c;
  if (const char* v = lookup("WEFT_LOG"); v && *v) c.log_level = parse_log_level(v);
  if (const char* v = lookup("WEFT_TIMEOUT"); v && *v) {
    c.timeout = parse_duration(v, "WEFT_TIMEOUT");
    if (c.timeout < kMinTimeout) {
      bad_value("WEFT_TIMEOUT", v,
                "at least 1 s (\"1\", \"1000ms\"): every blocking call, "
                "rendezvous included, must finish within it; there is no \"no timeout\"");
    }
  }
  if (const char* v = lookup("WEFT_STORE_TOKEN"); v) c.store_token = v;
  if (const char* v = lookup("WEFT_SHM"); v && *v) c.shm = parse_bool("WEFT_SHM", v);
  if (const char* v = lookup("WEFT_DEBUG"); v && *v) {
    std::string_view d(v);
    if (d != "off" && d != "detail") bad_value("WEFT_DEBUG", v, "off or detail");
    c.debug = v;
  }
  if (const char* v = lookup("WEFT_ALGO"); v) c.algo = v;
  if (const char* v = lookup("WEFT_BACKEND"); v) c.backend = v;
  if (const char* v = lookup("WEFT_SPIN_US"); v && *v && std::string_view(v) != "auto") {
    std::string_view text(v);
    int us = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), us);
    if (ec != std::errc() || end != text.data() + text.size() || us < 0 || us > 1'000'000) {
      bad_value("WEFT_SPIN_US", v, "auto or microseconds from 0 to 1000000");
    }
    c.spin_us = us;
  }
  if (const char* v = lookup("WEFT_SHM_SLOT_BYTES"); v && *v) {
    std::string_view text(v);
    size_t bytes = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), bytes);
    if (ec != std::errc() || end != text.data() + text.size() || bytes > (size_t{1} << 20)) {
      bad_value("WEFT_SHM_SLOT_BYTES", v, "bytes from 0 (off) to 1048576");
    }
    c.shm_slot_bytes = bytes;
  }
  if (const char* v = lookup("WEFT_PLUGIN_PATH"); v) {
    std::string_view rest(v);
    while (!rest.empty()) {
      size_t colon = rest.find(':');
      std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) c.plugin_path.emplace_back(dir);
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  if (const char* v = lookup("WEFT_HOST_ADDR"); v) c.host_addr = v;
  if (const char* v = lookup("WEFT_SOCKET_IFNAME"); v) c.socket_ifname = v;
  if (const char* v = lookup("WEFT_TRACE_BUFFER"); v && *v) {
    std::string_view text(v);
    size_t n = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc() || end != text.data() + text.size() || n > 10'000'000) {
      bad_value("WEFT_TRACE_BUFFER", v, "a number of operations from 0 (off) to 10000000");
    }
    c.trace_buffer = n;
  }
  if (const char* v = lookup("WEFT_TRACE_DIR"); v) c.trace_dir = v;
  if (const char* v = lookup("WEFT_TRACE_POLL"); v && *v) {
    c.trace_poll = parse_duration(v, "WEFT_TRACE_POLL");
    if (c.trace_poll < std::chrono::milliseconds(10)) {
      bad_value("WEFT_TRACE_POLL", v, "at least 10 ms");
    }
  }
  return c;
}

const Config& config() {
  static const Config instance = [] {
    Config c = Config::from_env([](const char* name) { return std::getenv(name); });
    for (char** env = environ; env && *env; ++env) {
      std::string_view entry(*env);
      if (!entry.starts_with("WEFT_")) continue;
      std::string_view name = entry.substr(0, entry.find('='));
      // WEFT_TEST_* belong to the test suite, not to the library.
      if (name.starts_with("WEFT_TEST_")) continue;
      if (std::find(kKnownVariables.begin(), kKnownVariables.end(), name) ==
          kKnownVariables.end()) {
        c.unknown.emplace_back(name);
      }
    }
    return c;
  }();
  static const bool warned = [] {
    for (const auto& name : instance.unknown) {
      if (static_cast<int>(LogLevel::Warn) <= static_cast<int>(instance.log_level)) {
        log::write(LogLevel::Warn,
                   fmt::format("unknown variable {} ignored (see docs/configuration.md)", name));
      }
    }
    return true;
  }();
  (void)warned;
  return instance;
}

}  // namespace weft
