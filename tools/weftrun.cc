// weftrun: a local launcher with torchrun's flags. It hosts the job's TCP store (on node 0),
// starts --nproc-per-node ranks with torchrun's environment, relays their output line by line,
// and stops them all when one fails. docs/launching.md describes it; `weftrun --help` too.
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"
#include "weft/tcp_store_server.h"

#include "runtime/launch_env.h"
#include "tools/weftrun_options.h"
#include "tools/weftrun_supervisor.h"

namespace {

constexpr int kUsageExit = 2;

}  // namespace

int main(int argc, char** argv) {
  using namespace weft::weftrun;
  // Before the store server's thread exists, so that it inherits the mask.
  block_launcher_signals();

  Options options;
  try {
    options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "weftrun: %s\n(weftrun --help lists the options)\n", e.what());
    return kUsageExit;
  }
  if (options.help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }

  // The WEFT_* variables, read now: the store server (and every rank) reads them, and a bad one
  // must be reported as what it is, not as a store that cannot be hosted.
  try {
    (void)weft::config();
  } catch (const weft::Error& e) {
    std::fprintf(stderr,
                 "weftrun: %s\n(a WEFT_* variable in weftrun's environment, which every rank "
                 "inherits: fix or unset it; docs/configuration.md lists them)\n",
                 e.what());
    return kUsageExit;
  }

  try {
    // Node 0 hosts the store, as torchrun's agent does: it outlives any one rank, so a rank's
    // failure is reported by weftrun rather than seen by the others as a lost store.
    std::unique_ptr<weft::TcpStoreServer> server;
    uint16_t port = options.master_port;
    if (options.node_rank == 0) {
      weft::TcpStoreServerOptions server_options;
      server_options.host = weft::store_bind_address(options.master_addr);
      server_options.port = options.master_port;
      try {
        server = std::make_unique<weft::TcpStoreServer>(server_options);
      } catch (const weft::Error& e) {
        std::fprintf(stderr,
                     "weftrun: cannot host the store on %s:%u: %s\n(another job may use the port: "
                     "pass --master-port or --standalone)\n",
                     server_options.host.c_str(), options.master_port, e.what());
        return 1;
      }
      port = server->port();
    }
    Supervisor supervisor(options, port);
    return supervisor.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weftrun: %s\n", e.what());
    return 1;
  }
}
