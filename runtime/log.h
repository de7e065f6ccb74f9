// runtime/log.h: weft's logging, one line per event on stderr, prefixed with the rank.
//
//   weft W 15:02:11.123456 [rank 3] store 127.0.0.1:29500: closed connection from 10.0.0.7:4242
//
// The level comes from WEFT_LOG (default warn). Messages are formatted only when enabled.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include "weft/config.h"

namespace weft::log {

bool enabled(LogLevel level);
// Writes one line atomically (one write(2)); safe from any thread.
void write(LogLevel level, std::string_view message);
// The rank shown in every later line; -1 (the default) shows none.
void set_rank(int rank);
// Overrides WEFT_LOG for this process (tests, tools with a --verbose flag).
void set_level(LogLevel level);

}  // namespace weft::log

#define WEFT_LOG_AT(level, ...)                                                           \
  do {                                                                                    \
    if (::weft::log::enabled(level)) ::weft::log::write(level, fmt::format(__VA_ARGS__)); \
  } while (0)
#define WEFT_LOG_ERROR(...) WEFT_LOG_AT(::weft::LogLevel::Error, __VA_ARGS__)
#define WEFT_LOG_WARN(...) WEFT_LOG_AT(::weft::LogLevel::Warn, __VA_ARGS__)
#define WEFT_LOG_INFO(...) WEFT_LOG_AT(::weft::LogLevel::Info, __VA_ARGS__)
#define WEFT_LOG_DEBUG(...) WEFT_LOG_AT(::weft::LogLevel::Debug, __VA_ARGS__)
#define WEFT_LOG_TRACE(...) WEFT_LOG_AT(::weft::LogLevel::Trace, __VA_ARGS__)
