// backends/nccl/nccl_module.cc: the module entry of libweft-backend-nccl.so (runtime/
// backend_module.h): "nccl" for CUDA tensors, found by name in WEFT_PLUGIN_PATH or the install's
// plugin folder. libweft never links CUDA or NCCL (tests/nccl checks it); this module links
// libcudart and libnccl, never the driver (libcuda), so it loads on a machine without one.
#include <memory>

#include "weft/backend.h"

#include "backends/nccl/nccl_backend.h"
#include "runtime/backend_module.h"

namespace weft::nccl {
namespace {

void entry(Registry::Entry* out) {
  out->name = "nccl";
  out->devices = {DeviceKind::Cuda};
  out->factory = [](const BackendOptions& options) -> std::unique_ptr<Backend> {
    return std::make_unique<NcclBackend>(options);
  };
}

}  // namespace
}  // namespace weft::nccl

extern "C" {
__attribute__((visibility("default"))) extern const weft::BackendModule weftBackendModule;
const weft::BackendModule weftBackendModule = {weft::kBackendModuleBuild, "nccl",
                                               weft::nccl::entry};
}
