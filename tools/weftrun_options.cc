#include "tools/weftrun_options.h"

#include <charconv>
#include <cmath>
#include <optional>
#include <random>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

namespace weft::weftrun {
namespace {

[[noreturn]] void bad(std::string message) { throw std::invalid_argument(std::move(message)); }

int64_t to_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
    bad(fmt::format("{} {}: expected an integer in {}..{}", flag, text, min, max));
  }
  return value;
}

std::chrono::milliseconds to_seconds(const std::string& flag, const std::string& text) {
  double seconds = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, seconds);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(seconds) || seconds < 0 ||
      seconds > 86400) {
    bad(fmt::format("{} {}: expected seconds in 0..86400", flag, text));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// torchrun accepts both --nproc-per-node and --nproc_per_node; so does weftrun.
std::string normalise(std::string_view flag) {
  std::string name(flag);
  for (size_t i = 2; i < name.size(); ++i) {
    if (name[i] == '_') name[i] = '-';
  }
  return name;
}

}  // namespace

std::string usage() {
  return R"(usage: weftrun [options] PROGRAM [ARGS...]

Starts --nproc-per-node copies of PROGRAM on this node with torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_USE_AGENT_STORE=True) and WEFT_JOB_ID, and, on node 0, hosts the job's TCP store
itself.
When a rank fails, the others get SIGTERM, then SIGKILL after the grace period, and weftrun
exits with the failed rank's exit code (128+N for signal N) and a summary on stderr.

options:
  --nproc-per-node N     ranks on this node (default 1)
  --nnodes N             nodes in the job (default 1)
  --node-rank N          this node's index, 0..nnodes-1 (default 0); only node 0 hosts the store
  --master-addr HOST     the store's host, node 0's address (default 127.0.0.1); a loopback
                         address keeps the store off the network
  --master-port PORT     the store's port (default 29500)
  --standalone           one node, store on 127.0.0.1 at a free port (ignores --master-*)
  --prefix               prefix each output line with "[RANK]: " (default: relay lines
                         unchanged, as torchrun does; --no-prefix says so explicitly)
  --grace-period SECS    time between SIGTERM and SIGKILL when stopping ranks (default 5)
  --rdzv-id ID           the job's id (WEFT_JOB_ID), the same on every node: ranks of another
                         job are refused (default: random on one node; from --master-addr and
                         --master-port across nodes)
  --bind-to core|none    core: bind each rank to its share of the cores weftrun may use, as
                         mpirun does, when the ranks fit them (else no binding, said once);
                         none: the scheduler places them (default, as torchrun)
  -h, --help             this text
Flags also take --flag=VALUE, and underscores (--nproc_per_node) as torchrun does.
docs/launching.md has the details.
)";
}

Options parse_options(const std::vector<std::string>& args) {
  Options options;
  bool addr_given = false;
  bool port_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    std::string flag = arg;
    std::optional<std::string> value;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    flag = normalise(flag);
    auto take_value = [&]() -> std::string {
      if (value) return *value;
      if (i + 1 >= args.size()) bad(fmt::format("{} needs a value", flag));
      return args[++i];
    };
    auto no_value = [&]() {
      if (value) bad(fmt::format("{} takes no value", flag));
    };
    if (flag == "-h" || flag == "--help") {
      no_value();
      options.help = true;
      return options;
    } else if (flag == "--nproc-per-node") {
      options.nproc_per_node = static_cast<int>(to_int(flag, take_value(), 1, 4096));
    } else if (flag == "--nnodes") {
      std::string text = take_value();
      if (text.find(':') != std::string::npos) {
        bad(fmt::format("--nnodes {}: elastic ranges are not supported; give one number", text));
      }
      options.nnodes = static_cast<int>(to_int(flag, text, 1, 1 << 20));
    } else if (flag == "--node-rank") {
      options.node_rank = static_cast<int>(to_int(flag, take_value(), 0, 1 << 20));
    } else if (flag == "--master-addr") {
      options.master_addr = take_value();
      if (options.master_addr.empty()) bad("--master-addr needs a host");
      addr_given = true;
    } else if (flag == "--master-port") {
      options.master_port = static_cast<uint16_t>(to_int(flag, take_value(), 1, 65535));
      port_given = true;
    } else if (flag == "--standalone") {
      no_value();
      options.standalone = true;
    } else if (flag == "--prefix") {
      no_value();
      options.prefix = true;
    } else if (flag == "--no-prefix") {
      no_value();
      options.prefix = false;
    } else if (flag == "--grace-period") {
      options.grace_period = to_seconds(flag, take_value());
    } else if (flag == "--bind-to") {
      const std::string how = take_value();
      if (how != "core" && how != "none") {
        bad(fmt::format("--bind-to {}: expected core or none", how));
      }
      options.bind_to_core = how == "core";
    } else if (flag == "--rdzv-id") {
      options.job_id = take_value();
      if (options.job_id.empty()) bad("--rdzv-id needs an id");
    } else {
      bad(fmt::format("unknown option {}", arg));
    }
  }
  options.command.assign(args.begin() + static_cast<ptrdiff_t>(i), args.end());
  if (options.command.empty()) bad("no program given");
  if (options.node_rank >= options.nnodes) {
    bad(fmt::format("--node-rank {} is out of range for --nnodes {} (expected 0..{})",
                    options.node_rank, options.nnodes, options.nnodes - 1));
  }
  if (options.standalone) {
    if (options.nnodes != 1) bad("--standalone runs one node: drop --nnodes or --standalone");
    if (addr_given || port_given) bad("--standalone picks the store's address: drop --master-*");
    options.master_addr = "127.0.0.1";
    options.master_port = 0;
  }
  if (static_cast<int64_t>(options.nnodes) * options.nproc_per_node > (1 << 24)) {
    bad("--nnodes x --nproc-per-node is larger than 16777216 ranks");
  }
  if (options.job_id.empty() && options.nnodes == 1) {
    options.job_id = fmt::format("wr{:08x}{:08x}", std::random_device{}(), std::random_device{}());
  } else if (options.job_id.empty()) {
    // Every node's weftrun must agree without talking; two multi-node jobs given the same store
    // address get the same id, as a launch by hand would (docs/launching.md).
    options.job_id = fmt::format("wr-{}-{}", options.master_addr, options.master_port);
  }
  return options;
}

}  // namespace weft::weftrun
