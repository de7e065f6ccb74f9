// weft-store as a subprocess: prints its address, serves clients, exits 0 on SIGTERM, and refuses
// bad arguments with exit code 2. WEFT_TEST_STORE_BIN (set by meson) is the binary under test.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/store_protocol/raw_client.h"

namespace weft::test {
namespace {

constexpr uint8_t SET = 1, GET = 3;

std::string binary() {
  const char* path = std::getenv("WEFT_TEST_STORE_BIN");
  if (path == nullptr) FAIL("WEFT_TEST_STORE_BIN is not set (run through meson test)");
  return path;
}

// A child process with its stdout on a pipe; killed on destruction if still running.
class Child {
 public:
  Child(std::vector<std::string> args, std::vector<std::string> env_add = {}) {
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      for (const auto& kv : env_add) ::putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    stdout_fd_ = out[0];
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(stdout_fd_);
  }

  // Reads stdout until a full line arrives or the deadline passes.
  std::string read_line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string line;
    while (line.find('\n') == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{stdout_fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[256];
      ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    return line;
  }

  // The exit status once it exits, or nullopt when it is still running at the deadline. The
  // child's exit closes its end of the stdout pipe, so EOF there is the signal to reap it.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{stdout_fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        return std::nullopt;
      }
      char buf[256];
      if (::read(stdout_fd_, buf, sizeof(buf)) <= 0) break;
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
};

}  // namespace

TEST_CASE("weft-store prints its port, serves a client and exits 0 on SIGTERM",
          "[store_protocol][tools]") {
  Child child({binary(), "--host", "127.0.0.1", "--port", "0"});
  std::string line = child.read_line(std::chrono::seconds(10));
  std::smatch m;
  REQUIRE(
      std::regex_search(line, m, std::regex("^weft-store listening on 127\\.0\\.0\\.1:(\\d+)\n")));
  auto port = static_cast<uint16_t>(std::stoi(m[1].str()));
  REQUIRE(port != 0);

  RawClient c(port);
  c.send(Frame().u8(SET).str("/k").str("from-test"));
  c.send(Frame().u8(GET).str("/k"));
  CHECK(c.read(17) == reply_bytes("from-test"));

  REQUIRE(::kill(child.pid(), SIGTERM) == 0);
  CHECK(child.wait_exit(std::chrono::seconds(10)) == std::optional<int>(0));
}

TEST_CASE("weft-store exits 0 on SIGINT too", "[store_protocol][tools]") {
  Child child({binary(), "--host", "127.0.0.1", "--port", "0"});
  REQUIRE(child.read_line(std::chrono::seconds(10)).find("listening") != std::string::npos);
  REQUIRE(::kill(child.pid(), SIGINT) == 0);
  CHECK(child.wait_exit(std::chrono::seconds(10)) == std::optional<int>(0));
}

TEST_CASE("weft-store refuses bad arguments with exit code 2", "[store_protocol][tools]") {
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"--port", "70000"},
           {"--port", "12ab"},
           {"--port"},
           {"--bogus"},
           {"--host", ""},
       }) {
    args.insert(args.begin(), binary());
    Child child(args);
    CHECK(child.wait_exit(std::chrono::seconds(10)) == std::optional<int>(2));
  }
}

TEST_CASE("weft-store --token-env refuses to start without WEFT_STORE_TOKEN",
          "[store_protocol][tools]") {
  ::unsetenv("WEFT_STORE_TOKEN");
  Child child({binary(), "--port", "0", "--token-env"});
  CHECK(child.wait_exit(std::chrono::seconds(10)) == std::optional<int>(2));
}

TEST_CASE("weft-store --help prints usage and exits 0", "[store_protocol][tools]") {
  Child child({binary(), "--help"});
  CHECK(child.read_line(std::chrono::seconds(10)).find("usage: weft-store") == 0);
  CHECK(child.wait_exit(std::chrono::seconds(10)) == std::optional<int>(0));
}

}  // namespace weft::test
