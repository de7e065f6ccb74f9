#include "runtime/store_server_connection.h"

#include <sys/socket.h>

#include <cerrno>

namespace weft {
namespace {

// Output buffers above this are released once drained, so that one large reply (a MULTI_GET of
// big values) does not pin its memory for the connection's lifetime.
constexpr size_t kKeepOutputCapacity = 64 * 1024;

}  // namespace

StoreServerConnection::FlushResult StoreServerConnection::flush() {
  while (out_head_ < out_.size()) {
    ssize_t n = ::send(socket_.fd(), out_.data() + out_head_, out_.size() - out_head_,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_head_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return FlushResult::WouldBlock;
    return FlushResult::Failed;
  }
  out_head_ = 0;
  if (out_.capacity() > kKeepOutputCapacity) {
    std::string().swap(out_);
  } else {
    out_.clear();
  }
  return FlushResult::Done;
}

}  // namespace weft
