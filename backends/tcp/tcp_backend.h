// backends/tcp/tcp_backend.h: "tcp", weft's default CPU backend (Gloo's role in c10d).
//
// A TransportBackend (backends/common/transport_backend.h: dispatch to the algorithms, the
// group-failure policy, the progress thread) over a RoutedTransport: shared-memory rings between
// ranks on one host, TCP between hosts (WEFT_SHM=0 or the setting shm=0 forces TCP). This file
// only connects the transport; it registers itself as "tcp" for the cpu device.
#pragma once

#include <memory>

#include "weft/backend.h"

namespace weft::tcp {

// Connects the group (collective over its ranks). Throws what RoutedTransport::connect throws,
// and Error(InvalidArgument) for a bad "shm" setting.
std::unique_ptr<Backend> create_tcp_backend(const BackendOptions& options);

}  // namespace weft::tcp
