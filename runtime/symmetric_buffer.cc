// SymmetricBuffer's views and lookup (weft/symmetric_buffer.h); the buffers themselves are the
// backends' (collectives/symmetric_memory.h).
#include "weft/symmetric_buffer.h"

#include <fmt/format.h>

#include "weft/error.h"

namespace weft {

namespace {

std::string who(const SymmetricBuffer& buffer) {
  return fmt::format("symmetric buffer #{} of group \"{}\"", buffer.id(), buffer.group_name());
}

}  // namespace

Tensor SymmetricBuffer::view(DType dtype, size_t offset_bytes, size_t count) const {
  void* base = data();
  if (base == nullptr) {
    throw_error(ErrorCode::InvalidArgument, who(*this) + " view", "the buffer was released");
  }
  const size_t element = dtype_size(dtype);
  if (offset_bytes > size() || (element != 0 && count > (size() - offset_bytes) / element)) {
    throw_error(ErrorCode::InvalidArgument, who(*this) + " view",
                fmt::format("{} x {} at byte {} does not fit in its {} bytes", dtype_name(dtype),
                            count, offset_bytes, size()));
  }
  return Tensor{static_cast<std::byte*>(base) + offset_bytes, count, dtype, Device{}};
}

std::optional<size_t> SymmetricBuffer::offset_of(const void* p, size_t bytes) const {
  const auto* base = static_cast<const std::byte*>(data());
  const auto* at = static_cast<const std::byte*>(p);
  if (base == nullptr || at < base || at >= base + size()) return std::nullopt;
  const size_t offset = static_cast<size_t>(at - base);
  if (bytes > size() - offset) {
    throw_error(ErrorCode::InvalidArgument, who(*this),
                fmt::format("a tensor of {} bytes at byte {} runs past the buffer's end ({} "
                            "bytes): it straddles the buffer and other memory",
                            bytes, offset, size()));
  }
  return offset;
}

}  // namespace weft
