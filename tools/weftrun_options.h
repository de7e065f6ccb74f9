// tools/weftrun_options.h: weftrun's command line, with torchrun's flag names.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::weftrun {

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;  // torchrun's default
  // One node, store on 127.0.0.1 at a port the kernel picks (no clash between concurrent jobs).
  bool standalone = false;
  // Prefix each output line with "[RANK]: " (--prefix). Off by default, as torchrun's, so that a
  // program's output reads under weftrun as it does alone (nccl-tests' log parsers).
  bool prefix = false;
  // After the first failure (or a forwarded signal), how long the other ranks get between
  // SIGTERM and SIGKILL.
  std::chrono::milliseconds grace_period{5000};
  // The job's id, exported to the ranks as WEFT_JOB_ID: rendezvous refuses a rank of another job,
  // and names in /dev/shm carry it. --rdzv-id when given (the same on every node); else random
  // on one node, and derived from --master-addr and --master-port across nodes, so that every
  // node's weftrun computes the same one.
  std::string job_id;
  // --bind-to core: each rank bound to its share of this node's cores (runtime/cpu_binding.h),
  // when the ranks fit them; none (the default, as torchrun): the scheduler places them.
  bool bind_to_core = false;
  bool help = false;
  // The program and its arguments.
  std::vector<std::string> command;
};

// The text --help prints.
std::string usage();

// Parses argv (without argv[0]). Throws std::invalid_argument with a one-line message for a bad
// flag, a bad value or a missing program; main prints it with the usage hint and exits 2.
Options parse_options(const std::vector<std::string>& args);

}  // namespace weft::weftrun
