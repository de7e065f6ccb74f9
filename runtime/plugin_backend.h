// runtime/plugin_backend.h: a backend plugin (weft/plugin.h) as a weft Backend. Internal to
// libweft: the plugin loader (runtime/plugin.cc) registers a factory that calls this.
#pragma once

#include <memory>

#include "weft/backend.h"
#include "weft/device.h"
#include "weft/plugin.h"

namespace weft {

// One group's backend on `plugin`, serving device kind `kind`: calls the plugin's init() on the
// context's plugin thread and waits for it up to the group's timeout plus a margin (max(1 s,
// timeout / 10)). Throws Error(Timeout) naming the plugin and init() past that, or the Error of
// the code init() failed with. The backend's operations run as runtime/plugin_core.h describes.
std::unique_ptr<Backend> make_plugin_backend(const weftBackendPlugin_v1_t* plugin,
                                             const BackendOptions& options, DeviceKind kind);

}  // namespace weft
