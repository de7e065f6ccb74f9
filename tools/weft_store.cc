// weft-store: a standalone TCPStore server, wire-compatible with PyTorch's TCPStore.
//
//   weft-store --host 127.0.0.1 --port 29500
//
// Prints "weft-store listening on HOST:PORT" on stdout once it accepts connections (with the
// port the kernel chose when --port is 0), then serves until SIGINT or SIGTERM and exits 0.
// Authentication: WEFT_STORE_TOKEN in the environment turns it on; --token-env makes it required
// (the server refuses to start without the variable). The token is never taken from the command
// line, where other users of the machine could read it.
#include <signal.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "weft/config.h"
#include "weft/error.h"
#include "weft/tcp_store_server.h"

namespace {

constexpr int kBadArguments = 2;

constexpr const char* kUsage =
    "usage: weft-store [--host HOST] [--port PORT] [--token-env]\n"
    "\n"
    "Runs a TCPStore server that PyTorch and weft clients share.\n"
    "\n"
    "  --host HOST    address to bind (default 0.0.0.0; 127.0.0.1 keeps it on this machine)\n"
    "  --port PORT    port to listen on, 0..65535 (default 29500; 0: any free port)\n"
    "  --token-env    require authentication: refuse to start unless WEFT_STORE_TOKEN is set\n"
    "  --help         show this text\n"
    "\n"
    "WEFT_STORE_TOKEN, when set, makes clients prove they know it (HMAC challenge-response)\n"
    "before any query; the token itself never crosses the network.\n";

int bad_arguments(const std::string& message) {
  std::fprintf(stderr, "weft-store: %s\n%s", message.c_str(), kUsage);
  return kBadArguments;
}

}  // namespace

int main(int argc, char** argv) {
  weft::TcpStoreServerOptions options;
  options.port = 29500;
  bool require_token = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--token-env") {
      require_token = true;
      continue;
    }
    if (arg == "--host" || arg == "--port") {
      if (i + 1 >= argc) return bad_arguments(std::string(arg) + " needs a value");
      std::string_view value = argv[++i];
      if (arg == "--host") {
        if (value.empty()) return bad_arguments("--host needs a non-empty address");
        options.host = std::string(value);
        continue;
      }
      unsigned port = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), port);
      if (ec != std::errc() || end != value.data() + value.size() || port > 65535) {
        return bad_arguments("--port must be a number from 0 to 65535, not \"" +
                             std::string(value) + "\"");
      }
      options.port = static_cast<uint16_t>(port);
      continue;
    }
    return bad_arguments("unknown argument \"" + std::string(arg) + "\"");
  }

  std::string token;
  try {
    token = weft::config().store_token;
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "weft-store: %s\n", e.what());
    return kBadArguments;
  }
  if (require_token && token.empty()) {
    return bad_arguments("--token-env given but WEFT_STORE_TOKEN is not set");
  }
  options.token = token;

  // Block the stop signals before the server's thread starts (it inherits the mask), then wait
  // for them here: no handler runs inside the event loop.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  try {
    weft::TcpStoreServer server(options);
    std::printf("weft-store listening on %s:%u\n", server.host().c_str(),
                static_cast<unsigned>(server.port()));
    std::fflush(stdout);
    std::fprintf(stderr, "weft-store: authentication %s\n",
                 token.empty() ? "off" : "on (WEFT_STORE_TOKEN)");
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    server.stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
