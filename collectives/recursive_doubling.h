// collectives/recursive_doubling.h: all_reduce for small messages, where latency (the number of
// steps) matters more than bytes.
//
// How it works. Let P' be the largest power of two <= P and extra = P - P'. First the extra
// ranks are *folded in*: among ranks 0..2*extra-1, each even rank sends its whole buffer to the
// odd rank above it, which reduces it into its own and stands for both; the even ranks then wait.
// The P' remaining ranks are renumbered 0..P'-1 and run log2(P') *steps*: in step k a rank swaps
// its whole buffer with the rank whose new number differs in bit k, and reduces the partner's
// buffer into its own. After the last step every remaining rank holds the full result, and the
// odd ranks *fold it out* by sending it to the even rank they stood for.
//
// Cost with P ranks and S bytes: log2(P') steps of S bytes each way, plus two more steps (fold in
// and out) when P is not a power of two: fast for small S, but each rank moves S * log2(P)
// bytes, against the ring's 2S(P-1)/P, so large messages go to the ring (see planner.h).
//
// Reduction order: in each step the two partners combine the same two values (theirs and the
// partner's), and every op is commutative in runtime/reduce.h's definition (IEEE sum and product
// are, and min/max order -0 and NaN symmetrically), so both get identical bits and, inductively,
// every rank ends with the same result: a balanced tree over the renumbered ranks, after the
// fold-in pairs (2i, 2i+1). It generally differs in the last float bits from the ring's order.
#pragma once

#include <cstddef>

#include "collectives/context.h"

namespace weft::collectives {

// All-reduce of `count` elements. input and output hold count elements each; equal pointers
// mean in place; otherwise they must not overlap and input is left unchanged. Needs a scratch
// buffer of S bytes for the partner's data. Avg divides by P, PremulSum premultiplies.
void recursive_doubling_all_reduce(const Context& ctx, const void* input, void* output,
                                   size_t count, DType dtype, ReduceOp op);

}  // namespace weft::collectives
