#include "collectives/binomial_tree.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "weft/error.h"

#include "runtime/reduce.h"

namespace weft::collectives {

void binomial_broadcast(const Context& ctx, void* data, size_t bytes, int root,
                        size_t segment_bytes) {
  constexpr std::string_view kWhere = "binomial broadcast";
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  detail::check_root(kWhere, root, size);
  detail::check_buffer(kWhere, data, bytes, "data");
  if (segment_bytes == 0) {
    throw_error(ErrorCode::InvalidArgument, kWhere, "segment_bytes must be positive");
  }
  if (bytes == 0 || size == 1) return;

  const int v = (rank - root + size) % size;
  const int depth = std::bit_width(static_cast<unsigned>(size - 1));
  // The lowest set bit of v is the edge to the parent; the root's "parent edge" is past P.
  const int parent_bit =
      v == 0 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(size))) : (v & -v);
  std::vector<int> children;  // largest subtree first
  for (int bit = parent_bit / 2; bit >= 1; bit /= 2) {
    if (v + bit < size) children.push_back((v + bit + root) % size);
  }
  const int level = std::countr_zero(static_cast<unsigned>(parent_bit));  // for messages only
  auto* buffer = static_cast<std::byte*>(data);
  const size_t segments = (bytes + segment_bytes - 1) / segment_bytes;
  auto segment_size = [&](size_t segment) {
    return std::min(segment_bytes, bytes - segment * segment_bytes);
  };

  detail::Inflight inflight(ctx, kWhere);
  if (v == 0) {
    for (size_t segment = 0; segment < segments; ++segment) {
      for (int child : children) {
        inflight.send(child, buffer + segment * segment_bytes, segment_size(segment), 0);
      }
    }
  } else {
    const int parent = (v - parent_bit + root) % size;
    std::vector<Request> recvs(segments);
    auto post_recv = [&](size_t segment) {
      recvs[segment] =
          inflight.recv(parent, buffer + segment * segment_bytes, segment_size(segment), 0);
    };
    post_recv(0);
    for (size_t segment = 0; segment < segments; ++segment) {
      if (segment + 1 < segments) post_recv(segment + 1);
      inflight.wait(recvs[segment], "receive", depth - level - 1, depth);
      for (int child : children) {
        inflight.send(child, buffer + segment * segment_bytes, segment_size(segment), 0);
      }
    }
  }
  inflight.wait_all("send", depth - level, depth);
}

void binomial_reduce(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                     ReduceOp op, int root) {
  constexpr std::string_view kWhere = "binomial reduce";
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  detail::check_root(kWhere, root, size);
  const size_t bytes = detail::checked_bytes(kWhere, count, dtype);
  reduce::check_supported(dtype, op);
  detail::check_buffer(kWhere, input, bytes, "input");
  if (rank == root) {
    detail::check_buffer(kWhere, output, bytes, "output");
    if (input != output && detail::overlaps(input, bytes, output, bytes)) {
      throw_error(ErrorCode::InvalidArgument, kWhere, "input and output overlap but differ");
    }
  }
  if (count == 0) return;

  const int v = (rank - root + size) % size;
  // A leaf (odd v, or the last ranks) sends the caller's input as it is, unless it must be
  // premultiplied; everyone else accumulates in the root's output or in scratch.
  const bool leaf = v != 0 && (v & 1) == 1;
  const bool needs_scratch = rank != root && (!leaf || reduce::needs_premultiply(op));
  const detail::Scratch scratch(ctx, needs_scratch ? bytes : 0);
  const void* accumulated = input;
  void* accumulator = nullptr;
  if (rank == root) {
    accumulator = output;
  } else if (needs_scratch) {
    accumulator = scratch.data();
  }
  if (accumulator != nullptr) {
    if (reduce::needs_premultiply(op)) {
      reduce::premultiply(accumulator, input, count, dtype, op.factor);
    } else {
      detail::copy_unless_same(accumulator, input, bytes);
    }
    accumulated = accumulator;
  }

  const int depth = std::bit_width(static_cast<unsigned>(size - 1));
  detail::Inflight inflight(ctx, kWhere);
  int step = 0;
  for (int bit = 1; bit < size; bit *= 2, ++step) {
    if (v & bit) {
      const int parent = (v - bit + root) % size;
      inflight.wait(inflight.send(parent, accumulated, bytes, static_cast<uint32_t>(step)), "send",
                    step, depth);
      break;
    }
    if (v + bit < size) {
      const int child = (v + bit + root) % size;
      inflight.wait(
          inflight.recv_reduce(child, accumulator, count, dtype, op, static_cast<uint32_t>(step)),
          "reduce", step, depth);
    }
  }
  if (rank == root) reduce::finalize(output, count, dtype, op, size);
}

}  // namespace weft::collectives
