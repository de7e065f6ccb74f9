#include "collectives/bruck.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "weft/error.h"

namespace weft::collectives {

void bruck_all_gather(const Context& ctx, const void* input, void* output, size_t count,
                      DType dtype) {
  constexpr std::string_view kWhere = "bruck all_gather";
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t block = detail::checked_bytes(kWhere, count, dtype);
  if (block > 0 && static_cast<size_t>(size) > SIZE_MAX / block) {
    throw_error(ErrorCode::InvalidArgument, kWhere, "output size overflows size_t");
  }
  const size_t total = block * size;
  detail::check_buffer(kWhere, input, block, "input");
  detail::check_buffer(kWhere, output, total, "output");
  auto* out = static_cast<std::byte*>(output);
  const std::byte* my_block = out + rank * block;
  if (input != my_block && detail::overlaps(input, block, output, total)) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                "input overlaps output without being this rank's block of it");
  }
  if (total == 0) return;

  // The working array is the output itself. In place, our block moves from position r to 0;
  // memmove because for r == 0 the two are the same.
  std::memmove(out, input, block);
  const int steps = std::bit_width(static_cast<unsigned>(size - 1));  // ceil(log2 P)
  detail::Inflight inflight(ctx, kWhere);
  int step = 0;
  for (int distance = 1; distance < size; distance *= 2, ++step) {
    const size_t blocks = static_cast<size_t>(std::min(distance, size - distance));
    const int to = (rank - distance + size) % size;
    const int from = (rank + distance) % size;
    // Sent blocks [0, blocks) and received [distance, distance + blocks) never overlap.
    const Request recv =
        inflight.recv(from, out + distance * block, blocks * block, static_cast<uint32_t>(step));
    const Request send = inflight.send(to, out, blocks * block, static_cast<uint32_t>(step));
    inflight.wait(recv, "", step, steps);
    inflight.wait(send, "", step, steps);
  }
  // Position i holds rank (r+i) mod P: rotate right by r blocks so that position j holds rank j.
  std::rotate(out, out + (size - rank) % size * block, out + total);
}

}  // namespace weft::collectives
