#include "weft/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/config.h"
#include "weft/error.h"
#include "weft/file_store.h"
#include "weft/tcp_store.h"

#include "runtime/launch_env.h"
#include "runtime/log.h"
#include "runtime/socket.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Missing ranks named in a timeout message; past this the message gives a count.
constexpr size_t kMaxNamedRanks = 16;

const char* process_env(const char* name) { return std::getenv(name); }

// The explicit value of `name` from the URL and the options; both set and different is an error.
std::optional<int> explicit_value(std::optional<int> from_url, std::optional<int> from_options,
                                  const char* name, const std::string& where) {
  if (from_url && from_options && *from_url != *from_options) {
    throw_error(
        ErrorCode::InvalidArgument, where,
        fmt::format("the URL says {}={} but the options say {}", name, *from_url, *from_options));
  }
  return from_options ? from_options : from_url;
}

// The integer in environment variable `name`, or `fallback` when it is unset.
int env_int(const char* name, int fallback, int min, const std::string& where) {
  const char* text = process_env(name);
  if (text == nullptr) return fallback;
  int value = 0;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, value);
  if (ptr == text || ec != std::errc() || ptr != end || value < min) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{}='{}' is not an integer >= {}", name, text, min));
  }
  return value;
}

// LOCAL_RANK / LOCAL_WORLD_SIZE when the environment has them (tcp:// and file:// under a
// launcher); otherwise every rank is taken to be on this host.
void local_ranks_from_env(LaunchInfo& info, const std::string& where) {
  info.local_rank = env_int("LOCAL_RANK", info.rank, 0, where);
  info.local_world_size = env_int("LOCAL_WORLD_SIZE", info.world_size, 1, where);
  if (info.local_rank >= info.local_world_size) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("LOCAL_RANK={} is out of range for LOCAL_WORLD_SIZE={}",
                            info.local_rank, info.local_world_size));
  }
}

void check_rank(const LaunchInfo& info, const std::string& where) {
  if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) {
    throw_error(
        ErrorCode::InvalidArgument, where,
        fmt::format("rank {} is out of range for world size {}", info.rank, info.world_size));
  }
}

// What to do when rank 0 cannot listen on the store's address and port. Either the address is
// not one of this host's (MASTER_ADDR names another host: under mpirun, rank 0 runs on the
// first slot's host, which need not be the one named), or the port is taken. Binding the same
// address at a port the kernel picks tells the two apart.
std::string listen_advice(const std::string& bind_host, const std::string& master_addr,
                          StoreUrl::Scheme scheme) {
  try {
    net::listen_on(bind_host, 0, nullptr);
  } catch (const Error&) {
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    return fmt::format("{} is not an address of this host ({}), where rank 0 runs: {}", master_addr,
                       host,
                       scheme == StoreUrl::Scheme::Env ? "set MASTER_ADDR to rank 0's host"
                                                       : "the URL must name rank 0's host");
  }
  return "is the port in use? set MASTER_PORT";
}

// Works out rank, size and the store's address from the URL, the options and the environment.
LaunchInfo plan(const StoreUrl& url, const RendezvousOptions& options, const std::string& where) {
  std::optional<int> rank = explicit_value(url.rank, options.rank, "rank", where);
  std::optional<int> world_size =
      explicit_value(url.world_size, options.world_size, "world_size", where);
  LaunchInfo info;
  if (url.scheme == StoreUrl::Scheme::Env && !(rank && world_size)) {
    info = parse_launch_env(process_env);
    if (rank) info.rank = *rank;
    if (world_size) info.world_size = *world_size;
  } else {
    if (!rank || !world_size) {
      throw_error(ErrorCode::InvalidArgument, where,
                  "rank and world_size are needed (in the URL as ?rank=R&world_size=N, or in "
                  "RendezvousOptions)");
    }
    info.rank = *rank;
    info.world_size = *world_size;
    info.source = "explicit";
    check_rank(info, where);
    local_ranks_from_env(info, where);
    if (url.scheme == StoreUrl::Scheme::Tcp) {
      info.master_addr = url.host;
      info.master_port = url.port;
    } else if (url.scheme == StoreUrl::Scheme::Env) {
      // env:// with explicit rank and size still finds the store through the environment.
      const char* addr = process_env("MASTER_ADDR");
      const char* port = process_env("MASTER_PORT");
      if (addr == nullptr || port == nullptr) {
        throw_error(ErrorCode::InvalidArgument, where,
                    "MASTER_ADDR and MASTER_PORT must be set to find the store");
      }
      StoreUrl tcp = parse_store_url(fmt::format("tcp://{}:{}", addr, port));
      info.master_addr = tcp.host;
      info.master_port = tcp.port;
    }
    info.agent_store = agent_store_requested(process_env);
    if (info.agent_store && url.scheme == StoreUrl::Scheme::Tcp) {
      // The launcher hosts one store, at MASTER_PORT: a tcp:// URL naming another port is a
      // store of the program's own (a second world, a test's), hosted by its rank 0.
      const char* port = process_env("MASTER_PORT");
      if (port != nullptr && std::to_string(info.master_port) != port) info.agent_store = false;
    }
    info.job = launcher_job_id(process_env);
  }
  check_rank(info, where);
  return info;
}

milliseconds remaining(Clock::time_point deadline) {
  return std::max(milliseconds(1),
                  std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

std::string seconds_text(milliseconds timeout) {
  return fmt::format("{:g} s", static_cast<double>(timeout.count()) / 1000.0);
}

// What must be the same on every rank of a job, as "name=value" items: the weft version (a rank of
// another release may speak another wire protocol) and the settings that change what goes on the
// wire or in which order: WEFT_BACKEND (ranks on different backends cannot talk), WEFT_DEBUG
// (detail runs a check collective before each collective) and WEFT_ALGO (ranks running different
// algorithms wait for messages that never come). Not here: WEFT_SHM (it may differ between
// hosts; the TCP mesh refuses a host whose ranks disagree), WEFT_TIMEOUT and the tracing and
// spinning settings (local), WEFT_STORE_TOKEN (the store refuses a wrong one itself).
// WEFT_TEST_FAKE_VERSION replaces the version, for the tests of this check only.
std::vector<std::string> settings_that_must_agree() {
  const char* fake = process_env("WEFT_TEST_FAKE_VERSION");
  return {fmt::format("weft={}", fake != nullptr ? fake : WEFT_VERSION),
          fmt::format("WEFT_BACKEND={}", config().backend),
          fmt::format("WEFT_DEBUG={}", config().debug), fmt::format("WEFT_ALGO={}", config().algo)};
}

// "runs weft 0.5.0" for the version, else "has" and the item ("has WEFT_DEBUG=detail").
std::string item_text(const std::string& item) {
  return item.starts_with("weft=") ? "runs weft " + item.substr(5) : "has " + item;
}

// Splits "a\nb\nc" at newlines.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (;;) {
    size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return lines;
    start = end + 1;
  }
}

// Why `mine` (this rank's settings) cannot join `theirs` (those of `their_rank`, the first rank
// to join; -1 and none from a weft that predates this check), or "" when they agree.
std::string disagreement(int my_rank, const std::vector<std::string>& mine, int their_rank,
                         const std::vector<std::string>& theirs) {
  if (their_rank < 0) {
    return fmt::format(
        "rank {} {} but the first rank to join runs an older weft (it published "
        "no version): every rank of a job must run the same weft release",
        my_rank, item_text(mine[0]));
  }
  std::string what;
  for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    const std::string a = i < mine.size() ? mine[i] : "?";
    const std::string b = i < theirs.size() ? theirs[i] : "?";
    if (a == b) continue;
    what += fmt::format("{}rank {} {} but rank {} (the first to join) {}", what.empty() ? "" : "; ",
                        my_rank, item_text(a), their_rank, item_text(b));
  }
  if (what.empty()) return what;
  return what +
         ": every rank of a job must run the same weft release with the same WEFT_BACKEND, "
         "WEFT_DEBUG and WEFT_ALGO";
}

// Every rank claims "<prefix>rank/<r>", counts itself in "<prefix>joined", and the last to arrive
// sets "<prefix>complete" to "1", which all wait for. The per-rank keys let a timeout name the
// missing.
//
// The first rank to arrive writes "<prefix>job": the job's id, its rank and its settings that
// must agree (settings_that_must_agree()), a line each. Every later rank reads them back from the
// same COMPARE_SET that checks the job, so the comparison costs no round trip. A rank that
// disagrees claims nothing, writes why into "<prefix>complete" in place of "1" (never over a "1":
// the job cannot be complete without this rank; several that disagree each write theirs, the
// last one stays) and fails; every rank waiting for "complete", or arriving later, reads it and
// fails with its words.
void join(Store& store, const LaunchInfo& info, Clock::time_point deadline, milliseconds timeout,
          const std::string& where) {
  // torchrun's agent store outlives restarted workers: each restart rendezvouses afresh.
  const char* restart = process_env("TORCHELASTIC_RESTART_COUNT");
  const std::string prefix = fmt::format("weft/rendezvous/{}/", restart ? restart : "0");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string me = fmt::format("{}:{}", host, getpid());

  // The first rank to arrive names the job; a rank of another job that reached this store (the
  // same MASTER_PORT by mistake) is refused before it claims anything, whatever its rank.
  const std::string job = info.job.text();
  const std::vector<std::string> settings = settings_that_must_agree();
  const std::string record = fmt::format("{}\n{}\n{}", job, info.rank, fmt::join(settings, "\n"));
  const std::vector<std::string> owner =
      lines_of(to_string(store.compare_set(prefix + "job", Bytes{}, to_bytes(record))));
  if (owner[0] != job) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("this process is of job {} but the store belongs to job {}: two jobs "
                            "share one store address (give each its own MASTER_PORT)",
                            job, owner[0]));
  }
  const int first_rank = owner.size() > 1 ? std::atoi(owner[1].c_str()) : -1;
  const std::string refused = disagreement(
      info.rank, settings, first_rank,
      std::vector<std::string>(owner.begin() + std::min<size_t>(owner.size(), 2), owner.end()));
  if (!refused.empty()) {
    store.set(prefix + "complete", to_bytes(fmt::format("refused\n{}", refused)));
    throw_error(ErrorCode::InvalidArgument, where, refused);
  }
  Bytes claimed =
      store.compare_set(fmt::format("{}rank/{}", prefix, info.rank), Bytes{}, to_bytes(me));
  if (to_string(claimed) != me) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("rank {} was already claimed by {} (two processes with the same rank?)",
                            info.rank, to_string(claimed)));
  }
  int64_t joined = store.add(prefix + "joined", 1);
  if (joined > info.world_size) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{} processes joined a job of world size {}", joined, info.world_size));
  }
  if (joined == info.world_size) store.set(prefix + "complete", std::string_view("1"));
  try {
    // A GET, not a WAIT, so that a refusal's reason reaches every rank: on a TCPStore one round
    // trip more per rank (WAIT, then GET), once per job.
    const std::string complete = to_string(store.get(prefix + "complete", remaining(deadline)));
    if (complete.starts_with("refused\n")) {
      throw_error(ErrorCode::InvalidArgument, where,
                  fmt::format("the job was refused at rendezvous: {}", complete.substr(8)));
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout) throw;
    int64_t arrived = store.add(prefix + "joined", 0);
    std::string missing;
    size_t named = 0;
    for (int r = 0; r < info.world_size && named <= kMaxNamedRanks; ++r) {
      if (store.check({fmt::format("{}rank/{}", prefix, r)})) continue;
      if (named == kMaxNamedRanks) {
        missing += ", ...";
      } else {
        missing += fmt::format("{}{}", named == 0 ? "" : ", ", r);
      }
      ++named;
    }
    throw_error(ErrorCode::Timeout, where,
                fmt::format("after {}: {}/{} ranks arrived; missing rank(s) {} (did they start? "
                            "raise WEFT_TIMEOUT if they are slow)",
                            seconds_text(timeout), arrived, info.world_size, missing));
  }
}

// Who serves a TCP store, for messages.
const char* store_host(const LaunchInfo& info) {
  return info.agent_store ? "the launcher" : "rank 0";
}

}  // namespace

Rendezvous rendezvous(const RendezvousOptions& options) {
  const milliseconds timeout =
      options.timeout > milliseconds(0) ? options.timeout : config().timeout;
  const Clock::time_point deadline = Clock::now() + timeout;
  std::string where = fmt::format("rendezvous {}", options.url);
  StoreUrl url = parse_store_url(options.url);
  LaunchInfo info = plan(url, options, where);
  where = fmt::format("rendezvous {} (rank {}/{}, {}", options.url, info.rank, info.world_size,
                      info.source);
  if (url.scheme != StoreUrl::Scheme::File) {
    where += fmt::format(", store {}:{}", info.master_addr, info.master_port);
  }
  where += ")";
  log::set_rank(info.rank);

  Rendezvous result;
  result.rank = info.rank;
  result.world_size = info.world_size;
  result.local_rank = info.local_rank;
  result.local_world_size = info.local_world_size;
  if (url.scheme == StoreUrl::Scheme::File) {
    result.store = std::make_shared<FileStore>(url.path, info.world_size);
  } else {
    if (info.rank == 0 && !info.agent_store) {
      TcpStoreServerOptions server_options;
      server_options.host = store_bind_address(info.master_addr);
      server_options.port = info.master_port;
      try {
        result.server = std::make_unique<TcpStoreServer>(server_options);
      } catch (const Error& e) {
        throw Error(e.code(),
                    fmt::format("{}: rank 0 cannot host the store: {} ({})", where, e.what(),
                                listen_advice(server_options.host, info.master_addr, url.scheme)));
      }
      WEFT_LOG_INFO("{}: hosting the store on {}:{}", where, server_options.host,
                    result.server->port());
    }
    TCPStoreOptions client_options;
    client_options.host = info.master_addr;
    client_options.port = info.master_port;
    client_options.timeout = remaining(deadline);
    try {
      result.store = std::make_shared<TCPStore>(client_options);
    } catch (const Error& e) {
      // A host name that does not resolve, or a refused token, will not change by waiting: no
      // "did that start?" for those.
      if (e.code() == ErrorCode::InvalidArgument) {
        throw Error(e.code(), fmt::format("{}: cannot reach the store: {}", where, e.what()));
      }
      throw Error(e.code(), fmt::format("{}: cannot reach the store: {} (it is hosted by {}; did "
                                        "that start?)",
                                        where, e.what(), store_host(info)));
    }
  }
  result.store->set_timeout(timeout);
  try {
    join(*result.store, info, deadline, timeout, where);
  } catch (const Error& e) {
    const bool lost = e.code() == ErrorCode::PeerLost || e.code() == ErrorCode::Io;
    if (!lost || url.scheme == StoreUrl::Scheme::File) throw;
    throw Error(e.code(), fmt::format("{}: lost the store during rendezvous (its host, {}, quit "
                                      "or closed the connection): {}",
                                      where, store_host(info), e.what()));
  }
  WEFT_LOG_INFO("{}: all {} ranks joined", where, info.world_size);
  return result;
}

}  // namespace weft
