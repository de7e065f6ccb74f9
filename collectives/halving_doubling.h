// collectives/halving_doubling.h: reduce_scatter by recursive halving, and all_reduce as that
// reduce-scatter followed by an all-gather by recursive doubling (Rabenseifner's algorithm), for
// mid-sized messages on many ranks: the ring's bytes in log2 P steps instead of P-1.
//
// How it works. Let P' be the largest power of two <= P and extra = P - P'. The buffer is P
// *blocks*, block j meant for rank j (all_reduce cuts its count into P blocks as evenly as the
// element count allows, as the ring does).
//
//   fold-in: among ranks 0..2*extra-1, each even rank sends its whole buffer to the odd rank
//     above it, which reduces it into its own and stands for both; the even rank takes no part
//     until the end. The P' remaining ranks are renumbered 0..P'-1 (odd rank 2i < 2*extra is i,
//     rank r >= 2*extra is r - extra), and new rank v *owns* blocks 2v and 2v+1 if v < extra,
//     else block v + extra: a contiguous range, in rank order, so every group of consecutive new
//     ranks owns one contiguous range of elements.
//   reduce-scatter, steps 0..log2(P')-1 (vector halving, distance halving): in step k the
//     distance is d = P'/2^(k+1); a rank's group of 2d consecutive new ranks splits into two
//     halves of d, and the rank swaps with the rank d away in the other half: it sends the
//     *half* (elements) owned by the partner's half, and reduces the partner's copy of its own
//     half into its own (recv_reduce). The range a rank works on halves each step; after the
//     last it holds its own blocks, reduced over all ranks.
//   all-gather, steps 0..log2(P')-1 (vector doubling, distance doubling), only for all_reduce:
//     in step k (d = 2^k) a rank swaps the range its group of d holds with the rank d away,
//     whose group holds the neighbouring range; after the last every remaining rank holds
//     everything.
//   fold-out: each odd rank below 2*extra sends the even rank below it its share: the whole
//     result for all_reduce, block 2i for reduce_scatter.
// Each step's half goes as one message (no segments): the transport's recv_reduce still
// reduces the pieces of a large message as they land (transport.h), but unlike the ring a step
// does not start forwarding before the previous one has finished.
//
// Cost with P ranks and S bytes, when P is a power of two: all_reduce takes 2 log2 P steps and
// each rank sends and receives 2(P-1)/P * S bytes, the ring's (bandwidth-optimal) figure in
// log2 P steps instead of P-1, so it beats the ring where latency still counts: mid sizes and
// many ranks. reduce_scatter takes log2 P steps and (P-1)/P of its input. Otherwise P' replaces
// P and the fold adds two steps in which the 2*extra folded ranks move S more each way
// (reduce_scatter: S in, one block out), which is what the planner weighs (planner.h).
// Partners are not neighbours: a rank talks to log2 P different ranks, not just two.
//
// Reduction order: the fold-in pairs (2i, 2i+1) first; then, over the renumbered ranks, a
// balanced tree that combines partners differing in the highest bit of the new number first and
// in bit 0 last. Every op is commutative in runtime/reduce.h's definition, so which partner's
// value comes first does not change the bits, and each element is reduced by exactly one rank
// and copied to the others: every rank gets the same bits. The tree differs from the ring's
// chain and from recursive doubling's (which starts at bit 0), so a float sum may differ from
// theirs in the last bits.
#pragma once

#include <cstddef>
#include <span>

#include "collectives/context.h"

namespace weft::collectives {

// All-reduce of `count` elements. input and output hold count elements each; equal pointers
// mean in place; otherwise they must not overlap and input is left unchanged. Avg divides by P
// and PremulSum scales every input by op.factor before the sum. Needs no scratch: it works in
// output.
void halving_doubling_all_reduce(const Context& ctx, const void* input, void* output, size_t count,
                                 DType dtype, ReduceOp op);

// Reduce-scatter "from one tensor": input holds P blocks back to back (rank-major), block i of
// counts[i] elements; rank r's output receives block r reduced over all ranks (counts[r]
// elements). input is never modified; output may lie anywhere, including inside input (the
// reduction runs in a scratch copy of input: S extra bytes per call, none on a folded-in even
// rank unless the op is PremulSum).
void halving_doubling_reduce_scatter(const Context& ctx, const void* input, void* output,
                                     std::span<const size_t> counts, DType dtype, ReduceOp op);
// The same with equal blocks: input holds P * count elements, output count.
void halving_doubling_reduce_scatter(const Context& ctx, const void* input, void* output,
                                     size_t count, DType dtype, ReduceOp op);

}  // namespace weft::collectives
