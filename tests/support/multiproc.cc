#include "tests/support/multiproc.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>

#include <catch2/catch.hpp>
#include <fmt/ranges.h>

namespace weft::test {
namespace {

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  // read end of the child's stdout+stderr
  bool done = false;
};

[[noreturn]] void run_child(int rank, const std::function<void(int)>& body, int write_fd) {
  dup2(write_fd, STDOUT_FILENO);
  dup2(write_fd, STDERR_FILENO);
  close(write_fd);
  int code = 0;
  try {
    body(rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d failed: %s\n", rank, e.what());
    code = 1;
  } catch (...) {
    std::fprintf(stderr, "rank %d failed with a non-std exception\n", rank);
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  // _exit: the child must not run the parent's atexit handlers or Catch2's reporters.
  _exit(code);
}

void drain(Child& child, std::string& output) {
  char buf[4096];
  for (;;) {
    ssize_t n = read(child.out_fd, buf, sizeof(buf));
    if (n > 0) {
      output.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
}

}  // namespace

std::vector<RankResult> run_ranks(int ranks, const std::function<void(int rank)>& body,
                                  std::chrono::milliseconds deadline) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<Child> children(ranks);
  std::vector<RankResult> results(ranks);
  for (int r = 0; r < ranks; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      close(fds[0]);
      run_child(r, body, fds[1]);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    children[r] = Child{pid, fds[0], false};
    results[r].rank = r;
  }
  auto end = std::chrono::steady_clock::now() + deadline;
  int remaining = ranks;
  while (remaining > 0) {
    // Block on the children's output pipes (an exit closes them) with a short cap, so that
    // exits are noticed promptly without spinning.
    std::vector<pollfd> pfds;
    for (auto& c : children) {
      if (!c.done) pfds.push_back(pollfd{c.out_fd, POLLIN, 0});
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    poll(pfds.data(), pfds.size(), static_cast<int>(std::min<int64_t>(left.count(), 50)));
    for (int r = 0; r < ranks; ++r) {
      Child& c = children[r];
      if (c.done) continue;
      drain(c, results[r].output);
      int status = 0;
      pid_t got = waitpid(c.pid, &status, WNOHANG);
      if (got == c.pid) {
        drain(c, results[r].output);
        close(c.out_fd);
        c.done = true;
        --remaining;
        if (WIFEXITED(status)) {
          results[r].exit_code = WEXITSTATUS(status);
        } else if (WIFSIGNALED(status)) {
          results[r].signal = WTERMSIG(status);
        }
      }
    }
  }
  for (int r = 0; r < ranks; ++r) {
    Child& c = children[r];
    if (c.done) continue;
    kill(c.pid, SIGKILL);
    int status = 0;
    waitpid(c.pid, &status, 0);
    drain(c, results[r].output);
    close(c.out_fd);
    results[r].timed_out = true;
    results[r].signal = SIGKILL;
  }
  return results;
}

std::string describe_failures(const std::vector<RankResult>& results) {
  std::string text;
  std::vector<int> stuck;
  for (const auto& r : results) {
    if (r.timed_out) stuck.push_back(r.rank);
  }
  if (!stuck.empty()) {
    text += fmt::format("deadline passed with ranks still running: {}\n", fmt::join(stuck, ", "));
  }
  for (const auto& r : results) {
    if (r.exit_code == 0 && !r.timed_out) continue;
    if (r.timed_out) {
      text += fmt::format("rank {}: killed at the deadline\n", r.rank);
    } else if (r.signal != 0) {
      text +=
          fmt::format("rank {}: killed by signal {} ({})\n", r.rank, r.signal, strsignal(r.signal));
    } else {
      text += fmt::format("rank {}: exit code {}\n", r.rank, r.exit_code);
    }
    if (!r.output.empty()) text += fmt::format("--- rank {} output ---\n{}\n", r.rank, r.output);
  }
  return text;
}

void run_ranks_ok(int ranks, const std::function<void(int rank)>& body,
                  std::chrono::milliseconds deadline) {
  auto results = run_ranks(ranks, body, deadline);
  std::string failures = describe_failures(results);
  INFO(failures);
  REQUIRE(failures.empty());
}

namespace {

// Binds a TCP socket to 127.0.0.1:port (0: the kernel chooses); returns the port bound, or 0.
uint16_t try_bind(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  uint16_t bound = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      bound = ntohs(addr.sin_port);
    }
  }
  close(fd);
  return bound;
}

// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
int ephemeral_low() {
  int low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}

}  // namespace

uint16_t free_port() {
  constexpr int kLowest = 10000;  // above the registered services most machines run
  const int high = ephemeral_low();
  if (high - kLowest >= 1000) {
    static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
    std::uniform_int_distribution<int> pick(kLowest, high - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const auto candidate = static_cast<uint16_t>(pick(rng));
      if (try_bind(candidate) == candidate) return candidate;
    }
  }
  return try_bind(0);
}

}  // namespace weft::test
