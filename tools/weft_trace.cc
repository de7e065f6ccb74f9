// weft-trace: merges a job's flight-recorder dumps and says which rank is behind, on what, and
// whether the ranks called the same collectives (docs/flight-recorder.md).
//
//   weft-trace /shared/run42              # every weft-trace-rank*.json there
//   weft-trace weft-trace-rank0.json weft-trace-rank2.json
//   weft-trace --store node7:29500        # ask the live job for dumps through its store
//
// Exit status: 0 when it printed an analysis (whatever the analysis found), 1 when it could not
// (no dumps, a file that is not a valid dump, no flight recorder on the store), 2 on a usage
// error.
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/tcp_store.h"

#include "weft_trace_analysis.h"

namespace {

constexpr int kFailed = 1;
constexpr int kBadArguments = 2;

constexpr const char* kUsage =
    "usage: weft-trace [--json] DIR | FILE...\n"
    "       weft-trace [--json] --store HOST:PORT [--timeout SECONDS]\n"
    "\n"
    "Merges the flight-recorder dumps of one job and says which rank is behind, on what, and\n"
    "whether the ranks called the same collectives (docs/flight-recorder.md).\n"
    "\n"
    "  DIR                  read every weft-trace-rank*.json in DIR\n"
    "  FILE...              read these dumps\n"
    "  --store HOST:PORT    ask a live job to dump through its world group's store (the\n"
    "                       dumps come back through the store; its files are left alone)\n"
    "  --timeout SECONDS    how long --store waits for the job and its replies (default 10)\n"
    "  --json               print the analysis as JSON for tools\n"
    "  --help               show this text\n"
    "\n"
    "WEFT_STORE_TOKEN, when set, authenticates to a store that requires it.\n"
    "Exit status: 0 when it printed an analysis, 1 when it could not, 2 on a usage error.\n";

int bad_arguments(const std::string& message) {
  std::fprintf(stderr, "weft-trace: %s\n%s", message.c_str(), kUsage);
  return kBadArguments;
}

std::string this_process() {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  return fmt::format("weft-trace --store from {} pid {}", host, static_cast<long>(getpid()));
}

}  // namespace

int main(int argc, char** argv) {
  bool as_json = false;
  std::string store_address;
  double timeout_s = 10;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--json") {
      as_json = true;
      continue;
    }
    if (arg == "--store" || arg == "--timeout") {
      if (i + 1 >= argc) return bad_arguments(std::string(arg) + " needs a value");
      std::string_view value = argv[++i];
      if (arg == "--store") {
        store_address = std::string(value);
        continue;
      }
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), timeout_s);
      if (ec != std::errc() || end != value.data() + value.size() || !(timeout_s > 0)) {
        return bad_arguments("--timeout must be a positive number of seconds, not \"" +
                             std::string(value) + "\"");
      }
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      return bad_arguments("unknown option \"" + std::string(arg) + "\"");
    }
    paths.emplace_back(arg);
  }
  if (store_address.empty() == paths.empty()) {
    return bad_arguments(paths.empty() ? "give a directory, dump files or --store HOST:PORT"
                                       : "give either --store or dumps, not both");
  }

  weft::trace::DumpSet set;
  try {
    if (!store_address.empty()) {
      // HOST:PORT, the host possibly an IPv6 address in brackets.
      size_t colon = store_address.rfind(':');
      std::string host = store_address.substr(0, colon == std::string::npos ? 0 : colon);
      if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
      }
      std::string_view port_text =
          colon == std::string::npos ? "" : std::string_view(store_address).substr(colon + 1);
      unsigned port = 0;
      auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
      if (host.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
          port == 0 || port > 65535) {
        return bad_arguments("--store needs HOST:PORT (port 1..65535), not \"" + store_address +
                             "\"");
      }
      auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
      weft::TCPStore store(weft::TCPStoreOptions{
          .host = host, .port = static_cast<uint16_t>(port), .timeout = timeout});
      set = weft::trace::request_dumps(store, timeout, this_process());
      if (set.dumps.empty()) {
        std::fprintf(stderr,
                     "weft-trace: no rank of the job on %s answered within %g s (it polls the "
                     "store every WEFT_TRACE_POLL, default 1 s; try a longer --timeout)\n",
                     store_address.c_str(), timeout_s);
        return kFailed;
      }
    } else {
      set = weft::trace::load_dumps(paths);
    }
    weft::trace::Analysis analysis = weft::trace::analyze(std::move(set));
    std::string text =
        as_json ? weft::trace::render_json(analysis) : weft::trace::render_text(analysis);
    std::fputs(text.c_str(), stdout);
  } catch (const weft::trace::TraceError& e) {
    std::fprintf(stderr, "weft-trace: %s\n", e.what());
    return kFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-trace: %s\n", e.what());
    return kFailed;
  }
  return 0;
}
