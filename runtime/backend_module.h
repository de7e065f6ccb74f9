// runtime/backend_module.h: how a backend built in this tree but shipped as its own shared
// library (libweft-backend-ucx.so) registers: through the C++ interface, not the C ABI.
//
// A module links libweft and builds its Backend from weft's own classes (a TransportBackend over
// its Transport); it exports one symbol, kBackendModuleSymbol, a BackendModule that the loader
// (runtime/plugin.cc) finds beside the C ABI's weftBackendPlugin_vN, checks, and asks for a
// Registry::Entry. The backend then runs exactly as a built-in: no plugin thread, no C
// descriptors, no polling, so it is as fast as if it were linked into libweft.
//
// C++ has no stable ABI, so a module loads only into the weft it was built with: `build` must
// equal kBackendModuleBuild (the version and the compiler) or the loader refuses it. Out-of-tree
// backends use the C ABI (weft/plugin.h), which is versioned and stable.
#pragma once

#include "weft/backend.h"

#ifndef WEFT_VERSION
#error "WEFT_VERSION must be defined (meson passes -DWEFT_VERSION)"
#endif

namespace weft {

inline constexpr const char* kBackendModuleSymbol = "weftBackendModule";
// What a module and the libweft loading it must agree on.
inline constexpr const char* kBackendModuleBuild = "weft " WEFT_VERSION " " __VERSION__;

struct BackendModule {
  const char* build;  // kBackendModuleBuild as the module saw it
  const char* name;   // the backend's name: "ucx"
  // Fills the registry entry (name, devices, factory). May throw weft::Error.
  void (*entry)(Registry::Entry* out);
};

}  // namespace weft
