#include "runtime/cpu_binding.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <utility>

#include <fmt/format.h>

namespace weft {

namespace {

// The number in a one-line sysfs file, or `fallback` when it cannot be read.
int read_number(const std::string& path, int fallback) {
  std::ifstream in(path);
  int value = fallback;
  if (!(in >> value)) return fallback;
  return value;
}

}  // namespace

std::vector<CpuInfo> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<CpuInfo> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string topology = fmt::format("/sys/devices/system/cpu/cpu{}/topology/", cpu);
    const int package = read_number(topology + "physical_package_id", 0);
    const int core = read_number(topology + "core_id", cpu);
    // Core ids repeat across packages: the key keeps them apart.
    cpus.push_back(CpuInfo{cpu, package * 1'000'000 + core});
  }
  return cpus;
}

std::vector<int> cpu_share(const std::vector<CpuInfo>& cpus, int local_rank, int local_size) {
  std::vector<int> share;
  if (local_size <= 0 || local_rank < 0 || local_rank >= local_size) return share;
  // Cores in the order of their first CPU, each with its allowed hardware threads.
  std::vector<std::vector<int>> cores;
  std::map<int, size_t> index_of_core;
  for (const CpuInfo& info : cpus) {
    auto [it, fresh] = index_of_core.emplace(info.core, cores.size());
    if (fresh) cores.emplace_back();
    cores[it->second].push_back(info.cpu);
  }
  const auto ranks = static_cast<size_t>(local_size);
  const auto rank = static_cast<size_t>(local_rank);
  if (ranks <= cores.size()) {
    // Whole cores, an equal run of them each; the cores left over stay unused, as mpirun leaves
    // them.
    const size_t per = cores.size() / ranks;
    for (size_t c = rank * per; c < (rank + 1) * per; ++c) {
      share.insert(share.end(), cores[c].begin(), cores[c].end());
    }
  } else if (ranks <= cpus.size()) {
    // Fewer cores than ranks: one hardware thread each, the cores' first threads before their
    // second ones, so that ranks share a core only when they must.
    std::vector<int> order;
    for (size_t thread = 0; order.size() < cpus.size(); ++thread) {
      for (const std::vector<int>& core : cores) {
        if (thread < core.size()) order.push_back(core[thread]);
      }
    }
    share.push_back(order[rank]);
  }
  std::sort(share.begin(), share.end());
  return share;
}

cpu_set_t cpu_mask(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  return set;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace weft
