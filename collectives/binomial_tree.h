// collectives/binomial_tree.h: broadcast and reduce over a binomial tree rooted at any rank.
//
// How it works. Ranks are renumbered relative to the root, v = (r - root) mod P, so the root is
// 0. In the binomial tree, v's parent is v with its lowest set bit cleared, and its children are
// v + 2^k for every 2^k below that bit (for the root: every 2^k < P) that is still < P. A tree on
// P ranks has depth ceil(log2 P), whatever P: non-powers of two just have a missing subtree.
//
//   broadcast: the root sends to its children, largest subtree first (so the deepest path starts
//     earliest); every other rank receives from its parent, then sends to its children. Long
//     buffers are cut into *segments* of at most segment_bytes, and a rank forwards segment k as
//     soon as it has arrived while segment k+1 is still in flight, so the tree is a pipeline and
//     depth costs one segment's time, not one buffer's.
//   reduce: the mirror image. A rank reduces its children's buffers into its own, smallest
//     subtree first (it arrives first), then sends the sum to its parent.
//
// Cost with P ranks and S bytes: ceil(log2 P) *steps*; broadcast: a rank with c children sends
// c * S bytes (the root log2 P times S: the root's link is the bottleneck, which is why large
// broadcasts would prefer scatter + all-gather; not needed at the sizes the planner sends here).
// reduce: a rank receives and reduces c * S bytes and sends S.
//
// Reduction order (reduce): the root gets x[v=0] op x[1] op (x[2] op x[3]) op ((x[4] op x[5]) op
// (x[6] op x[7])) ... with relative ranks, each subtree reduced first: fixed for a given root
// and P, but it changes with the root.
#pragma once

#include <cstddef>

#include "collectives/context.h"

namespace weft::collectives {

// Broadcasts `bytes` bytes at `data` from rank `root` to every rank's `data`. In place by
// nature: the root's data is only read.
void binomial_broadcast(const Context& ctx, void* data, size_t bytes, int root,
                        size_t segment_bytes = kDefaultSegmentBytes);

// Reduces `count` elements from every rank's input into the root's output. On the root, input
// and output hold count elements and may be equal (in place) but must not otherwise overlap; on
// other ranks output is not touched and may be null. input is never modified. Non-root ranks
// with children reduce in a scratch buffer of S bytes. Avg divides by P on the root.
void binomial_reduce(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                     ReduceOp op, int root);

}  // namespace weft::collectives
