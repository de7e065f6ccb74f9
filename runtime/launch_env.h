// runtime/launch_env.h: what a launcher told this process, read from its environment, and the
// store URLs that rendezvous() accepts.
//
// Three launcher conventions are understood, tried in this order (the first whose rank variable
// is set wins; docs/launching.md has the full table):
//   torchrun / weftrun / by hand: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//                                 MASTER_PORT (and TORCHELASTIC_USE_AGENT_STORE,
//                                 TORCHELASTIC_RUN_ID, WEFT_JOB_ID)
//   Slurm (srun):                 SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first host of
//                                 SLURM_STEP_NODELIST or SLURM_JOB_NODELIST, SLURM_JOB_ID
//   Open MPI (mpirun):            OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE},
//                                 OMPI_MCA_ess_base_jobid (4.x) or PMIX_NAMESPACE (5.x)
// Under Slurm and Open MPI, MASTER_ADDR / MASTER_PORT still name the store when set; otherwise
// the store lives on the job's first host (127.0.0.1 when every rank is on this host) at
// derived_store_port(job id), so `srun prog` and `mpirun -np 4 prog` need no extra flags.
//
// Everything here is pure: the environment comes in through a lookup function, so tests pass a
// synthetic one. Errors are Error(InvalidArgument) naming the variable and what was expected.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

// The launcher's name for the job a process belongs to, when it gives one: `variable` says where
// it came from ("WEFT_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID.SLURM_STEP_ID", ...),
// `value` is its value. Both empty when the environment names no job (a launch by hand).
struct JobId {
  std::string variable;
  std::string value;

  bool empty() const { return value.empty(); }
  // "WEFT_JOB_ID=wr-1f2e", or "no job id" when empty: how messages name a job.
  std::string text() const;
};

// Where this process sits in the job and where the job's store is.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this host
  int local_world_size = 1;  // processes on this host
  std::string master_addr;   // the store's host (rank 0 binds it unless agent_store)
  uint16_t master_port = 0;
  // True under torchrun/weftrun (TORCHELASTIC_USE_AGENT_STORE=True): the launcher already hosts
  // the store at master_addr:master_port, so rank 0 connects to it as a client.
  bool agent_store = false;
  // The job this process belongs to (launcher_job_id()); rendezvous refuses a rank of another.
  JobId job;
  // Which convention supplied rank and size: "torchrun", "slurm", "openmpi" or "explicit" (the
  // caller's URL or options; set by rendezvous(), never by parse_launch_env()).
  std::string source;
};

// Looks up an environment variable; nullptr when unset (getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

// Reads the first launcher convention present. Throws Error(InvalidArgument) when none is
// present, or a value is missing or malformed ("RANK=4 is out of range for WORLD_SIZE=4").
LaunchInfo parse_launch_env(const EnvLookup& lookup);

// The job id in the environment: WEFT_JOB_ID when set (weftrun exports it; set it by hand to
// tell hand-launched jobs apart), else the launcher's own, the convention named by `source`
// ("torchrun", "slurm", "openmpi") tried first: TORCHELASTIC_RUN_ID; SLURM_JOB_ID (or
// SLURM_JOBID) with SLURM_STEP_ID, so two steps of one allocation are two jobs;
// OMPI_MCA_ess_base_jobid (Open MPI 4.x) or PMIX_NAMESPACE (5.x). Empty when none is set.
JobId launcher_job_id(const EnvLookup& lookup, std::string_view source = "");

// True when TORCHELASTIC_USE_AGENT_STORE says the launcher hosts the store ("True", as torchrun
// and weftrun write it; "true" and "1" too).
bool agent_store_requested(const EnvLookup& lookup);

// Expands a Slurm host list: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5. Zero
// padding of a range's first bound is kept; several bracket groups in one name expand as a
// product ("rack[1-2]-n[1-2]" -> rack1-n1 rack1-n2 rack2-n1 rack2-n2). Throws
// Error(InvalidArgument) on unbalanced brackets, reversed ranges or an empty list.
std::vector<std::string> expand_slurm_nodelist(std::string_view nodelist);

// The store port used under Slurm and Open MPI when MASTER_PORT is unset: 10000 + job_id % 20000,
// so 10000..29999, below Linux's ephemeral range (32768..60999) where the kernel picks client
// ports, and the same on every rank of a job without any exchange.
uint16_t derived_store_port(uint64_t job_id);

// The address a store server for master_addr binds: master_addr itself when it is a loopback
// name or an IP literal (so a loopback MASTER_ADDR keeps the store off the network); every IPv4
// interface ("0.0.0.0") for any other host name, because a host's own name often resolves to a
// loopback alias (Debian's 127.0.1.1) that remote ranks could not reach.
std::string store_bind_address(const std::string& master_addr);

// A parsed store URL:
//   env://                                  the launcher's environment (parse_launch_env)
//   tcp://HOST:PORT[?rank=R&world_size=N]   a TCP store; IPv6 hosts in brackets ("[::1]:29500")
//   file:///ABS/PATH[?rank=R&world_size=N]  a FileStore on that path
struct StoreUrl {
  enum class Scheme { Env, Tcp, File };
  Scheme scheme = Scheme::Env;
  std::string host;   // tcp: without brackets
  uint16_t port = 0;  // tcp
  std::string path;   // file: absolute
  std::optional<int> rank;
  std::optional<int> world_size;
};

// Throws Error(InvalidArgument) naming the URL and the part that is wrong: an unknown scheme,
// a missing or out-of-range port, a relative path, an unknown or malformed query parameter.
StoreUrl parse_store_url(std::string_view url);

}  // namespace weft
