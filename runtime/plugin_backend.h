// runtime/plugin_backend.h: a backend plugin (weft/plugin.h) as a weft Backend. Internal to
// libweft: the plugin loader (runtime/plugin.cc) registers a factory that calls this.
#pragma once

#include <memory>

#include "weft/backend.h"
#include "weft/device.h"
#include "weft/plugin.h"

namespace weft {

// A loaded plugin as the core calls it: the newest struct (v2), whatever version the plugin
// exports. An older plugin is lifted to it by its version's adapter (runtime/plugin_v1.cc), which
// keeps the callbacks whose types differ aside: for a v1 plugin `v2.init` is NULL and `init_v1`
// is the plugin's init(), which gets the v1 arguments and store table. Made once per loaded
// plugin and never freed (a plugin is never unloaded).
struct PluginTable {
  int abi_version = 0;  // the version the plugin exports (1 or 2)
  weftBackendPlugin_v2_t v2{};
  weft_result_t (*init_v1)(const weftInitArgs_v1_t* args, void** context, char* error,
                           size_t error_size) = nullptr;
};

// The v2 table for a v1 plugin (checked by the loader already).
PluginTable adapt_plugin_v1(const weftBackendPlugin_v1_t* plugin);

// One group's backend on `plugin`, serving device kind `kind`: calls the plugin's init() on the
// context's plugin thread and waits for it up to the group's timeout plus a margin (max(1 s,
// timeout / 10)). Throws Error(Timeout) naming the plugin and init() past that, or the Error of
// the code init() failed with. The backend's operations run as runtime/plugin_core.h describes.
std::unique_ptr<Backend> make_plugin_backend(const PluginTable* plugin,
                                             const BackendOptions& options, DeviceKind kind);

}  // namespace weft
