#include "collectives/pairwise.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"

namespace weft::collectives {
namespace {

constexpr std::string_view kWhere = "pairwise all_to_all";

void exchange(const Context& ctx, const std::byte* in, std::byte* out,
              std::span<const size_t> send_counts, std::span<const size_t> recv_counts,
              const std::vector<size_t>& send_offsets, const std::vector<size_t>& recv_offsets,
              size_t element) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  if (send_counts[rank] > 0) {
    std::memcpy(out + recv_offsets[rank] * element, in + send_offsets[rank] * element,
                send_counts[rank] * element);
  }
  detail::Inflight inflight(ctx, kWhere);
  for (int step = 1; step < size; ++step) {
    const int to = (rank + step) % size;
    const int from = (rank - step + size) % size;
    // Empty blocks are exchanged too (zero-byte messages): a rank cannot know that its peer
    // skips the block it expects, as a rank whose own splits are all 0 took the even path
    // (skipping every block) while its peers, with splits that differ, waited for them.
    inflight.recv(from, out + recv_offsets[from] * element, recv_counts[from] * element,
                  static_cast<uint32_t>(step));
    inflight.send(to, in + send_offsets[to] * element, send_counts[to] * element,
                  static_cast<uint32_t>(step));
    // One pair at a time: the point of the algorithm (see the header).
    inflight.wait_all("", step - 1, size - 1);
  }
}

// Runs the exchange from `input`, or from a scratch copy of it when it overlaps `output`.
void run(const Context& ctx, const void* input, void* output, std::span<const size_t> send_counts,
         std::span<const size_t> recv_counts, DType dtype) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const std::vector<size_t> send_offsets = detail::offsets_of(kWhere, send_counts, size);
  const std::vector<size_t> recv_offsets = detail::offsets_of(kWhere, recv_counts, size);
  const size_t in_bytes = detail::checked_bytes(kWhere, send_offsets.back(), dtype);
  const size_t out_bytes = detail::checked_bytes(kWhere, recv_offsets.back(), dtype);
  if (send_counts[rank] != recv_counts[rank]) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                fmt::format("rank {} sends itself {} elements but expects {}", rank,
                            send_counts[rank], recv_counts[rank]));
  }
  detail::check_buffer(kWhere, input, in_bytes, "input");
  detail::check_buffer(kWhere, output, out_bytes, "output");
  const auto* in = static_cast<const std::byte*>(input);
  const bool overlap = detail::overlaps(input, in_bytes, output, out_bytes);
  const detail::Scratch staged(ctx, overlap ? in_bytes : 0);
  if (overlap) {
    std::memcpy(staged.data(), in, in_bytes);
    in = staged.data();
  }
  exchange(ctx, in, static_cast<std::byte*>(output), send_counts, recv_counts, send_offsets,
           recv_offsets, dtype_size(dtype));
}

}  // namespace

void pairwise_all_to_all(const Context& ctx, const void* input, void* output, size_t count,
                         DType dtype) {
  const std::vector<size_t> counts(std::max(ctx.transport.size(), 0), count);
  run(ctx, input, output, counts, counts, dtype);
}

void pairwise_all_to_all(const Context& ctx, const void* input, void* output,
                         std::span<const size_t> send_counts, std::span<const size_t> recv_counts,
                         DType dtype) {
  run(ctx, input, output, send_counts, recv_counts, dtype);
}

}  // namespace weft::collectives
