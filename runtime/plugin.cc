// runtime/plugin.cc: loading backend plugins (weft/plugin.h) into the Registry.
//
// The loader finds libweft-backend-NAME.so (WEFT_PLUGIN_PATH, then the install's plugin
// directory, or a path), refuses anything that is not a regular file before opening it, checks
// the exported struct and turns it into a Registry entry whose factory makes a PluginBackend
// (runtime/plugin_backend.h).
#include "weft/plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/backend.h"

#include "runtime/backend_module.h"
#include "runtime/log.h"
#include "runtime/plugin_backend.h"

#ifndef WEFT_PLUGIN_DIR
#define WEFT_PLUGIN_DIR "/usr/local/lib/weft/plugins"
#endif

namespace weft {

namespace {

// The newest ABI version this weft implements, and how far beyond it to look for a plugin that
// is newer than this weft (only to say so).
constexpr int kAbiVersion = 2;
constexpr int kProbeNewerUpTo = 9;

std::vector<std::string> search_dirs() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("WEFT_PLUGIN_PATH")) {
    std::string_view rest = path;
    while (!rest.empty()) {
      size_t colon = rest.find(':');
      std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) dirs.emplace_back(dir);
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  dirs.emplace_back(WEFT_PLUGIN_DIR);
  return dirs;
}

// What a loaded library exports: a C ABI plugin or an in-tree module (runtime/backend_module.h).
struct Loaded {
  const PluginTable* plugin = nullptr;
  const BackendModule* module = nullptr;
  std::string name() const { return plugin ? plugin->v2.name : module->name; }
  // For the log: "ABI v2" or "in-tree module".
  std::string kind() const {
    return plugin ? fmt::format("ABI v{}", plugin->abi_version) : "in-tree module";
  }
};

// The backends built in this tree as modules of their own, with what they need at run time: a
// name among them that cannot be loaded is "not available", saying why and what to install.
struct OptionalModule {
  std::string_view name;
  std::string_view needs;
};
constexpr OptionalModule kOptionalModules[] = {
    {"ucx",
     "UCX's libraries (libucp.so.0: `apt-get install libucx0` on Debian and Ubuntu); weft builds "
     "the module when libucx-dev is installed (meson feature -Ducx=auto, or enabled)"},
};

// Checks an in-tree module's export; returns it or throws with why it is refused.
const BackendModule* check_module(const BackendModule* module, const std::string& file,
                                  std::string_view expected_name) {
  auto refuse = [&](std::string_view why) {
    throw_error(ErrorCode::InvalidArgument, "backend plugin", fmt::format("{}: {}", file, why));
  };
  if (module->build == nullptr || std::string_view(module->build) != kBackendModuleBuild) {
    refuse(
        fmt::format("a weft module built for \"{}\", not this weft (\"{}\"): in-tree modules "
                    "load only into the weft they were built with; reinstall them together",
                    module->build ? module->build : "?", kBackendModuleBuild));
  }
  if (module->name == nullptr || module->name[0] == '\0') refuse("its name is empty");
  if (!expected_name.empty() && expected_name != module->name) {
    refuse(fmt::format("it calls itself \"{}\", not \"{}\"", module->name, expected_name));
  }
  if (module->entry == nullptr) refuse("its entry function is NULL");
  return module;
}

// The checks every version shares, on its struct's leading members (the same in every version:
// name, abi_version, struct_size, devices) and callbacks. Throws through `refuse`.
template <typename Plugin, typename Refuse>
void check_members(const Plugin* plugin, int version, std::string_view expected_name,
                   const Refuse& refuse) {
  if (plugin->abi_version != static_cast<uint32_t>(version)) {
    refuse(fmt::format("weftBackendPlugin_v{} says abi_version {}, not {}", version,
                       plugin->abi_version, version));
  }
  if (plugin->struct_size != sizeof(Plugin)) {
    refuse(
        fmt::format("weftBackendPlugin_v{} has struct_size {}, this weft's plugin.h defines {} "
                    "bytes: it was built against a different plugin.h",
                    version, plugin->struct_size, sizeof(Plugin)));
  }
  if (plugin->name == nullptr || plugin->name[0] == '\0') refuse("its name is empty");
  if (!expected_name.empty() && expected_name != plugin->name) {
    refuse(fmt::format("it calls itself \"{}\", not \"{}\"", plugin->name, expected_name));
  }
  if (plugin->init == nullptr || plugin->post == nullptr || plugin->abort == nullptr ||
      plugin->finalize == nullptr) {
    refuse("init, post, abort and finalize are required and one is NULL");
  }
  if ((plugin->devices & ((1u << WEFT_DEVICE_CPU) | (1u << WEFT_DEVICE_CUDA))) == 0) {
    refuse(fmt::format("it serves no device kind weft knows (devices = {:#x})", plugin->devices));
  }
}

// Checks one opened library; returns its table (lifted to the newest version) or throws with
// why it is refused. The newest version the library exports is the one used.
const PluginTable* check_plugin(void* handle, const std::string& file,
                                std::string_view expected_name) {
  auto refuse = [&](std::string_view why) {
    throw_error(ErrorCode::InvalidArgument, "backend plugin", fmt::format("{}: {}", file, why));
  };
  if (const auto* v2 =
          static_cast<const weftBackendPlugin_v2_t*>(dlsym(handle, WEFT_PLUGIN_SYMBOL_V2))) {
    check_members(v2, 2, expected_name, refuse);
    return new PluginTable{.abi_version = 2, .v2 = *v2};  // never freed: plugins stay loaded
  }
  if (const auto* v1 =
          static_cast<const weftBackendPlugin_v1_t*>(dlsym(handle, WEFT_PLUGIN_SYMBOL_V1))) {
    check_members(v1, 1, expected_name, refuse);
    return new PluginTable(adapt_plugin_v1(v1));
  }
  std::vector<std::string> newer;
  for (int version = kAbiVersion + 1; version <= kProbeNewerUpTo; ++version) {
    std::string symbol = fmt::format("weftBackendPlugin_v{}", version);
    if (dlsym(handle, symbol.c_str()) != nullptr) newer.push_back(symbol);
  }
  if (!newer.empty()) {
    refuse(
        fmt::format("it exports only {}, newer than this weft, which loads "
                    "weftBackendPlugin_v1 up to v{}: rebuild it against this weft's "
                    "plugin.h, or upgrade weft",
                    fmt::join(newer, ", "), kAbiVersion));
  }
  refuse(
      fmt::format("exports no weftBackendPlugin_vN symbol (this weft loads v1 up to v{}); "
                  "is it a weft backend plugin?",
                  kAbiVersion));
  return nullptr;  // not reached: refuse() throws
}

Registry::Entry entry_for(const Loaded& loaded) {
  if (loaded.module != nullptr) {
    Registry::Entry entry;
    loaded.module->entry(&entry);
    entry.name = loaded.module->name;
    return entry;
  }
  const PluginTable* table = loaded.plugin;
  const weftBackendPlugin_v2_t* plugin = &table->v2;
  Registry::Entry entry;
  entry.name = plugin->name;
  if (plugin->devices & (1u << WEFT_DEVICE_CPU)) entry.devices.push_back(DeviceKind::Cpu);
  if (plugin->devices & (1u << WEFT_DEVICE_CUDA)) entry.devices.push_back(DeviceKind::Cuda);
  // The group makes one backend per device kind it maps to this plugin; a context serves one.
  DeviceKind kind = entry.devices.front();
  entry.factory = [table, kind](const BackendOptions& options) -> std::unique_ptr<Backend> {
    return make_plugin_backend(table, options, kind);
  };
  return entry;
}

// "a FIFO", "a directory", ...: what a path that is not a regular file is.
std::string_view file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Refuses `file` unless it is a regular file (after symbolic links), looking with stat(), never
// open(): dlopen() of a FIFO blocks until something writes to it, and a device may never end.
void check_regular(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    const int err = errno;
    throw_error(ErrorCode::InvalidArgument, "backend plugin",
                fmt::format("{}: {}", file, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw_error(ErrorCode::InvalidArgument, "backend plugin",
                fmt::format("{}: {}, not a regular file: refused without opening it (a plugin is "
                            "a shared library file)",
                            file, file_kind(st.st_mode)));
  }
}

// Opens `file` (a path); never closed: a plugin may keep threads and statics until exit.
Loaded open_plugin(const std::string& file, std::string_view expected_name) {
  check_regular(file);
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw_error(ErrorCode::InvalidArgument, "backend plugin",
                fmt::format("{}: dlopen failed: {}", file, why ? why : "unknown error"));
  }
  try {
    Loaded loaded;
    if (const auto* module =
            static_cast<const BackendModule*>(dlsym(handle, kBackendModuleSymbol))) {
      loaded.module = check_module(module, file, expected_name);
    } else {
      loaded.plugin = check_plugin(handle, file, expected_name);
    }
    return loaded;
  } catch (...) {
    dlclose(handle);
    throw;
  }
}

}  // namespace

std::string Registry::load_plugin(const std::string& path) {
  const Loaded loaded = open_plugin(path, "");
  const std::string name = loaded.name();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry& known : entries_) {
      if (known.name == name) {  // loaded before (or a built-in): this table is not needed
        delete loaded.plugin;
        return known.name;
      }
    }
  }
  add(entry_for(loaded));
  WEFT_LOG_INFO("loaded backend plugin \"{}\" from {} ({})", name, path, loaded.kind());
  return name;
}

Registry::Entry Registry::resolve(std::string_view name) {
  if (name.find('/') != std::string_view::npos) return find(load_plugin(std::string(name)));
  if (contains(name)) return find(name);
  const std::string file = fmt::format("libweft-backend-{}.so", name);
  std::vector<std::string> tried;
  for (const std::string& dir : search_dirs()) {
    std::string path = (std::filesystem::path(dir) / file).string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      tried.push_back(fmt::format("{}: not there", path));
      continue;
    }
    try {
      const Loaded loaded = open_plugin(path, name);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const Entry& known : entries_) {
          if (known.name == name) {  // another thread loaded it meanwhile
            delete loaded.plugin;
            return known;
          }
        }
      }
      add(entry_for(loaded));
      WEFT_LOG_INFO("loaded backend plugin \"{}\" from {} ({})", name, path, loaded.kind());
      return find(name);
    } catch (const Error& e) {
      // Refused or unloadable: say why, and go on with the next directory.
      WEFT_LOG_WARN("{}", e.what());
      tried.push_back(e.what());
    }
  }
  for (const OptionalModule& optional : kOptionalModules) {
    if (optional.name != name) continue;
    // One of weft's own optional backends: say it is not there, why, and what it needs.
    const bool none_found = std::all_of(tried.begin(), tried.end(), [](const std::string& t) {
      return t.ends_with(": not there");
    });
    throw_error(
        ErrorCode::InvalidArgument, "backend registry",
        fmt::format("backend \"{}\" is not available: {}; it needs {}", name,
                    none_found ? fmt::format("this weft was built without it ({} is in neither "
                                             "WEFT_PLUGIN_PATH nor {})",
                                             file, WEFT_PLUGIN_DIR)
                               : fmt::format("{}", fmt::join(tried, "; ")),
                    optional.needs));
  }
  throw_error(
      ErrorCode::InvalidArgument, "backend registry",
      fmt::format("unknown backend \"{}\"; known backends: {}; no usable plugin {} in "
                  "WEFT_PLUGIN_PATH or {}:\n  {}",
                  name, fmt::join(names(), ", "), file, WEFT_PLUGIN_DIR, fmt::join(tried, "\n  ")));
}

}  // namespace weft
