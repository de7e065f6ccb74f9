// runtime/store_common.h: what the in-process and file stores share, so that they agree on every
// detail a caller can observe: counters as decimal text, how timeouts are checked, and how keys
// are quoted in error messages.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/store.h"

namespace weft::store_detail {

// The counter add() keeps at a key. An absent key and an empty value count as 0 (c10d's add
// treats both so). Anything else must be optional '-' then decimal digits, the form
// std::to_string writes, within int64_t: `where` and `key` name the culprit otherwise.
inline int64_t parse_counter(const Bytes& value, std::string_view where, const std::string& key) {
  if (value.empty()) return 0;
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  int64_t parsed = 0;
  auto [stop, ec] = std::from_chars(begin, end, parsed);
  if (ec != std::errc() || stop != end) {
    std::string shown(begin, std::min<size_t>(value.size(), 32));
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("add on key \"{}\": its value \"{}\"{} is not a decimal integer", key,
                            shown, value.size() > 32 ? "..." : ""));
  }
  return parsed;
}

// current + delta, refusing to wrap around.
inline int64_t add_counter(int64_t current, int64_t delta, std::string_view where,
                           const std::string& key) {
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    throw_error(
        ErrorCode::InvalidArgument, where,
        fmt::format("add {} to key \"{}\" holding {} overflows int64", delta, key, current));
  }
  return sum;
}

inline Bytes format_counter(int64_t value) { return to_bytes(std::to_string(value)); }

// A timeout as given to a store call after kDefaultTimeout was resolved: negative ones are the
// caller's mistake (0 is allowed and means "do not wait").
inline void check_timeout(std::chrono::milliseconds timeout, std::string_view where) {
  if (timeout.count() < 0) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("timeout {} ms is negative (use Store::kDefaultTimeout for the "
                            "store's own)",
                            timeout.count()));
  }
}

// `"a", "b"` for messages.
inline std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) {
    if (!out.empty()) out += ", ";
    out += fmt::format("\"{}\"", key);
  }
  return out;
}

// Throws the Timeout every wait ends with: "after 100 ms waiting for key "a"" or, for several,
// "after 100 ms waiting for keys "a", "b" (missing: "b")".
[[noreturn]] inline void throw_wait_timeout(std::string_view where,
                                            std::chrono::milliseconds timeout,
                                            const std::vector<std::string>& keys,
                                            const std::vector<std::string>& missing) {
  if (keys.size() == 1) {
    throw_error(ErrorCode::Timeout, where,
                fmt::format("after {} ms waiting for key \"{}\"", timeout.count(), keys[0]));
  }
  throw_error(ErrorCode::Timeout, where,
              fmt::format("after {} ms waiting for keys {} (missing: {})", timeout.count(),
                          quote_keys(keys), quote_keys(missing)));
}

inline void check_multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                            std::string_view where) {
  if (keys.size() != values.size()) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{} keys but {} values", keys.size(), values.size()));
  }
}

}  // namespace weft::store_detail
