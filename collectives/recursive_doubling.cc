#include "collectives/recursive_doubling.h"

#include <bit>

#include "weft/error.h"

#include "runtime/reduce.h"

namespace weft::collectives {
namespace {

// Tag steps: 0 folds in, 1..log2(P') the exchanges, kFoldOutStep folds out.
constexpr uint32_t kFoldInStep = 0;
constexpr uint32_t kFoldOutStep = phase_step(1);

}  // namespace

void recursive_doubling_all_reduce(const Context& ctx, const void* input, void* output,
                                   size_t count, DType dtype, ReduceOp op) {
  constexpr std::string_view kWhere = "recursive_doubling all_reduce";
  const size_t bytes = detail::checked_bytes(kWhere, count, dtype);
  reduce::check_supported(dtype, op);
  detail::check_buffer(kWhere, input, bytes, "input");
  detail::check_buffer(kWhere, output, bytes, "output");
  if (input != output && detail::overlaps(input, bytes, output, bytes)) {
    throw_error(ErrorCode::InvalidArgument, kWhere, "input and output overlap but differ");
  }
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  if (count == 0) return;

  if (reduce::needs_premultiply(op)) {
    reduce::premultiply(output, input, count, dtype, op.factor);
  } else {
    detail::copy_unless_same(output, input, bytes);
  }
  const int power = static_cast<int>(std::bit_floor(static_cast<unsigned>(size)));
  const int extra = size - power;
  const int steps = std::countr_zero(static_cast<unsigned>(power));
  const int total_steps = steps + (extra > 0 ? 2 : 0);  // for error messages only

  detail::Inflight inflight(ctx, kWhere);
  // This rank's number among the P' ranks of the exchange, or -1 for a folded-in even rank.
  int new_rank;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      inflight.wait(inflight.send(rank + 1, output, bytes, kFoldInStep), "fold-in", 0, total_steps);
      new_rank = -1;
    } else {
      inflight.wait(inflight.recv_reduce(rank - 1, output, count, dtype, op, kFoldInStep),
                    "fold-in", 0, total_steps);
      new_rank = rank / 2;
    }
  } else {
    new_rank = rank - extra;
  }

  if (new_rank >= 0 && steps > 0) {
    // The partner's buffer cannot be reduced straight into ours (recv_reduce) while ours is
    // being sent, so it lands in scratch first.
    const detail::Scratch scratch(ctx, bytes);
    for (int step = 0; step < steps; ++step) {
      const int partner_new = new_rank ^ (1 << step);
      const int partner = partner_new < extra ? partner_new * 2 + 1 : partner_new + extra;
      const uint32_t tag = static_cast<uint32_t>(step + 1);
      const Request recv = inflight.recv(partner, scratch.data(), bytes, tag);
      const Request send = inflight.send(partner, output, bytes, tag);
      const int shown = step + (extra > 0 ? 1 : 0);
      inflight.wait(recv, "exchange", shown, total_steps);
      inflight.wait(send, "exchange", shown, total_steps);
      reduce::accumulate(output, scratch.data(), count, dtype, op);
    }
  }

  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      inflight.wait(inflight.recv(rank + 1, output, bytes, kFoldOutStep), "fold-out",
                    total_steps - 1, total_steps);
    } else {
      inflight.wait(inflight.send(rank - 1, output, bytes, kFoldOutStep), "fold-out",
                    total_steps - 1, total_steps);
    }
  }
  reduce::finalize(output, count, dtype, op, size);
}

}  // namespace weft::collectives
