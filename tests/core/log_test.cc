// Logging: the level filter, lazy formatting, and the line format on stderr.
#include "runtime/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <string>

#include <catch2/catch.hpp>

namespace weft {
namespace {

// Everything written to stderr while `body` runs. The pipe holds 64 KiB, far more than a few
// log lines, so the writes never block with nobody reading.
template <typename Body>
std::string capture_stderr(Body body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const int saved = dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  REQUIRE(dup2(fds[1], STDERR_FILENO) == STDERR_FILENO);
  close(fds[1]);
  body();
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  return out;
}

// True when `line` is "weft <letter> HH:MM:SS.uuuuuu <rest>\n". (Not std::regex: GCC 12 warns
// inside it under sanitizers, and warnings are errors.)
bool is_log_line(const std::string& line, char letter, const std::string& rest) {
  const std::string time_shape = "dd:dd:dd.dddddd";
  const std::string head = std::string("weft ") + letter + " ";
  if (line.size() != head.size() + time_shape.size() + 1 + rest.size() + 1) return false;
  if (line.compare(0, head.size(), head) != 0 || line.back() != '\n') return false;
  for (size_t i = 0; i < time_shape.size(); ++i) {
    const char c = line[head.size() + i];
    if (time_shape[i] == 'd' ? !std::isdigit(static_cast<unsigned char>(c)) : c != time_shape[i]) {
      return false;
    }
  }
  return line.compare(head.size() + time_shape.size(), std::string::npos, " " + rest + "\n") == 0;
}

TEST_CASE("a level enables itself and every more severe level", "[core][log]") {
  log::set_level(LogLevel::Info);
  CHECK(log::enabled(LogLevel::Error));
  CHECK(log::enabled(LogLevel::Warn));
  CHECK(log::enabled(LogLevel::Info));
  CHECK_FALSE(log::enabled(LogLevel::Debug));
  CHECK_FALSE(log::enabled(LogLevel::Trace));
  log::set_level(LogLevel::Error);
  CHECK(log::enabled(LogLevel::Error));
  CHECK_FALSE(log::enabled(LogLevel::Warn));
  log::set_level(LogLevel::Warn);
}

TEST_CASE("disabled log statements neither write nor format their arguments", "[core][log]") {
  log::set_level(LogLevel::Warn);
  int evaluated = 0;
  auto count = [&evaluated] { return ++evaluated; };
  const std::string out = capture_stderr([&] {
    WEFT_LOG_INFO("info {}", count());
    WEFT_LOG_DEBUG("debug {}", count());
    WEFT_LOG_TRACE("trace {}", count());
  });
  CHECK(out.empty());
  CHECK(evaluated == 0);
}

TEST_CASE("an enabled line carries level letter, time, rank and message", "[core][log]") {
  log::set_level(LogLevel::Debug);
  log::set_rank(3);
  const std::string with_rank = capture_stderr([] { WEFT_LOG_WARN("store {}: {}", "a", 42); });
  log::set_rank(-1);
  const std::string without_rank = capture_stderr([] { WEFT_LOG_DEBUG("plain"); });
  log::set_level(LogLevel::Warn);
  CHECK(is_log_line(with_rank, 'W', "[rank 3] store a: 42"));
  CHECK(is_log_line(without_rank, 'D', "plain"));
  CHECK_FALSE(is_log_line(without_rank, 'W', "plain"));  // the checker itself can fail
}

TEST_CASE("each level prints its own letter", "[core][log]") {
  log::set_level(LogLevel::Trace);
  const std::string out = capture_stderr([] {
    WEFT_LOG_ERROR("e");
    WEFT_LOG_WARN("w");
    WEFT_LOG_INFO("i");
    WEFT_LOG_DEBUG("d");
    WEFT_LOG_TRACE("t");
  });
  log::set_level(LogLevel::Warn);
  // Five lines, one per level, in order.
  std::string rest = out;
  for (char letter : {'E', 'W', 'I', 'D', 'T'}) {
    const size_t end = rest.find('\n');
    REQUIRE(end != std::string::npos);
    const std::string message(1, static_cast<char>(std::tolower(letter)));
    CHECK(is_log_line(rest.substr(0, end + 1), letter, message));
    rest.erase(0, end + 1);
  }
  CHECK(rest.empty());
}

}  // namespace
}  // namespace weft
