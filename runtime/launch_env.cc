#include "runtime/launch_env.h"

#include <arpa/inet.h>

#include <charconv>
#include <limits>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/socket.h"

namespace weft {
namespace {

constexpr std::string_view kWhere = "launch environment";
// A Slurm host list that expands past this is refused rather than filling memory: the largest
// machines have tens of thousands of nodes.
constexpr size_t kMaxSlurmHosts = 1 << 20;

[[noreturn]] void invalid(std::string_view detail) {
  throw_error(ErrorCode::InvalidArgument, kWhere, detail);
}

std::optional<std::string> get(const EnvLookup& lookup, const char* name) {
  const char* value = lookup(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

bool parse_i64(std::string_view text, int64_t* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

std::optional<int64_t> to_int(std::string_view text) {
  int64_t value = 0;
  if (!parse_i64(text, &value)) return std::nullopt;
  return value;
}

// The integer in variable `name`, which must lie in [min, max]; `expected` words the range.
int64_t parse_int(const std::string& name, const std::string& text, int64_t min, int64_t max,
                  std::string_view expected) {
  std::optional<int64_t> value = to_int(text);
  if (!value) invalid(fmt::format("{}='{}' is not an integer (expected {})", name, text, expected));
  if (*value < min || *value > max) {
    invalid(fmt::format("{}={} is out of range (expected {})", name, *value, expected));
  }
  return *value;
}

int required_int(const EnvLookup& lookup, const char* name, int64_t min, int64_t max,
                 std::string_view expected, std::string_view convention) {
  std::optional<std::string> text = get(lookup, name);
  if (!text) invalid(fmt::format("{} is not set ({}; expected {})", name, convention, expected));
  return static_cast<int>(parse_int(name, *text, min, max, expected));
}

constexpr int kMaxInt = std::numeric_limits<int>::max();

uint16_t parse_port(const std::string& name, const std::string& text) {
  return static_cast<uint16_t>(parse_int(name, text, 1, 65535, "a TCP port, 1..65535"));
}

// Checks rank < world_size and local_rank < local_world_size <= world_size; names the variables.
void check_ranks(const LaunchInfo& info, std::string_view rank_name, std::string_view size_name,
                 std::string_view local_rank_name, std::string_view local_size_name) {
  if (info.rank >= info.world_size) {
    invalid(fmt::format("{}={} is out of range for {}={} (expected 0..{})", rank_name, info.rank,
                        size_name, info.world_size, info.world_size - 1));
  }
  if (info.local_world_size > info.world_size) {
    invalid(fmt::format("{}={} is larger than {}={}", local_size_name, info.local_world_size,
                        size_name, info.world_size));
  }
  if (info.local_rank >= info.local_world_size) {
    invalid(fmt::format("{}={} is out of range for {}={} (expected 0..{})", local_rank_name,
                        info.local_rank, local_size_name, info.local_world_size,
                        info.local_world_size - 1));
  }
}

std::string master_addr_from_env(const EnvLookup& lookup) {
  std::optional<std::string> addr = get(lookup, "MASTER_ADDR");
  if (addr && addr->empty()) invalid("MASTER_ADDR is set but empty (expected a host name or IP)");
  return addr.value_or("");
}

LaunchInfo parse_torchrun(const EnvLookup& lookup) {
  constexpr std::string_view kConvention = "torchrun convention, found RANK or WORLD_SIZE";
  LaunchInfo info;
  info.source = "torchrun";
  info.rank = required_int(lookup, "RANK", 0, kMaxInt, "an integer >= 0", kConvention);
  info.world_size = required_int(lookup, "WORLD_SIZE", 1, kMaxInt, "an integer >= 1", kConvention);
  // Set by torchrun and weftrun; a hand-written environment may leave them out, which reads as
  // "every rank on this host".
  std::optional<std::string> local_rank = get(lookup, "LOCAL_RANK");
  std::optional<std::string> local_size = get(lookup, "LOCAL_WORLD_SIZE");
  info.local_rank =
      local_rank
          ? static_cast<int>(parse_int("LOCAL_RANK", *local_rank, 0, kMaxInt, "an integer >= 0"))
          : info.rank;
  info.local_world_size = local_size ? static_cast<int>(parse_int("LOCAL_WORLD_SIZE", *local_size,
                                                                  1, kMaxInt, "an integer >= 1"))
                                     : info.world_size;
  check_ranks(info, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  info.master_addr = master_addr_from_env(lookup);
  if (info.master_addr.empty()) {
    invalid(
        "MASTER_ADDR is not set (torchrun convention: RANK and WORLD_SIZE need MASTER_ADDR "
        "and MASTER_PORT to find the store)");
  }
  std::optional<std::string> port = get(lookup, "MASTER_PORT");
  if (!port) {
    invalid(
        "MASTER_PORT is not set (torchrun convention: RANK and WORLD_SIZE need MASTER_ADDR "
        "and MASTER_PORT to find the store)");
  }
  info.master_port = parse_port("MASTER_PORT", *port);
  info.agent_store = agent_store_requested(lookup);
  info.job = launcher_job_id(lookup, info.source);
  return info;
}

// FNV-1a, 64-bit: a stable hash for job ids that are not numbers (PMIx namespaces).
uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

// Slurm's per-node task counts: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_tasks_per_node(const std::string& name, const std::string& text) {
  std::vector<int> counts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int64_t repeat = 1;
    size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      if (item.back() != ')') invalid(fmt::format("{}='{}' is malformed", name, text));
      repeat = parse_int(name, item.substr(paren + 2, item.size() - paren - 3), 1, kMaxSlurmHosts,
                         "counts like \"2(x3),1\"");
      item.resize(paren);
    }
    int count = static_cast<int>(parse_int(name, item, 1, kMaxInt, "counts like \"2(x3),1\""));
    if (counts.size() + static_cast<size_t>(repeat) > kMaxSlurmHosts) {
      invalid(fmt::format("{} lists more than {} nodes", name, kMaxSlurmHosts));
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts;
}

LaunchInfo parse_slurm(const EnvLookup& lookup) {
  constexpr std::string_view kConvention = "Slurm convention, found SLURM_PROCID";
  LaunchInfo info;
  info.source = "slurm";
  info.rank = required_int(lookup, "SLURM_PROCID", 0, kMaxInt, "an integer >= 0", kConvention);
  info.world_size =
      required_int(lookup, "SLURM_NTASKS", 1, kMaxInt, "an integer >= 1", kConvention);
  info.local_rank =
      required_int(lookup, "SLURM_LOCALID", 0, kMaxInt, "an integer >= 0", kConvention);

  // srun describes its step; a batch script only has the job's allocation.
  const char* nodelist_name = "SLURM_STEP_NODELIST";
  std::optional<std::string> nodelist = get(lookup, nodelist_name);
  if (!nodelist) {
    nodelist_name = "SLURM_JOB_NODELIST";
    nodelist = get(lookup, nodelist_name);
  }
  std::vector<std::string> hosts;
  if (nodelist) hosts = expand_slurm_nodelist(*nodelist);

  const char* tasks_name = "SLURM_STEP_TASKS_PER_NODE";
  std::optional<std::string> tasks = get(lookup, tasks_name);
  if (!tasks) {
    tasks_name = "SLURM_TASKS_PER_NODE";
    tasks = get(lookup, tasks_name);
  }
  std::optional<std::string> node_id = get(lookup, "SLURM_NODEID");
  if (tasks && node_id) {
    std::vector<int> counts = expand_tasks_per_node(tasks_name, *tasks);
    int64_t node = parse_int("SLURM_NODEID", *node_id, 0, kMaxInt, "an integer >= 0");
    if (node >= static_cast<int64_t>(counts.size())) {
      invalid(fmt::format("SLURM_NODEID={} is out of range for {}='{}' ({} nodes)", node,
                          tasks_name, *tasks, counts.size()));
    }
    info.local_world_size = counts[static_cast<size_t>(node)];
  } else {
    // Without the per-node counts, assume srun's default block distribution over the nodes.
    int nodes = hosts.empty() ? 1 : static_cast<int>(hosts.size());
    info.local_world_size = (info.world_size + nodes - 1) / nodes;
  }
  check_ranks(info, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
              tasks ? tasks_name : "the tasks per node");

  info.master_addr = master_addr_from_env(lookup);
  if (info.master_addr.empty()) {
    if (hosts.empty()) {
      invalid(
          "neither MASTER_ADDR nor SLURM_STEP_NODELIST / SLURM_JOB_NODELIST is set (Slurm "
          "convention: the store is on the first host of the job)");
    }
    // One host: keep the store on loopback, off the network.
    info.master_addr = hosts.size() == 1 ? "127.0.0.1" : hosts.front();
  }
  std::optional<std::string> port = get(lookup, "MASTER_PORT");
  if (port) {
    info.master_port = parse_port("MASTER_PORT", *port);
  } else {
    const char* job_name = "SLURM_JOB_ID";
    std::optional<std::string> job = get(lookup, job_name);
    if (!job) {
      job_name = "SLURM_JOBID";
      job = get(lookup, job_name);
    }
    if (!job) {
      invalid(
          "neither MASTER_PORT nor SLURM_JOB_ID is set (Slurm convention: the store port is "
          "derived from the job id)");
    }
    info.master_port = derived_store_port(static_cast<uint64_t>(
        parse_int(job_name, *job, 0, std::numeric_limits<int64_t>::max(), "a numeric job id")));
  }
  info.job = launcher_job_id(lookup, info.source);
  return info;
}

LaunchInfo parse_openmpi(const EnvLookup& lookup) {
  constexpr std::string_view kConvention = "Open MPI convention, found OMPI_COMM_WORLD_RANK";
  LaunchInfo info;
  info.source = "openmpi";
  info.rank =
      required_int(lookup, "OMPI_COMM_WORLD_RANK", 0, kMaxInt, "an integer >= 0", kConvention);
  info.world_size =
      required_int(lookup, "OMPI_COMM_WORLD_SIZE", 1, kMaxInt, "an integer >= 1", kConvention);
  info.local_rank = required_int(lookup, "OMPI_COMM_WORLD_LOCAL_RANK", 0, kMaxInt,
                                 "an integer >= 0", kConvention);
  info.local_world_size = required_int(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMaxInt,
                                       "an integer >= 1", kConvention);
  check_ranks(info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE");

  info.master_addr = master_addr_from_env(lookup);
  if (info.master_addr.empty()) {
    // Open MPI exports no host list, and mpirun's own host need not run rank 0, so across
    // hosts the user names rank 0's host; on one host it is this one.
    if (info.local_world_size != info.world_size) {
      invalid(fmt::format(
          "MASTER_ADDR is not set and the job spans several hosts (OMPI_COMM_WORLD_LOCAL_SIZE={} "
          "< OMPI_COMM_WORLD_SIZE={}); set it to rank 0's host, e.g. mpirun -x MASTER_ADDR=host0",
          info.local_world_size, info.world_size));
    }
    info.master_addr = "127.0.0.1";
  }
  std::optional<std::string> port = get(lookup, "MASTER_PORT");
  if (port) {
    info.master_port = parse_port("MASTER_PORT", *port);
  } else if (std::optional<std::string> job = get(lookup, "OMPI_MCA_ess_base_jobid")) {
    // Open MPI 4.x: ORTE's numeric job id, the same on every rank of one mpirun.
    info.master_port = derived_store_port(
        static_cast<uint64_t>(parse_int("OMPI_MCA_ess_base_jobid", *job, 0,
                                        std::numeric_limits<int64_t>::max(), "a numeric job id")));
  } else if (std::optional<std::string> ns = get(lookup, "PMIX_NAMESPACE")) {
    // Open MPI 5.x (PRRTE) names the job with a PMIx namespace ("prterun-host-1234@1").
    info.master_port = derived_store_port(fnv1a(*ns));
  } else {
    invalid(
        "neither MASTER_PORT nor OMPI_MCA_ess_base_jobid / PMIX_NAMESPACE is set (Open MPI "
        "convention: the store port is derived from the job id)");
  }
  info.job = launcher_job_id(lookup, info.source);
  return info;
}

// Appends to `out` every expansion of `pattern` (a host name with zero or more bracket groups).
void expand_host(std::string_view pattern, const std::string& prefix, std::vector<std::string>& out,
                 std::string_view whole) {
  size_t open = pattern.find('[');
  if (open == std::string_view::npos) {
    if (pattern.find(']') != std::string_view::npos) {
      invalid(fmt::format("Slurm node list '{}' has an unmatched ']'", whole));
    }
    if (out.size() >= kMaxSlurmHosts) {
      invalid(
          fmt::format("Slurm node list '{}' expands to more than {} hosts", whole, kMaxSlurmHosts));
    }
    out.push_back(prefix + std::string(pattern));
    return;
  }
  size_t close = pattern.find(']', open);
  if (close == std::string_view::npos || pattern.substr(0, open).find(']') != std::string::npos) {
    invalid(fmt::format("Slurm node list '{}' has unbalanced brackets", whole));
  }
  std::string head = prefix + std::string(pattern.substr(0, open));
  std::string_view ranges = pattern.substr(open + 1, close - open - 1);
  std::string_view rest = pattern.substr(close + 1);
  if (ranges.empty()) invalid(fmt::format("Slurm node list '{}' has an empty '[]'", whole));
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    std::string_view range = ranges.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    size_t dash = range.find('-');
    std::string_view lo_text = range.substr(0, dash);
    std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
    std::optional<int64_t> lo = to_int(lo_text);
    std::optional<int64_t> hi = to_int(hi_text);
    if (!lo || !hi || *lo < 0 || *hi < *lo || lo_text.size() > 18 || hi_text.size() > 18) {
      invalid(
          fmt::format("Slurm node list '{}' has a malformed range '{}' (expected N or N-M "
                      "with N <= M)",
                      whole, range));
    }
    // Slurm pads every number of a range to the width written for its first bound.
    for (int64_t n = *lo; n <= *hi; ++n) {
      expand_host(rest, fmt::format("{}{:0{}}", head, n, lo_text.size()), out, whole);
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
}

[[noreturn]] void bad_url(std::string_view url, std::string_view detail) {
  throw_error(ErrorCode::InvalidArgument, fmt::format("store URL '{}'", url), detail);
}

StoreUrl::Scheme scheme_of(std::string_view url, std::string_view* rest) {
  struct Known {
    std::string_view prefix;
    StoreUrl::Scheme scheme;
  };
  for (const Known& k :
       {Known{"env://", StoreUrl::Scheme::Env}, Known{"tcp://", StoreUrl::Scheme::Tcp},
        Known{"file://", StoreUrl::Scheme::File}}) {
    if (url.substr(0, k.prefix.size()) == k.prefix) {
      *rest = url.substr(k.prefix.size());
      return k.scheme;
    }
  }
  bad_url(url, "unknown scheme (expected env://, tcp://HOST:PORT or file:///PATH)");
}

}  // namespace

LaunchInfo parse_launch_env(const EnvLookup& lookup) {
  if (lookup("RANK") != nullptr || lookup("WORLD_SIZE") != nullptr) return parse_torchrun(lookup);
  if (lookup("SLURM_PROCID") != nullptr) return parse_slurm(lookup);
  if (lookup("OMPI_COMM_WORLD_RANK") != nullptr) return parse_openmpi(lookup);
  invalid(
      "no launcher variables found: expected RANK and WORLD_SIZE (torchrun, weftrun), "
      "SLURM_PROCID (srun) or OMPI_COMM_WORLD_RANK (mpirun)");
}

std::vector<std::string> expand_slurm_nodelist(std::string_view nodelist) {
  std::vector<std::string> hosts;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= nodelist.size(); ++i) {
    char c = i < nodelist.size() ? nodelist[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) {
      invalid(fmt::format("Slurm node list '{}' has unbalanced brackets", nodelist));
    }
    if (c == ',' && depth == 0) {
      std::string_view host = nodelist.substr(start, i - start);
      if (host.empty()) invalid(fmt::format("Slurm node list '{}' has an empty host", nodelist));
      expand_host(host, "", hosts, nodelist);
      start = i + 1;
    }
  }
  if (depth != 0) invalid(fmt::format("Slurm node list '{}' has unbalanced brackets", nodelist));
  return hosts;
}

std::string JobId::text() const {
  return empty() ? "no job id" : fmt::format("{}={}", variable, value);
}

JobId launcher_job_id(const EnvLookup& lookup, std::string_view source) {
  auto named = [&](const char* name) -> JobId {
    const char* value = lookup(name);
    return value != nullptr && *value != '\0' ? JobId{name, value} : JobId{};
  };
  auto slurm = [&]() -> JobId {
    JobId job = named("SLURM_JOB_ID");
    if (job.empty()) job = named("SLURM_JOBID");
    JobId step = named("SLURM_STEP_ID");
    if (!job.empty() && !step.empty()) {
      job = JobId{job.variable + ".SLURM_STEP_ID", job.value + "." + step.value};
    }
    return job;
  };
  auto openmpi = [&]() -> JobId {
    JobId job = named("OMPI_MCA_ess_base_jobid");
    return job.empty() ? named("PMIX_NAMESPACE") : job;
  };
  auto torchrun = [&]() { return named("TORCHELASTIC_RUN_ID"); };
  if (JobId job = named("WEFT_JOB_ID"); !job.empty()) return job;
  // The convention that gave rank and size first: a torchrun job inside a Slurm allocation is
  // told apart from another by torchrun's id, which Slurm's (one per allocation) cannot do.
  const std::function<JobId()> by_convention[] = {torchrun, slurm, openmpi};
  const size_t first = source == "slurm" ? 1 : source == "openmpi" ? 2 : 0;
  if (JobId job = by_convention[first](); !job.empty()) return job;
  for (const auto& next : by_convention) {
    if (JobId job = next(); !job.empty()) return job;
  }
  return {};
}

bool agent_store_requested(const EnvLookup& lookup) {
  const char* value = lookup("TORCHELASTIC_USE_AGENT_STORE");
  if (value == nullptr) return false;
  // torchrun writes "True" or "False" (Python's str(bool)); accept the usual spellings too.
  std::string_view text(value);
  return text == "True" || text == "true" || text == "1";
}

uint16_t derived_store_port(uint64_t job_id) {
  return static_cast<uint16_t>(10000 + job_id % 20000);
}

std::string store_bind_address(const std::string& master_addr) {
  if (net::is_loopback(master_addr)) return master_addr;
  unsigned char buf[sizeof(in6_addr)];
  if (inet_pton(AF_INET, master_addr.c_str(), buf) == 1 ||
      inet_pton(AF_INET6, master_addr.c_str(), buf) == 1) {
    return master_addr;
  }
  return "0.0.0.0";
}

StoreUrl parse_store_url(std::string_view url) {
  std::string_view rest;
  StoreUrl parsed;
  parsed.scheme = scheme_of(url, &rest);
  size_t question = rest.find('?');
  std::string_view query = question == std::string_view::npos ? "" : rest.substr(question + 1);
  rest = rest.substr(0, question);

  switch (parsed.scheme) {
    case StoreUrl::Scheme::Env:
      if (!rest.empty()) bad_url(url, "env:// takes no host or path");
      break;
    case StoreUrl::Scheme::Tcp: {
      size_t colon;
      if (!rest.empty() && rest.front() == '[') {
        size_t close = rest.find(']');
        if (close == std::string_view::npos) bad_url(url, "unclosed '[' in the host");
        parsed.host = std::string(rest.substr(1, close - 1));
        colon = close + 1;
        if (colon >= rest.size() || rest[colon] != ':') colon = std::string_view::npos;
      } else {
        colon = rest.rfind(':');
        parsed.host = std::string(rest.substr(0, colon));
      }
      if (parsed.host.empty()) bad_url(url, "no host (expected tcp://HOST:PORT)");
      if (colon == std::string_view::npos) bad_url(url, "no port (expected tcp://HOST:PORT)");
      std::optional<int64_t> port = to_int(rest.substr(colon + 1));
      if (!port || *port < 1 || *port > 65535) bad_url(url, "the port is not a number in 1..65535");
      parsed.port = static_cast<uint16_t>(*port);
      break;
    }
    case StoreUrl::Scheme::File:
      if (rest.empty() || rest.front() != '/') {
        bad_url(url, "the path must be absolute (expected file:///ABS/PATH)");
      }
      parsed.path = std::string(rest);
      break;
  }

  size_t start = 0;
  while (!query.empty() && start <= query.size()) {
    size_t amp = query.find('&', start);
    std::string_view param =
        query.substr(start, amp == std::string_view::npos ? std::string_view::npos : amp - start);
    size_t eq = param.find('=');
    std::string_view key = param.substr(0, eq);
    int64_t value = 0;
    bool numeric = eq != std::string_view::npos && parse_i64(param.substr(eq + 1), &value);
    if (key != "rank" && key != "world_size") {
      bad_url(url, fmt::format("unknown parameter '{}' (expected rank and world_size)", key));
    }
    if (!numeric || value < (key == "rank" ? 0 : 1) || value > kMaxInt) {
      bad_url(url, fmt::format("'{}' is not {}", param,
                               key == "rank" ? "rank=R with R >= 0" : "world_size=N with N >= 1"));
    }
    (key == "rank" ? parsed.rank : parsed.world_size) = static_cast<int>(value);
    if (amp == std::string_view::npos) break;
    start = amp + 1;
  }
  if (parsed.rank && parsed.world_size && *parsed.rank >= *parsed.world_size) {
    bad_url(url, fmt::format("rank={} is out of range for world_size={}", *parsed.rank,
                             *parsed.world_size));
  }
  return parsed;
}

}  // namespace weft
