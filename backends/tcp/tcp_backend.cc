#include "backends/tcp/tcp_backend.h"

#include <fmt/format.h>

#include "weft/error.h"

#include "backends/common/transport_backend.h"
#include "backends/tcp/routed_transport.h"

namespace weft::tcp {

std::unique_ptr<Backend> create_tcp_backend(const BackendOptions& options) {
  RoutedTransport::Options transport_options;
  transport_options.group_name = options.group_name;
  transport_options.key_prefix = "tcp";
  transport_options.timeout = options.timeout;
  if (auto it = options.settings.find("shm"); it != options.settings.end()) {
    if (it->second != "0" && it->second != "1") {
      throw_error(ErrorCode::InvalidArgument, "tcp backend",
                  fmt::format("setting shm=\"{}\": expected 0 or 1", it->second));
    }
    transport_options.shm = it->second == "1";
  }
  return std::make_unique<backends::TransportBackend>(
      "tcp", options,
      RoutedTransport::connect(*options.store, options.rank, options.size, transport_options));
}

namespace {

const BackendRegistration kRegistration{Registry::Entry{
    "tcp",
    {DeviceKind::Cpu},
    create_tcp_backend,
}};

}  // namespace

}  // namespace weft::tcp
