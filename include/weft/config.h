// weft/config.h: every WEFT_* environment variable, parsed in one place.
//
// config() reads the environment once, on first use, and is then fixed for the process. Tests and
// embedders that want other values build a Config with Config::from_env(lookup) and pass its
// fields explicitly. docs/configuration.md lists every variable with its default.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace weft {

enum class LogLevel : int { Error = 0, Warn = 1, Info = 2, Debug = 3, Trace = 4 };

// "warn", "info", ...
const char* log_level_name(LogLevel level);

struct Config {
  // WEFT_LOG=error|warn|info|debug|trace: what weft logs to stderr. Default warn.
  LogLevel log_level = LogLevel::Warn;
  // WEFT_TIMEOUT: default timeout of every blocking call (store waits, collectives), in seconds
  // ("300", "2.5") or with a unit ("500ms", "30s", "5m"). Default 300 s, as c10d; at least 1 s
  // (a smaller value is refused naming the variable).
  std::chrono::milliseconds timeout{300'000};
  // WEFT_STORE_TOKEN: shared secret for the TCP store's HMAC authentication. Empty: off.
  std::string store_token;
  // WEFT_SHM=0|1: use shared memory between ranks on one host. Default 1.
  bool shm = true;
  // WEFT_DEBUG=off|detail: "detail" checks before each collective that all ranks agree.
  std::string debug = "off";
  // WEFT_ALGO: force a collective algorithm by name ("ring", "tree", ...). Empty: the planner.
  std::string algo;
  // WEFT_SPIN_US: how long (microseconds) a rank waiting on shared memory spins before it
  // sleeps. -1 (default, or "auto"): the transport's choice (spin only while the ranks on the host
  // do not outnumber its cores); 0: never spin.
  int spin_us = -1;
  // WEFT_SHM_SLOT_BYTES: bytes per rank of the shared slots that small collectives use between
  // the ranks of a group on one host (collectives/shared_slots.h); 0 turns them off. At most
  // 1 MiB. Every rank of a group must use the same value.
  size_t shm_slot_bytes = 65536;
  // WEFT_BACKEND: the backend map of a group whose options name none ("ucx", "cpu:ucx"), as
  // ProcessGroupOptions::backend. Empty: each device kind's default.
  std::string backend;
  // WEFT_PLUGIN_PATH: colon-separated folders searched for libweft-backend-NAME.so.
  std::vector<std::string> plugin_path;
  // WEFT_HOST_ADDR: the address this rank listens on and publishes to its peers ("10.0.0.5").
  // Empty (default): the address of the interface that reaches the store's host.
  std::string host_addr;
  // WEFT_SOCKET_IFNAME: the network interface ("eth1") whose address this rank publishes, as
  // GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME. WEFT_HOST_ADDR wins when both are set.
  std::string socket_ifname;
  // WEFT_TRACE_BUFFER: how many operations each group's flight recorder keeps (docs/
  // flight-recorder.md). Default 2000; 0 turns the recorder (and its dumps) off.
  size_t trace_buffer = 2000;
  // WEFT_TRACE_DIR: where dumps are written. Empty (default): the working directory.
  std::string trace_dir;
  // WEFT_TRACE_POLL: how often each process looks in the store for dump requests and runs the
  // watchdog, as WEFT_TIMEOUT is written. Default 1 s; at least 10 ms.
  std::chrono::milliseconds trace_poll{1000};

  // Variables set with the WEFT_ prefix that weft does not know (likely typos); config() logs
  // a warning for each.
  std::vector<std::string> unknown;

  // Parses the variables through `lookup` (nullptr when unset). Throws Error(InvalidArgument)
  // naming the variable and the accepted values when one is malformed.
  static Config from_env(const std::function<const char*(const char*)>& lookup);
};

// The process's configuration, parsed from the environment on first call.
const Config& config();

// Parses a duration as WEFT_TIMEOUT does ("300", "2.5", "500ms", "30s", "5m", "1h").
// Throws Error(InvalidArgument) naming `what` when malformed or negative.
std::chrono::milliseconds parse_duration(const std::string& text, const char* what);

}  // namespace weft
