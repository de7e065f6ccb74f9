// backends/ucx/ucx_backend.cc: "ucx", a TransportBackend (backends/common/transport_backend.h:
// dispatch to the algorithms, the group-failure policy, the progress thread) over a UcxTransport.
// This file only connects the transport, and, where UCX may use shared memory, pairs it with
// weft's host memory (backends/common/host_memory_transport.h: shared slots, the bounce region
// and symmetric buffers between the ranks of a host; every message still goes through UCX).
// WEFT_UCX_HOST_MEMORY (or the group setting host_memory) says whether: "1", "0", or "auto" (the
// default: on unless UCX_TLS rules out shared memory, or WEFT_SHM=0). It is built as its own
// module, libweft-backend-ucx.so, outside libweft (which never links UCX), and registers through
// the C++ module interface (runtime/backend_module.h) when a group first asks for "ucx".
#include <cstdlib>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "weft/backend.h"
#include "weft/config.h"
#include "weft/error.h"

#include "backends/common/host_memory_transport.h"
#include "backends/common/transport_backend.h"
#include "backends/tcp/routed_transport.h"
#include "backends/ucx/ucx_transport.h"
#include "runtime/backend_module.h"
#include "runtime/log.h"

namespace weft::ucx {
namespace {

// Why the group does not pair UCX with weft's host memory (above); "" when it does. Throws
// Error(InvalidArgument) for a value other than 0, 1 or auto.
std::string why_no_host_memory(const BackendOptions& options) {
  std::string value = "auto";
  std::string from = "WEFT_UCX_HOST_MEMORY";
  if (auto it = options.settings.find("host_memory"); it != options.settings.end()) {
    value = it->second;
    from = "the setting host_memory";
  } else if (const char* v = std::getenv("WEFT_UCX_HOST_MEMORY"); v != nullptr && *v != '\0') {
    value = v;
  }
  if (value == "1") return "";
  if (value == "0") return fmt::format("host memory is off for this group ({}=0)", from);
  if (value != "auto") {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("rank {}/{} group \"{}\" ucx: {}=\"{}\": expected 0, 1 or auto",
                            options.rank, options.size, options.group_name, from, value));
  }
  if (!config().shm) return "host memory is off for this group (WEFT_SHM=0)";
  if (!tls_may_use_shared_memory()) {
    return fmt::format("host memory is off for this group: UCX_TLS=\"{}\" rules out shared memory",
                       std::getenv("UCX_TLS"));
  }
  return "";
}

std::unique_ptr<Backend> create_ucx_backend(const BackendOptions& options) {
  UcxTransport::Options transport_options;
  transport_options.group_name = options.group_name;
  transport_options.key_prefix = "ucx";
  transport_options.timeout = options.timeout;
  transport_options.why_no_symmetric_memory = why_no_host_memory(options);
  const bool host_memory = transport_options.why_no_symmetric_memory.empty();
  std::unique_ptr<UcxTransport> ucx =
      UcxTransport::connect(*options.store, options.rank, options.size, transport_options);
  if (!host_memory) {
    return std::make_unique<backends::TransportBackend>("ucx", options, std::move(ucx));
  }
  // The host side: shared memory between this host's ranks (its rings carry nothing, so they
  // are the smallest there are); no connection to other hosts' ranks (UCX reaches them).
  tcp::RoutedTransport::Options host_options;
  host_options.group_name = options.group_name;
  host_options.key_prefix = "ucx/host";
  host_options.timeout = options.timeout;
  host_options.shm = true;
  host_options.local_only = true;
  host_options.shm_options.ring_bytes = 4096;
  // Its barriers carry no UCX messages: while they wait, UCX must still take in what a peer
  // sends this rank, or a peer held in a large send would never come to the barrier.
  UcxTransport* messages = ucx.get();
  host_options.shm_options.progress_beside = [messages] { messages->progress_beside(); };
  auto host = tcp::RoutedTransport::connect(*options.store, options.rank, options.size,
                                            std::move(host_options));
  WEFT_LOG_DEBUG("rank {}/{} group \"{}\" ucx: messages over UCX, host memory ({})", options.rank,
                 options.size, options.group_name,
                 host->shared_slots() != nullptr ? "every rank on this host" : "this host's ranks");
  return std::make_unique<backends::TransportBackend>(
      "ucx", options,
      std::make_unique<backends::HostMemoryTransport>(std::move(ucx), std::move(host)));
}

void entry(Registry::Entry* out) {
  out->name = "ucx";
  out->devices = {DeviceKind::Cpu};
  out->factory = create_ucx_backend;
}

}  // namespace
}  // namespace weft::ucx

extern "C" {
__attribute__((visibility("default"))) extern const weft::BackendModule weftBackendModule;
const weft::BackendModule weftBackendModule = {weft::kBackendModuleBuild, "ucx", weft::ucx::entry};
}
