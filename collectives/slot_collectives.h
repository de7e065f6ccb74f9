// collectives/slot_collectives.h: small collectives through shared slots (shared_slots.h), one
// barrier each, for groups whose ranks all share one host.
//
// Every one is: write what this rank contributes into its slot (PremulSum: premultiplied), publish
// its call, pass the slot barrier, compare every peer's call with its own (Error(Desync) naming
// the first that differs), then read straight from the peers' slots:
//   all_reduce      every rank reduces the P slots in rank order 0..P-1 into its output (so every
//                   rank gets the same bits) and finalises (Avg: / P): reads P S, no messages.
//   reduce          the same on the root only.
//   all_gather      every rank copies the P slots into its output: reads P S.
//   reduce_scatter  every rank writes its whole input (P blocks); rank r reduces block r of the P
//                   slots, in rank order, into its output.
//   broadcast       the root writes its data; every other rank copies it.
//   barrier         the barrier alone.
// Against the message path (recursive doubling: log2 P rounds, each a hand-off between two ranks
// that may sleep, and a wake-up, 12-15 us each way here), this is one arrival per rank and at most
// one wake-up system call per collective, which matters most when ranks outnumber cores.
//
// slots_fit() says whether a collective goes through the slots: what one rank writes into its
// slot must fit capacity(), and then by what this host measured (docs/symmetric-memory.md,
// "Small collectives on many ranks"; 2-core VM, weft-perf, slots against messages):
//   - all_reduce, all_gather, reduce_scatter: always when the host's ranks outnumber its cores
//     (1.2-4.4x faster at 3 to 8 ranks, 64 B to 64 KiB); else up to kUncrowdedSlotBytes (2 ranks:
//     1.1-1.5x faster up to 4 KiB, 0.84-0.90x at 16 KiB, where reading P slots costs more than
//     the ring's spinning hand-offs).
//   - broadcast, reduce: when the ranks fit the cores; when they do not, only from
//     kCrowdedRootedSlotBytes: below it the message trees, where a rank is done once its part is
//     sent and needs no group-wide barrier, are 2-5x faster (4 and 8 ranks), above it the slots
//     are 1.7-2.3x faster.
//   - barrier: always (2.5x faster at 8 ranks, the same at 4).
// The caller decides alike on every rank (kind and sizes are the same on every rank of a correct
// program, crowded() is agreed at set-up); a program whose ranks disagree gets Error(Desync)
// here, or a Timeout when some ranks take the message path.
//
// Failure: the barrier's (shared_slots.h): Timeout naming the ranks that had not arrived,
// PeerLost, Aborted.
//
// Thread safety: none; runs on the thread that drives the group's transport.
#pragma once

#include <cstddef>

#include "weft/dtype.h"
#include "weft/reduce_op.h"

#include "collectives/context.h"
#include "collectives/planner.h"
#include "collectives/shared_slots.h"

namespace weft::collectives {

// Whether `op`, writing `slot_bytes` into each rank's slot, runs through `slots`: all_reduce,
// reduce, all_gather (equal blocks), reduce_scatter (equal blocks), broadcast and barrier.
inline constexpr size_t kUncrowdedSlotBytes = 8 * 1024;
inline constexpr size_t kCrowdedRootedSlotBytes = 16 * 1024;
bool slots_fit(const SharedSlots& slots, Op op, size_t slot_bytes);

void slot_all_reduce(const Context& ctx, SharedSlots& slots, const void* input, void* output,
                     size_t count, DType dtype, ReduceOp op);
// `output` is the root's (ignored elsewhere).
void slot_reduce(const Context& ctx, SharedSlots& slots, const void* input, void* output,
                 size_t count, DType dtype, ReduceOp op, int root);
// `count` elements per rank; the output holds P * count, rank-major. In place when input is this
// rank's block of the output.
void slot_all_gather(const Context& ctx, SharedSlots& slots, const void* input, void* output,
                     size_t count, DType dtype);
// `count` elements per rank (the output's); the input holds P * count, rank-major.
void slot_reduce_scatter(const Context& ctx, SharedSlots& slots, const void* input, void* output,
                         size_t count, DType dtype, ReduceOp op);
// `data` holds the root's bytes on the root, and receives them elsewhere.
void slot_broadcast(const Context& ctx, SharedSlots& slots, void* data, size_t bytes, int root);
void slot_barrier(const Context& ctx, SharedSlots& slots);

}  // namespace weft::collectives
