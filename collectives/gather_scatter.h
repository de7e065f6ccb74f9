// collectives/gather_scatter.h: gather and scatter with any root, equal block sizes: linear.
//
// How it works. gather: every non-root rank sends its *block* to the root, which posts all P-1
// receives at once, straight into their places in its output, and waits for them. scatter: the
// mirror image; the root posts P-1 sends of the blocks of its input and each other rank receives
// one.
//
// Why linear, not binomial. Either way the root's link carries (P-1) * B bytes (B the block
// size), and that link is the bottleneck; a binomial tree only saves message start-ups at the
// root (log2 P instead of P-1), but the root posts all P-1 at once and they overlap, while the
// tree costs every inner rank a staging buffer, a second copy of its subtree's blocks and
// ceil(log2 P) dependent steps. At the world sizes one host runs (<= 8 ranks) and the message
// sizes c10d users gather, linear wins; a tree would pay off for tiny blocks on hundreds of
// ranks, which the planner can add when a benchmark shows it.
//
// Cost with P ranks and blocks of B bytes: one *step*; the root receives (or sends) (P-1) * B
// bytes, every other rank sends (receives) B.
#pragma once

#include <cstddef>

#include "collectives/context.h"

namespace weft::collectives {

// Gathers `count` elements from every rank's input into the root's output, rank-major
// (P * count elements). On other ranks output is not touched and may be null. On the root, input
// may be its own block of output (in place); otherwise it must not overlap output.
void linear_gather(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                   int root);

// Scatters the root's input (P * count elements, rank-major) so that rank r's output receives
// block r (count elements). On other ranks input is not read and may be null. On the root,
// output may be its own block of input (in place); otherwise it must not overlap input.
void linear_scatter(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                    int root);

}  // namespace weft::collectives
