#include "collectives/context.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include <fmt/format.h>

#include "weft/error.h"

namespace weft::collectives::detail {

Scratch::Scratch(const Context& ctx, size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  if (ctx.scratch != nullptr) {
    lease_ = ctx.scratch->get(bytes);
  } else {
    // Uninitialised, like pool memory: every algorithm writes its scratch before reading it.
    owned_.reset(static_cast<std::byte*>(::operator new[](bytes, kAlignment)));
  }
}

size_t checked_bytes(std::string_view where, size_t count, DType dtype) {
  if (!is_valid(dtype)) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("dtype {} is not a DType", static_cast<int>(dtype)));
  }
  const size_t element = dtype_size(dtype);
  if (count > std::numeric_limits<size_t>::max() / element) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{} elements of {} overflow size_t", count, dtype_name(dtype)));
  }
  return count * element;
}

void check_buffer(std::string_view where, const void* ptr, size_t bytes, std::string_view name) {
  if (ptr == nullptr && bytes > 0) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{} is null but must hold {} bytes", name, bytes));
  }
}

void check_root(std::string_view where, int root, int size) {
  if (root < 0 || root >= size) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("root {} is not a rank of a group of {}", root, size));
  }
}

std::vector<size_t> offsets_of(std::string_view where, std::span<const size_t> counts, int size) {
  if (counts.size() != static_cast<size_t>(size)) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{} per-rank counts given for a group of {}", counts.size(), size));
  }
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > std::numeric_limits<size_t>::max() - offsets[i]) {
      throw_error(ErrorCode::InvalidArgument, where, "per-rank counts overflow size_t");
    }
    offsets[i + 1] = offsets[i] + counts[i];
  }
  return offsets;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

void copy_unless_same(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

void run_phase(std::string_view where, std::string_view name, const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{} {}: {}", where, name, e.what()));
  }
}

Inflight::~Inflight() {
  // Only reached with requests left after an exception: cancel them (a past deadline) so that
  // the transport lets go of our buffers; their own errors are secondary to the one in flight.
  for (uint64_t id : posted_) {
    try {
      ctx_.transport.wait(Request{id}, Clock::now());
    } catch (...) {
    }
  }
}

Request Inflight::send(int peer, const void* data, size_t bytes, uint32_t step) {
  posted_.reserve(posted_.size() + 1);  // so that recording the request cannot throw
  const Request request = ctx_.transport.send(peer, data, bytes, make_tag(ctx_.seq, step));
  posted_.push_back(request.id);
  return request;
}

Request Inflight::recv(int peer, void* data, size_t bytes, uint32_t step) {
  posted_.reserve(posted_.size() + 1);
  const Request request = ctx_.transport.recv(peer, data, bytes, make_tag(ctx_.seq, step));
  posted_.push_back(request.id);
  return request;
}

Request Inflight::recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                              uint32_t step) {
  posted_.reserve(posted_.size() + 1);
  const Request request =
      ctx_.transport.recv_reduce(peer, dst, count, dtype, op, make_tag(ctx_.seq, step));
  posted_.push_back(request.id);
  return request;
}

void Inflight::forget(Request request) {
  auto it = std::find(posted_.begin(), posted_.end(), request.id);
  WEFT_CHECK(it != posted_.end(), "waiting for a request this algorithm did not post");
  posted_.erase(it);
}

void Inflight::wait(Request request, std::string_view phase, int step, int steps) {
  forget(request);  // finished whether wait returns or throws
  try {
    ctx_.transport.wait(request, ctx_.deadline);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}{}{} step {}/{}: {}", algorithm_, phase.empty() ? "" : " ",
                                      phase, step + 1, steps, e.what()));
  }
}

void Inflight::progress() {
  if (posted_.empty()) return;
  try {
    ctx_.transport.test(Request{posted_.back()});
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", algorithm_, e.what()));
  }
}

void Inflight::wait_all(std::string_view phase, int step, int steps) {
  while (!posted_.empty()) wait(Request{posted_.front()}, phase, step, steps);
}

}  // namespace weft::collectives::detail
