// collectives/ring.h: the ring algorithms, for large messages: all_reduce as a reduce-scatter
// followed by an all-gather, and each of those two phases on its own.
//
// How it works. The P ranks form a ring: rank r sends to r+1 and receives from r-1 (mod P). The
// buffer is cut into P *chunks*, one per rank (chunk c starts at element offsets[c]; for
// all_reduce the S bytes are split as evenly as the element count allows: sizes differ by at
// most one element). Each *step* moves one chunk per rank one hop along the ring:
//
//   reduce-scatter, steps 0..P-2: rank r sends chunk r-s-1 and receives chunk r-s-2, reducing
//     it into its own copy. A chunk thus travels the ring once, picking up one contribution per
//     hop, and after P-1 steps rank r holds chunk r fully reduced.
//   all-gather, steps 0..P-2: rank r sends chunk r-s (its own first) and receives chunk r-s-1,
//     which it forwards in the next step; after P-1 steps every rank holds every chunk.
//
// Each chunk is cut into *segments* of at most segment_bytes, and the two phases pipeline them:
// the receive of segment k+1 is posted before segment k is waited for (and so reduced, by the
// transport's recv_reduce), and segment k is forwarded as soon as it has arrived, without
// waiting for the rest of its chunk. Reduction of one segment thus overlaps the transfer of the
// next, and a large chunk never needs to fit a transport's buffer at once.
//
// Cost with P ranks and S bytes: all_reduce takes 2(P-1) steps and each rank sends and receives
// 2(P-1)/P * S bytes, the minimum for any all_reduce (bandwidth-optimal); the latency term grows
// linearly with P, which is why small messages go to recursive doubling (see planner.h).
// reduce_scatter and all_gather take P-1 steps and (P-1)/P of their full buffer each.
//
// Reduction order: chunk c is reduced along the ring starting at rank c+1:
// x[c] op (x[c-1] op (... op (x[c+2] op x[c+1]))) with ranks mod P. Every rank gets the same
// bits for chunk c, but different chunks see different orders, so a float sum may differ in the
// last bits from recursive doubling's or a sequential sum.
#pragma once

#include <cstddef>
#include <span>

#include "collectives/context.h"

namespace weft::collectives {

// All-reduce of `count` elements. input and output hold count elements each; equal pointers
// mean in place; otherwise they must not overlap and input is left unchanged. Avg divides by P
// and PremulSum scales every input by op.factor before the sum.
void ring_all_reduce(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                     ReduceOp op, size_t segment_bytes = kDefaultSegmentBytes);

// Reduce-scatter "from one tensor": input holds P blocks back to back (rank-major), block i of
// counts[i] elements; rank r's output receives block r reduced over all ranks (counts[r]
// elements). input is never modified; output may lie anywhere, including inside input (the
// reduction runs in a scratch copy of input: S extra bytes per call).
void ring_reduce_scatter(const Context& ctx, const void* input, void* output,
                         std::span<const size_t> counts, DType dtype, ReduceOp op,
                         size_t segment_bytes = kDefaultSegmentBytes);
// The same with equal blocks: input holds P * count elements, output count.
void ring_reduce_scatter(const Context& ctx, const void* input, void* output, size_t count,
                         DType dtype, ReduceOp op, size_t segment_bytes = kDefaultSegmentBytes);
// Reduce-scatter of a list: inputs[j] (P pointers) holds the count elements meant for rank j,
// output receives count elements. The inputs are never modified; output may alias any of them.
void ring_reduce_scatter(const Context& ctx, std::span<const void* const> inputs, void* output,
                         size_t count, DType dtype, ReduceOp op,
                         size_t segment_bytes = kDefaultSegmentBytes);

// All-gather into one tensor, rank-major, with per-rank sizes: rank r contributes counts[r]
// elements from input, and output receives every rank's block back to back (sum(counts)
// elements). In place when input points at rank r's block within output; otherwise input must
// not overlap output.
void ring_all_gather(const Context& ctx, const void* input, void* output,
                     std::span<const size_t> counts, DType dtype,
                     size_t segment_bytes = kDefaultSegmentBytes);
// The same with equal blocks: input holds count elements, output P * count.
void ring_all_gather(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                     size_t segment_bytes = kDefaultSegmentBytes);

}  // namespace weft::collectives
