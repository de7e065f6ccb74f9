// tests/support/multiproc.h: run a test body as N real processes (ranks) under a deadline.
//
// run_ranks(n, body) forks n children; child r runs body(r) and exits 0 when it returns, 1 when it
// throws (the exception's text goes to its stderr, which the parent captures). Past the deadline
// the parent kills every child still running and reports which ranks they were. Catch2 assertions
// must not be used inside body (they belong to the parent): use RANK_CHECK, which throws.
//
// Fork happens in the calling thread: objects owning threads (a TcpStoreServer) must be created
// inside body or after run_ranks, not shared across the fork.
#pragma once

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace weft::test {

struct RankResult {
  int rank = -1;
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the signal that ended it, 0 if none
  bool timed_out = false;
  std::string output;  // everything it wrote to stdout and stderr
};

std::vector<RankResult> run_ranks(int ranks, const std::function<void(int rank)>& body,
                                  std::chrono::milliseconds deadline = std::chrono::seconds(60));

// Text describing every rank that did not exit 0 (empty when all did), with its output.
std::string describe_failures(const std::vector<RankResult>& results);

// Runs the ranks and fails the current Catch2 test with describe_failures() unless all exit 0.
void run_ranks_ok(int ranks, const std::function<void(int rank)>& body,
                  std::chrono::milliseconds deadline = std::chrono::seconds(60));

// A TCP port on 127.0.0.1 that was free at the time of the call, chosen at random below the
// kernel's ephemeral range (net.ipv4.ip_local_port_range): a port from that range could be taken
// as the local end of some other test's outgoing connection before the store binds it. Falls
// back to a kernel-chosen port when no candidate below the range binds.
uint16_t free_port();

}  // namespace weft::test

// A check inside a rank's body: throws with file:line and the condition (and a formatted detail).
#define RANK_CHECK(cond, ...)                                                                     \
  do {                                                                                            \
    if (!(cond))                                                                                  \
      throw std::runtime_error(fmt::format("{}:{}: RANK_CHECK({}) failed {}", __FILE__, __LINE__, \
                                           #cond, fmt::format("" __VA_ARGS__)));                  \
  } while (0)
