#include "collectives/sub_transport.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/error.h"

namespace weft::collectives {

SubTransport::SubTransport(Transport& parent, std::vector<int> members, uint32_t step_offset)
    : parent_(parent), members_(std::move(members)), step_offset_(step_offset) {
  for (size_t i = 0; i < members_.size(); ++i) {
    const int r = members_[i];
    if (r < 0 || r >= parent_.size() ||
        std::find(members_.begin(), members_.begin() + static_cast<std::ptrdiff_t>(i), r) !=
            members_.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw_error(ErrorCode::InvalidArgument, "sub-transport",
                  fmt::format("members {} are not distinct ranks of a group of {}",
                              fmt::join(members_, ", "), parent_.size()));
    }
    if (r == parent_.rank()) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0) {
    throw_error(ErrorCode::InvalidArgument, "sub-transport",
                fmt::format("rank {} is not among the members {}", parent_.rank(),
                            fmt::join(members_, ", ")));
  }
  WEFT_CHECK(step_offset_ <= kStepMask, "a step offset beyond the step field");
}

int SubTransport::parent_rank(int peer) const {
  if (peer < 0 || peer >= size()) {
    throw_error(ErrorCode::InvalidArgument, "sub-transport",
                fmt::format("rank {} of a part of {} ranks", peer, size()));
  }
  return members_[static_cast<size_t>(peer)];
}

Tag SubTransport::shifted(Tag tag) const {
  if (step_offset_ == 0) return tag;
  WEFT_CHECK((tag & kPointToPointBit) == 0 && (tag & kStepField) + step_offset_ <= kStepMask,
             "a shifted step leaves the step field");
  return tag + step_offset_;
}

Request SubTransport::send(int peer, const void* data, size_t bytes, Tag tag) {
  return parent_.send(parent_rank(peer), data, bytes, shifted(tag));
}

Request SubTransport::recv(int peer, void* data, size_t bytes, Tag tag) {
  return parent_.recv(parent_rank(peer), data, bytes, shifted(tag));
}

Request SubTransport::recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                                  Tag tag) {
  return parent_.recv_reduce(parent_rank(peer), dst, count, dtype, op, shifted(tag));
}

}  // namespace weft::collectives
