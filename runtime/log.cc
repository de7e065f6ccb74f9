#include "runtime/log.h"

#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace weft::log {
namespace {

std::atomic<int> g_rank{-1};
// -1: not yet read from the environment.
std::atomic<int> g_level{-1};

int current_level() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level < 0) {
    level = static_cast<int>(config().log_level);
    g_level.store(level, std::memory_order_relaxed);
  }
  return level;
}

char level_letter(LogLevel level) {
  switch (level) {
    case LogLevel::Error:
      return 'E';
    case LogLevel::Warn:
      return 'W';
    case LogLevel::Info:
      return 'I';
    case LogLevel::Debug:
      return 'D';
    case LogLevel::Trace:
      return 'T';
  }
  return '?';
}

}  // namespace

bool enabled(LogLevel level) { return static_cast<int>(level) <= current_level(); }

void write(LogLevel level, std::string_view message) {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm local{};
  localtime_r(&tv.tv_sec, &local);
  std::string line = fmt::format("weft {} {:02}:{:02}:{:02}.{:06} ", level_letter(level),
                                 local.tm_hour, local.tm_min, local.tm_sec, tv.tv_usec);
  int rank = g_rank.load(std::memory_order_relaxed);
  if (rank >= 0) line += fmt::format("[rank {}] ", rank);
  line += message;
  line += '\n';
  // One write(2) so that lines from several threads and processes do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

void set_rank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

void set_level(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

}  // namespace weft::log
