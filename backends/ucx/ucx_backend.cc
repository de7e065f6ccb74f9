// backends/ucx/ucx_backend.cc: "ucx", a TransportBackend (backends/common/transport_backend.h:
// dispatch to the algorithms, the group-failure policy, the progress thread) over a UcxTransport.
// This file only connects the transport. It is built as its own module,
// libweft-backend-ucx.so, outside libweft (which never links UCX), and registers through the
// C++ module interface (runtime/backend_module.h) when a group first asks for "ucx".
#include <memory>

#include "weft/backend.h"

#include "backends/common/transport_backend.h"
#include "backends/ucx/ucx_transport.h"
#include "runtime/backend_module.h"

namespace weft::ucx {
namespace {

std::unique_ptr<Backend> create_ucx_backend(const BackendOptions& options) {
  UcxTransport::Options transport_options;
  transport_options.group_name = options.group_name;
  transport_options.key_prefix = "ucx";
  transport_options.timeout = options.timeout;
  return std::make_unique<backends::TransportBackend>(
      "ucx", options,
      UcxTransport::connect(*options.store, options.rank, options.size, transport_options));
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
