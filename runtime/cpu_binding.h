// runtime/cpu_binding.h: which CPUs a launcher gives each rank of a node (`--bind-to core`).
//
// Open MPI's mpirun binds each rank to a core when the node's ranks fit its cores; weft's
// launchers (weftrun --bind-to core, weft-perf's own ranks) do the same, so that a benchmark
// of weft and one of Open MPI run under the same conditions, and so that two ranks whose threads
// spin for each other are never left by the scheduler on one core while the other idles
// (measured: docs/launching.md, "Binding ranks to cores").
//
// The plan divides the CPUs this process may use (its affinity mask: taskset, cgroups) among the
// node's ranks: whole cores (every allowed hardware thread of a core, from sysfs's topology) when
// the ranks fit the cores, single hardware threads when they fit only those, and nothing when the
// ranks outnumber the CPUs (then each may run anywhere, as Open MPI does when oversubscribed).
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <sched.h>

#include <string>
#include <vector>

namespace weft {

// One CPU the process may use and the core it belongs to (hardware threads of one core share
// `core`).
struct CpuInfo {
  int cpu = 0;
  int core = 0;
};

// The CPUs this process may run on (sched_getaffinity), ascending, each with its core from
// /sys/devices/system/cpu/cpuN/topology (its own CPU number when sysfs does not say).
std::vector<CpuInfo> allowed_cpus();

// The CPUs of rank `local_rank` of `local_size` ranks on `cpus` (see the header comment), in
// ascending order; empty when local_size exceeds cpus.size() (no binding).
// REQUIRES: 0 <= local_rank < local_size.
std::vector<int> cpu_share(const std::vector<CpuInfo>& cpus, int local_rank, int local_size);

// `cpus` as a mask for sched_setaffinity (built before a fork: setting it in the child is one
// system call, safe there).
cpu_set_t cpu_mask(const std::vector<int>& cpus);

// "0-3,8" for the CPUs given, ascending: what taskset and Open MPI's --report-bindings print.
std::string cpu_list_text(const std::vector<int>& cpus);

}  // namespace weft
