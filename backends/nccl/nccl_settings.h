// backends/nccl/nccl_settings.h: the nccl backend's own knobs, from WEFT_NCCL_* variables and
// the group's backend settings (BackendOptions::settings), parsed once per backend.
//
//   variable                | setting key          | default | meaning
//   ------------------------+----------------------+---------+-----------------------------------
//   WEFT_NCCL_POLL          | "nccl_poll"          | 1ms     | the watchdog's period while Works
//                           |                      |         | are pending (1ms .. 1s)
//   WEFT_NCCL_BLOCKING_WAIT | "nccl_blocking_wait" | 0       | 1: Work::wait() blocks the host
//                           |                      |         | until the device is done (c10d's
//                           |                      |         | TORCH_NCCL_BLOCKING_WAIT)
//
// A setting key wins over the variable. Values are parsed as WEFT_TIMEOUT and WEFT_SHM are
// (docs/configuration.md); a malformed one is Error(InvalidArgument) naming it, never ignored.
//
// Thread safety: plain functions of their arguments.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>

namespace weft::nccl {

struct NcclSettings {
  std::chrono::milliseconds poll{1};
  bool blocking_wait = false;
};

// Reads the variables through `getenv` (std::getenv in the backend; a map in tests), then the
// keys of `settings`. Throws Error(InvalidArgument) naming the variable or key and the value.
NcclSettings parse_nccl_settings(const std::function<const char*(const char*)>& getenv,
                                 const std::map<std::string, std::string>& settings);

}  // namespace weft::nccl
