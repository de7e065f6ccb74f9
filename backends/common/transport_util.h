// backends/common/transport_util.h: small helpers every transport's set-up and wait loop share
// (the TCP backend's shared-memory and socket transports, the UCX transport).
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace weft::backends {

// A spin budget suited to `local_ranks` processes sharing this host's cores: 0 when they
// outnumber the cores, else `budget`. The default is about what sleeping costs (a futex wake-up
// took 12-15 us one-way in shm_ring_bench's ping-pong): spinning longer than that saves nothing.
std::chrono::nanoseconds spin_budget_for(
    int local_ranks, std::chrono::nanoseconds budget = std::chrono::microseconds(20));

// sched_yield() rounds a waiter makes before sleeping when ranks outnumber cores (spin budget 0):
// enough to hand the core to each rank sharing it once or twice; measured in docs/benchmarks.md.
inline constexpr int kOversubscribedYieldRounds = 8;

// "rank 3 <singular>" or "ranks 1, 3 <plural>": what set-up errors say of the ranks missing.
std::string ranks_that(const std::vector<int>& ranks, std::string_view singular,
                       std::string_view plural);

}  // namespace weft::backends
