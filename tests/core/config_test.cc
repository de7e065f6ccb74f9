// Config::from_env with a fake environment, parse_duration, and the process-wide config().
#include "weft/config.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/error.h"

namespace weft {
namespace {

using std::chrono::milliseconds;

Config parse(const std::map<std::string, std::string>& env) {
  return Config::from_env([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the Error that parsing `env` throws, after checking its code.
std::string parse_error(const std::map<std::string, std::string>& env) {
  try {
    parse(env);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    return e.what();
  }
  return "(accepted)";
}

TEST_CASE("an empty environment gives the documented defaults", "[core][config]") {
  const Config c = parse({});
  CHECK(c.log_level == LogLevel::Warn);
  CHECK(c.timeout == milliseconds(300'000));
  CHECK(c.store_token.empty());
  CHECK(c.shm);
  CHECK(c.debug == "off");
  CHECK(c.algo.empty());
  CHECK(c.spin_us == -1);
  CHECK(c.plugin_path.empty());
  CHECK(c.trace_buffer == 2000);
  CHECK(c.trace_dir.empty());
  CHECK(c.trace_poll == milliseconds(1000));
  CHECK(c.unknown.empty());
}

TEST_CASE("the flight recorder's variables parse, and bad values are named", "[core][config]") {
  const Config c = parse(
      {{"WEFT_TRACE_BUFFER", "0"}, {"WEFT_TRACE_DIR", "/tmp/dumps"}, {"WEFT_TRACE_POLL", "250ms"}});
  CHECK(c.trace_buffer == 0);
  CHECK(c.trace_dir == "/tmp/dumps");
  CHECK(c.trace_poll == milliseconds(250));
  CHECK(parse({{"WEFT_TRACE_BUFFER", "50000"}}).trace_buffer == 50000);
  for (const char* bad : {"-1", "lots", "20000000", "1e3"}) {
    CHECK_THAT(parse_error({{"WEFT_TRACE_BUFFER", bad}}),
               Catch::Contains("WEFT_TRACE_BUFFER") && Catch::Contains("0 (off)"));
  }
  CHECK_THAT(parse_error({{"WEFT_TRACE_POLL", "5ms"}}),
             Catch::Contains("WEFT_TRACE_POLL=\"5ms\"") && Catch::Contains("at least 10 ms"));
  CHECK_THAT(parse_error({{"WEFT_TRACE_POLL", "often"}}), Catch::Contains("WEFT_TRACE_POLL"));
}

TEST_CASE("every WEFT_ variable is parsed into its field", "[core][config]") {
  const Config c = parse({{"WEFT_LOG", "trace"},
                          {"WEFT_TIMEOUT", "2.5"},
                          {"WEFT_STORE_TOKEN", "s3cret"},
                          {"WEFT_SHM", "0"},
                          {"WEFT_DEBUG", "detail"},
                          {"WEFT_ALGO", "ring"},
                          {"WEFT_SPIN_US", "150"},
                          {"WEFT_PLUGIN_PATH", "/opt/a::/opt/b:"}});
  CHECK(c.log_level == LogLevel::Trace);
  CHECK(c.timeout == milliseconds(2500));
  CHECK(c.store_token == "s3cret");
  CHECK_FALSE(c.shm);
  CHECK(c.debug == "detail");
  CHECK(c.algo == "ring");
  CHECK(c.spin_us == 150);
  CHECK(c.plugin_path == std::vector<std::string>{"/opt/a", "/opt/b"});  // empty entries dropped
}

TEST_CASE("every log level name parses", "[core][config]") {
  for (LogLevel level :
       {LogLevel::Error, LogLevel::Warn, LogLevel::Info, LogLevel::Debug, LogLevel::Trace}) {
    CHECK(parse({{"WEFT_LOG", log_level_name(level)}}).log_level == level);
  }
}

TEST_CASE("boolean variables take 1/0, true/false, yes/no and on/off", "[core][config]") {
  for (const char* yes : {"1", "true", "yes", "on"}) CHECK(parse({{"WEFT_SHM", yes}}).shm);
  for (const char* no : {"0", "false", "no", "off"}) CHECK_FALSE(parse({{"WEFT_SHM", no}}).shm);
}

TEST_CASE("an empty value means unset for parsed variables", "[core][config]") {
  const Config c = parse({{"WEFT_LOG", ""}, {"WEFT_TIMEOUT", ""}, {"WEFT_SHM", ""}});
  CHECK(c.log_level == LogLevel::Warn);
  CHECK(c.timeout == milliseconds(300'000));
  CHECK(c.shm);
}

TEST_CASE("a malformed value raises InvalidArgument naming the variable and the value",
          "[core][config]") {
  CHECK(parse_error({{"WEFT_LOG", "loud"}}) ==
        "configuration: InvalidArgument: WEFT_LOG=\"loud\" is not valid; expected error, warn, "
        "info, debug or trace");
  CHECK_THAT(parse_error({{"WEFT_SHM", "maybe"}}), Catch::Contains("WEFT_SHM=\"maybe\""));
  CHECK_THAT(parse_error({{"WEFT_DEBUG", "all"}}),
             Catch::Contains("WEFT_DEBUG=\"all\"") && Catch::Contains("off or detail"));
  CHECK_THAT(parse_error({{"WEFT_TIMEOUT", "soon"}}),
             Catch::Contains("WEFT_TIMEOUT=\"soon\" is not a duration"));
  CHECK_THAT(parse_error({{"WEFT_LOG", "WARN"}}), Catch::Contains("WEFT_LOG"));  // exact case
  for (const char* bad : {"-1", "fast", "20us", "2000000", " 5"}) {
    CHECK_THAT(parse_error({{"WEFT_SPIN_US", bad}}),
               Catch::Contains("WEFT_SPIN_US") && Catch::Contains("microseconds"));
  }
  CHECK(parse({{"WEFT_SPIN_US", "auto"}}).spin_us == -1);
  CHECK(parse({{"WEFT_SPIN_US", "0"}}).spin_us == 0);
  for (const char* bad : {"-1", "16K", "1048577", " 5", "lots"}) {
    CHECK_THAT(parse_error({{"WEFT_SHM_SLOT_BYTES", bad}}),
               Catch::Contains(fmt::format("WEFT_SHM_SLOT_BYTES=\"{}\"", bad)) &&
                   Catch::Contains("bytes from 0 (off) to 1048576"));
  }
  CHECK(parse({}).shm_slot_bytes == 65536);
  CHECK(parse({{"WEFT_SHM_SLOT_BYTES", "0"}}).shm_slot_bytes == 0);
  CHECK(parse({{"WEFT_SHM_SLOT_BYTES", "1048576"}}).shm_slot_bytes == 1048576);
}

TEST_CASE("WEFT_TIMEOUT below 1 s is refused naming the variable and the minimum",
          "[core][config]") {
  for (const char* small : {"0", "0.0001", "999ms", "0s"}) {
    INFO(small);
    std::string message = parse_error({{"WEFT_TIMEOUT", small}});
    CHECK_THAT(message, Catch::Contains(fmt::format("WEFT_TIMEOUT=\"{}\"", small)) &&
                            Catch::Contains("at least 1 s"));
  }
  CHECK(parse({{"WEFT_TIMEOUT", "1"}}).timeout == milliseconds(1000));
  CHECK(parse({{"WEFT_TIMEOUT", "1000ms"}}).timeout == milliseconds(1000));
}

TEST_CASE("parse_duration reads seconds by default and ms, s, m and h units", "[core][config]") {
  CHECK(parse_duration("300", "T") == milliseconds(300'000));
  CHECK(parse_duration("2.5", "T") == milliseconds(2'500));
  CHECK(parse_duration("0", "T") == milliseconds(0));
  CHECK(parse_duration("500ms", "T") == milliseconds(500));
  CHECK(parse_duration("30s", "T") == milliseconds(30'000));
  CHECK(parse_duration("5m", "T") == milliseconds(300'000));
  CHECK(parse_duration("1h", "T") == milliseconds(3'600'000));
  CHECK(parse_duration("0.0004", "T") == milliseconds(0));  // rounds to the nearest ms
  CHECK(parse_duration("1.5ms", "T") == milliseconds(2));
}

TEST_CASE("parse_duration refuses negative, non-finite, unitless garbage and huge values",
          "[core][config]") {
  for (const char* bad : {"", "-1", "nan", "inf", "5 s", "5sec", "ms", "10d", "1e300", "1e13h"}) {
    INFO(bad);
    try {
      parse_duration(bad, "WEFT_TIMEOUT");
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      CHECK_THAT(e.what(), Catch::Contains("WEFT_TIMEOUT=\"" + std::string(bad) + "\""));
    }
  }
}

TEST_CASE("config() reads the real environment and lists unknown WEFT_ variables",
          "[core][config]") {
  // config() is parsed once per process, so the check runs in a child whose environment is set
  // before its first call; the exit status carries the verdict.
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setenv("WEFT_TIMEOUT", "7s", 1);
    setenv("WEFT_LOG", "error", 1);    // keeps the unknown-variable warning off the test output
    setenv("WEFT_TIMEOT", "1", 1);     // a typo
    setenv("WEFT_TEST_SEED", "1", 1);  // the test suite's own: not reported
    const Config& c = config();
    const bool ok = c.timeout == milliseconds(7'000) && c.log_level == LogLevel::Error &&
                    std::count(c.unknown.begin(), c.unknown.end(), "WEFT_TIMEOT") == 1 &&
                    std::count(c.unknown.begin(), c.unknown.end(), "WEFT_TEST_SEED") == 0 &&
                    &config() == &c;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace weft
