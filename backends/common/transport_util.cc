#include "backends/common/transport_util.h"

#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace weft::backends {

std::chrono::nanoseconds spin_budget_for(int local_ranks, std::chrono::nanoseconds budget) {
  unsigned cores = std::thread::hardware_concurrency();
  if (cores == 0 || static_cast<unsigned>(local_ranks) > cores) return std::chrono::nanoseconds(0);
  return budget;
}

std::string ranks_that(const std::vector<int>& ranks, std::string_view singular,
                       std::string_view plural) {
  if (ranks.size() == 1) return fmt::format("rank {} {}", ranks.front(), singular);
  return fmt::format("ranks {} {}", fmt::join(ranks, ", "), plural);
}

}  // namespace weft::backends
