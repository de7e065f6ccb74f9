#include "collectives/slot_collectives.h"

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "weft/error.h"

#include "collectives/tag.h"
#include "runtime/reduce.h"

namespace weft::collectives {
namespace {

uint64_t shape_of(Op kind, DType dtype, ReduceOp op, int root) {
  return static_cast<uint64_t>(kind) | static_cast<uint64_t>(dtype) << 8 |
         static_cast<uint64_t>(op.kind) << 16 | static_cast<uint64_t>(root + 1) << 32;
}

// "all_reduce #2 (4096 bytes of float32)", "broadcast #5 (64 bytes from root 1)".
std::string describe(const SlotCall& call) {
  const auto kind = static_cast<Op>(call.shape & 0xff);
  const auto dtype = static_cast<DType>((call.shape >> 8) & 0xff);
  const int root = static_cast<int>(call.shape >> 32) - 1;
  const uint64_t seq = call.seq & ((uint64_t{1} << kTagSeqBits) - 1);
  std::string text = fmt::format("{} #{} ({} bytes", op_name(kind), seq, call.bytes);
  if (kind != Op::Barrier && kind != Op::Broadcast)
    text += fmt::format(" of {}", dtype_name(dtype));
  if (kind == Op::Broadcast || kind == Op::Reduce) text += fmt::format(" from root {}", root);
  return text + ")";
}

// Publishes this rank's call in its slot, passes the barrier and checks every peer's call against
// it.
void exchange(const Context& ctx, SharedSlots& slots, int parity, const SlotCall& mine) {
  const int rank = ctx.transport.rank();
  slots.call(rank, parity) = mine;
  slots.arrive_and_wait(ctx.deadline);
  for (int p = 0; p < ctx.transport.size(); ++p) {
    const SlotCall& theirs = slots.call(p, parity);
    if (theirs == mine) continue;
    throw Error(
        ErrorCode::Desync,
        fmt::format(
            "slot barrier: rank {} runs {} but this rank runs {}: the two ranks called this "
            "collective with different arguments (dtype, count, reduce op or root; the "
            "calls' fingerprints {:04x} and {:04x}), or different collectives, so no data "
            "is used; rerun with WEFT_DEBUG=detail to have every rank's call compared",
            p, describe(theirs), describe(mine), tag_fingerprint(make_tag(theirs.seq, 0)),
            tag_fingerprint(make_tag(mine.seq, 0))));
  }
}

SlotCall call_of(const Context& ctx, Op kind, DType dtype, ReduceOp op, int root, size_t bytes) {
  SlotCall call;
  call.seq = ctx.seq;
  call.shape = shape_of(kind, dtype, op, root);
  call.bytes = bytes;
  call.factor = op.kind == ReduceOp::PremulSum ? std::bit_cast<uint64_t>(op.factor) : 0;
  return call;
}

// This rank's contribution into its slot: premultiplied for PremulSum.
void put(std::byte* slot, const void* input, size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  if (reduce::needs_premultiply(op)) {
    reduce::premultiply(slot, input, count, dtype, op.factor);
  } else {
    std::memcpy(slot, input, count * dtype_size(dtype));
  }
}

// out = slot 0 op slot 1 op ... op slot P-1 (the elements at byte `at` of each), then finalised.
void reduce_slots(SharedSlots& slots, int parity, int ranks, size_t at, void* out, size_t count,
                  DType dtype, ReduceOp op) {
  if (count == 0) return;
  if (ranks == 1) {
    std::memcpy(out, slots.data(0, parity) + at, count * dtype_size(dtype));
  } else {
    reduce::combine(out, slots.data(0, parity) + at, slots.data(1, parity) + at, count, dtype, op);
    for (int p = 2; p < ranks; ++p) {
      reduce::accumulate(out, slots.data(p, parity) + at, count, dtype, op);
    }
  }
  reduce::finalize(out, count, dtype, op, ranks);
}

}  // namespace

bool slots_fit(const SharedSlots& slots, Op op, size_t slot_bytes) {
  if (slot_bytes > slots.capacity()) return false;
  // Nothing to move: the message path returns at once, where a slot barrier waits for every rank.
  if (slot_bytes == 0 && op != Op::Barrier) return false;
  switch (op) {
    case Op::AllReduce:
    case Op::AllGather:
    case Op::ReduceScatter:
      return slots.crowded() || slot_bytes <= kUncrowdedSlotBytes;
    case Op::Broadcast:
    case Op::Reduce:
      return !slots.crowded() || slot_bytes >= kCrowdedRootedSlotBytes;
    case Op::Barrier:
      return true;
    default:
      return false;
  }
}

void slot_all_reduce(const Context& ctx, SharedSlots& slots, const void* input, void* output,
                     size_t count, DType dtype, ReduceOp op) {
  reduce::check_supported(dtype, op);
  const int parity = static_cast<int>(slots.arrivals() & 1);
  const int rank = ctx.transport.rank();
  const size_t bytes = count * dtype_size(dtype);
  put(slots.data(rank, parity), input, count, dtype, op);
  exchange(ctx, slots, parity, call_of(ctx, Op::AllReduce, dtype, op, -1, bytes));
  reduce_slots(slots, parity, ctx.transport.size(), 0, output, count, dtype, op);
}

void slot_reduce(const Context& ctx, SharedSlots& slots, const void* input, void* output,
                 size_t count, DType dtype, ReduceOp op, int root) {
  reduce::check_supported(dtype, op);
  const int parity = static_cast<int>(slots.arrivals() & 1);
  const int rank = ctx.transport.rank();
  const size_t bytes = count * dtype_size(dtype);
  put(slots.data(rank, parity), input, count, dtype, op);
  exchange(ctx, slots, parity, call_of(ctx, Op::Reduce, dtype, op, root, bytes));
  if (rank == root) reduce_slots(slots, parity, ctx.transport.size(), 0, output, count, dtype, op);
}

void slot_all_gather(const Context& ctx, SharedSlots& slots, const void* input, void* output,
                     size_t count, DType dtype) {
  const int parity = static_cast<int>(slots.arrivals() & 1);
  const int rank = ctx.transport.rank();
  const size_t bytes = count * dtype_size(dtype);
  auto* out = static_cast<std::byte*>(output);
  if (bytes > 0) std::memcpy(slots.data(rank, parity), input, bytes);
  exchange(ctx, slots, parity, call_of(ctx, Op::AllGather, dtype, ReduceOp{}, -1, bytes));
  if (bytes == 0) return;
  for (int p = 0; p < ctx.transport.size(); ++p) {
    if (p == rank && input == out + p * bytes) continue;  // in place: already there
    std::memcpy(out + p * bytes, slots.data(p, parity), bytes);
  }
}

void slot_reduce_scatter(const Context& ctx, SharedSlots& slots, const void* input, void* output,
                         size_t count, DType dtype, ReduceOp op) {
  reduce::check_supported(dtype, op);
  const int parity = static_cast<int>(slots.arrivals() & 1);
  const int rank = ctx.transport.rank();
  const int size = ctx.transport.size();
  const size_t bytes = count * dtype_size(dtype);
  put(slots.data(rank, parity), input, count * size, dtype, op);
  exchange(ctx, slots, parity,
           call_of(ctx, Op::ReduceScatter, dtype, op, -1, bytes * static_cast<size_t>(size)));
  reduce_slots(slots, parity, size, bytes * rank, output, count, dtype, op);
}

void slot_broadcast(const Context& ctx, SharedSlots& slots, void* data, size_t bytes, int root) {
  const int parity = static_cast<int>(slots.arrivals() & 1);
  const int rank = ctx.transport.rank();
  if (rank == root && bytes > 0) std::memcpy(slots.data(rank, parity), data, bytes);
  exchange(ctx, slots, parity, call_of(ctx, Op::Broadcast, DType::UInt8, ReduceOp{}, root, bytes));
  if (rank != root && bytes > 0) std::memcpy(data, slots.data(root, parity), bytes);
}

void slot_barrier(const Context& ctx, SharedSlots& slots) {
  const int parity = static_cast<int>(slots.arrivals() & 1);
  exchange(ctx, slots, parity, call_of(ctx, Op::Barrier, DType::UInt8, ReduceOp{}, -1, 0));
}

}  // namespace weft::collectives
