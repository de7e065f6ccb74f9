// runtime/plugin_v1.cc: the adapter from version 1 of the plugin ABI (weftBackendPlugin_v1_t) to
// the newest, which the core calls (runtime/plugin_backend.h, PluginTable).
//
// v1 differs from v2 only in init()'s arguments: its store table has no delete_key. The core
// calls a v1 plugin's init() with weftInitArgs_v1_t and a weftStore_v1_t table it keeps for the
// purpose (runtime/plugin_bridge.h); every other callback has the same type in both versions and
// is copied as is.
#include "runtime/plugin_backend.h"

namespace weft {

PluginTable adapt_plugin_v1(const weftBackendPlugin_v1_t* plugin) {
  PluginTable table;
  table.abi_version = 1;
  table.v2.name = plugin->name;
  table.v2.abi_version = WEFT_PLUGIN_ABI_V2;
  table.v2.struct_size = sizeof(weftBackendPlugin_v2_t);
  table.v2.devices = plugin->devices;
  table.v2.init = nullptr;  // init_v1 instead
  table.v2.post = plugin->post;
  table.v2.test = plugin->test;
  table.v2.release = plugin->release;
  table.v2.abort = plugin->abort;
  table.v2.finalize = plugin->finalize;
  table.init_v1 = plugin->init;
  return table;
}

}  // namespace weft
