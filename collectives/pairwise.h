// collectives/pairwise.h: all_to_all by pairwise exchange, even and with split sizes.
//
// How it works. Input and output each hold P *blocks* back to back, block j of the input for
// rank j and block j of the output from rank j. Rank r copies its own block locally, then runs
// P-1 *steps*: in step s it sends its block for rank r+s and receives the block from rank r-s
// (mod P). Every rank talks to exactly one receiver and one sender per step and every pair meets
// exactly once, so no link carries two messages at a time and no rank is flooded by P-1 senders
// together, which is what makes this the algorithm for large blocks (Bruck's log2 P steps win
// only for tiny blocks; planner.h).
//
// Cost with P ranks and S bytes of input per rank: P-1 steps; each rank sends and receives
// (P-1)/P * S bytes (with even blocks).
//
// With split sizes every rank passes all P send counts and all P receive counts; rank r's
// send_counts[j] must equal rank j's recv_counts[r]. A disagreement is the caller's bug: the
// transport reports it as Error(Protocol) naming both sizes. Zero-sized blocks are still sent
// (as empty messages) so that a zero against a non-zero is a Protocol error, not a hang.
#pragma once

#include <cstddef>
#include <span>

#include "collectives/context.h"

namespace weft::collectives {

// Even all_to_all: input and output hold P * count elements. They may be the same buffer or
// overlap (the input is then staged in a scratch copy first); the input is otherwise unchanged.
void pairwise_all_to_all(const Context& ctx, const void* input, void* output, size_t count,
                         DType dtype);

// all_to_all with split sizes (counts in elements, one per rank). input holds sum(send_counts)
// elements, output sum(recv_counts); send_counts[rank] must equal recv_counts[rank]. Overlap as
// above.
void pairwise_all_to_all(const Context& ctx, const void* input, void* output,
                         std::span<const size_t> send_counts, std::span<const size_t> recv_counts,
                         DType dtype);

}  // namespace weft::collectives
