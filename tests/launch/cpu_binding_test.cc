// runtime/cpu_binding.h: how a node's CPUs are shared among its ranks, on made-up topologies
// (the machine running the test has whatever it has), and the text and mask forms.
#include "runtime/cpu_binding.h"

#include <sched.h>

#include <vector>

#include <catch2/catch.hpp>

namespace {

using weft::cpu_share;
using weft::CpuInfo;

// `cores` cores of `threads` hardware threads each, numbered as Linux does on x86: the first
// thread of every core, then the second of every core (cpu c + k * cores is thread k of core c).
std::vector<CpuInfo> topology(int cores, int threads) {
  std::vector<CpuInfo> cpus;
  for (int k = 0; k < threads; ++k) {
    for (int c = 0; c < cores; ++c) cpus.push_back(CpuInfo{c + k * cores, c});
  }
  return cpus;
}

std::vector<int> ints(std::initializer_list<int> list) { return list; }

TEST_CASE("ranks that fit the cores get whole cores, an equal run each", "[launch][binding]") {
  const auto cpus = topology(4, 2);  // 4 cores, 8 hardware threads
  CHECK(cpu_share(cpus, 0, 2) == ints({0, 1, 4, 5}));
  CHECK(cpu_share(cpus, 1, 2) == ints({2, 3, 6, 7}));
  CHECK(cpu_share(cpus, 3, 4) == ints({3, 7}));
  // 3 ranks on 4 cores: one core each, the fourth left unused (as mpirun leaves it).
  CHECK(cpu_share(cpus, 2, 3) == ints({2, 6}));
  // One rank: every core.
  CHECK(cpu_share(cpus, 0, 1) == ints({0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_CASE("more ranks than cores but not than threads: one thread each, cores shared last",
          "[launch][binding]") {
  const auto cpus = topology(2, 2);  // cpus 0,1 first threads; 2,3 second threads
  CHECK(cpu_share(cpus, 0, 3) == ints({0}));
  CHECK(cpu_share(cpus, 1, 3) == ints({1}));
  CHECK(cpu_share(cpus, 2, 3) == ints({2}));
  CHECK(cpu_share(cpus, 3, 4) == ints({3}));
}

TEST_CASE("ranks that outnumber the CPUs are not bound", "[launch][binding]") {
  CHECK(cpu_share(topology(2, 1), 0, 3).empty());
  CHECK(cpu_share(topology(2, 1), 2, 3).empty());
  CHECK(cpu_share({}, 0, 1).empty());
  // Out of range: nothing rather than a crash.
  CHECK(cpu_share(topology(2, 1), 2, 2).empty());
  CHECK(cpu_share(topology(2, 1), -1, 2).empty());
}

TEST_CASE("an affinity mask with gaps is shared as given", "[launch][binding]") {
  // taskset -c 2,3,6,9 on a machine without SMT.
  const std::vector<CpuInfo> cpus{{2, 2}, {3, 3}, {6, 6}, {9, 9}};
  CHECK(cpu_share(cpus, 0, 2) == ints({2, 3}));
  CHECK(cpu_share(cpus, 1, 2) == ints({6, 9}));
}

TEST_CASE("cpu lists print as taskset's and masks hold exactly the CPUs given",
          "[launch][binding]") {
  CHECK(weft::cpu_list_text({0, 1, 2, 3, 8}) == "0-3,8");
  CHECK(weft::cpu_list_text({1}) == "1");
  CHECK(weft::cpu_list_text({}).empty());
  const cpu_set_t mask = weft::cpu_mask({1, 5});
  CHECK(CPU_COUNT(&mask) == 2);
  CHECK(CPU_ISSET(1, &mask));
  CHECK(CPU_ISSET(5, &mask));
  const cpu_set_t none = weft::cpu_mask({});
  CHECK(CPU_COUNT(&none) == 0);
}

TEST_CASE("this process's CPUs are its affinity mask's", "[launch][binding]") {
  cpu_set_t set;
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  const std::vector<CpuInfo> cpus = weft::allowed_cpus();
  REQUIRE(static_cast<int>(cpus.size()) == CPU_COUNT(&set));
  for (const CpuInfo& info : cpus) CHECK(CPU_ISSET(info.cpu, &set));
}

}  // namespace
