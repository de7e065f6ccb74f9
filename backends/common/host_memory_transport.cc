#include "backends/common/host_memory_transport.h"

#include "weft/error.h"

namespace weft::backends {

HostMemoryTransport::HostMemoryTransport(std::unique_ptr<collectives::Transport> messages,
                                         std::unique_ptr<collectives::Transport> host)
    : messages_(std::move(messages)), host_(std::move(host)) {
  WEFT_CHECK(messages_ != nullptr && host_ != nullptr);
  WEFT_CHECK(messages_->rank() == host_->rank() && messages_->size() == host_->size());
}

HostMemoryTransport::~HostMemoryTransport() = default;

void HostMemoryTransport::abort(const std::string& reason) {
  // The host transport first: its control sockets are how local peers sleeping in a barrier
  // learn of the abort.
  host_->abort(reason);
  messages_->abort(reason);
}

}  // namespace weft::backends
