#include "collectives/dissemination.h"

#include <bit>
#include <cstddef>

namespace weft::collectives {

void dissemination_barrier(const Context& ctx) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const int steps = std::bit_width(static_cast<unsigned>(size - 1));
  const std::byte token{1};
  std::byte received{0};
  detail::Inflight inflight(ctx, "dissemination barrier");
  int step = 0;
  for (int distance = 1; distance < size; distance *= 2, ++step) {
    const Request recv =
        inflight.recv((rank - distance + size) % size, &received, 1, static_cast<uint32_t>(step));
    const Request send =
        inflight.send((rank + distance) % size, &token, 1, static_cast<uint32_t>(step));
    inflight.wait(recv, "", step, steps);
    inflight.wait(send, "", step, steps);
  }
}

}  // namespace weft::collectives
