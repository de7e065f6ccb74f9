#include "collectives/gather_scatter.h"

#include <vector>

#include "weft/error.h"

#include "runtime/copy.h"

namespace weft::collectives {
namespace {

// Checks the arguments shared by gather and scatter; returns the block size in bytes. `whole` is
// the P-block buffer (the root's output for gather, input for scatter), `block` the one-block one.
size_t check_rooted(std::string_view where, const Context& ctx, const void* whole,
                    const void* block_buffer, size_t count, DType dtype, int root) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  detail::check_root(where, root, size);
  const size_t block = detail::checked_bytes(where, count, dtype);
  if (block > 0 && static_cast<size_t>(size) > SIZE_MAX / block) {
    throw_error(ErrorCode::InvalidArgument, where, "P blocks overflow size_t");
  }
  detail::check_buffer(where, block_buffer, block, "the one-block buffer");
  if (rank == root) {
    detail::check_buffer(where, whole, block * size, "the root's P-block buffer");
    const void* mine = static_cast<const std::byte*>(whole) + rank * block;
    if (block_buffer != mine && detail::overlaps(whole, block * size, block_buffer, block)) {
      throw_error(ErrorCode::InvalidArgument, where,
                  "the buffers overlap without one being the root's own block of the other");
    }
  }
  return block;
}

}  // namespace

void linear_gather(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                   int root) {
  constexpr std::string_view kWhere = "linear gather";
  const size_t block = check_rooted(kWhere, ctx, output, input, count, dtype, root);
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  if (block == 0) return;
  detail::Inflight inflight(ctx, kWhere);
  if (rank != root) {
    inflight.wait(inflight.send(root, input, block, 0), "send", 0, 1);
    return;
  }
  auto* out = static_cast<std::byte*>(output);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) inflight.recv(peer, out + peer * block, block, 0);
  }
  // Nothing reads this rank's block afterwards: a large one is written around the caches.
  if (out + rank * block != input) copy_bytes(out + rank * block, input, block);
  inflight.wait_all("receive", 0, 1);
}

void linear_scatter(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                    int root) {
  constexpr std::string_view kWhere = "linear scatter";
  const size_t block = check_rooted(kWhere, ctx, input, output, count, dtype, root);
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  if (block == 0) return;
  detail::Inflight inflight(ctx, kWhere);
  if (rank != root) {
    inflight.wait(inflight.recv(root, output, block, 0), "receive", 0, 1);
    return;
  }
  const auto* in = static_cast<const std::byte*>(input);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) inflight.send(peer, in + peer * block, block, 0);
  }
  if (output != in + rank * block) copy_bytes(output, in + rank * block, block);
  inflight.wait_all("send", 0, 1);
}

}  // namespace weft::collectives
