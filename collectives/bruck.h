// collectives/bruck.h: Bruck's all_gather, for small blocks, where the number of steps matters
// more than bytes.
//
// How it works. Rank r keeps a working array of P *blocks* in which block i is rank (r+i)'s data
// once known; it starts with its own block at position 0. In *step* k (distance d = 2^k) rank r
// sends its first min(d, P-d) blocks to rank r-d and receives as many from rank r+d, placing them
// at positions d.. : rank r+d's first blocks are ranks r+d, r+d+1, ..., exactly the ones r is
// missing next. After ceil(log2 P) steps all P blocks are there, in the order r, r+1, ...; one
// rotation by r blocks puts them in rank order. Unlike recursive doubling this needs no power of
// two: the last step simply sends fewer blocks.
//
// Cost with P ranks and blocks of B bytes: ceil(log2 P) steps; each rank sends and receives
// (P-1) * B bytes in all (optimal), plus one local rotation of P * B bytes, which is why large
// blocks go to the ring (see planner.h).
#pragma once

#include <cstddef>

#include "collectives/context.h"

namespace weft::collectives {

// All-gather into one tensor, rank-major: input holds `count` elements, output P * count. In place
// when input points at this rank's block within output; otherwise they must not overlap.
void bruck_all_gather(const Context& ctx, const void* input, void* output, size_t count,
                      DType dtype);

}  // namespace weft::collectives
