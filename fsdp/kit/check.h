// fsdp/kit/check.h: argument and invariant checks for the kit, which links nothing of weft's.
//
// WEFT_KIT_CHECK(cond, "format {}", args...) throws std::invalid_argument with the formatted
// message, then the condition and file:line. The kit's callers are the FSDP engine and tests, so
// a failed check is a misuse of the kit (a shape that does not match, a dtype a kernel lacks);
// it is reported, never assumed away.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace weft::kit::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* condition,
                                      const std::string& message) {
  throw std::invalid_argument(
      fmt::format("{} (check {} failed at {}:{})", message, condition, file, line));
}
}  // namespace weft::kit::detail

#define WEFT_KIT_CHECK(cond, ...)                                                             \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::weft::kit::detail::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
