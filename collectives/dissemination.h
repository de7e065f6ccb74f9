// collectives/dissemination.h: barrier by dissemination.
//
// How it works. In *step* k (distance d = 2^k) rank r sends a one-byte token to rank r+d and
// waits for the token from rank r-d (mod P). After step k, rank r has heard, directly or through
// the chain, from ranks r-1 .. r-(2^(k+1)-1); after ceil(log2 P) steps from all of them, so no
// rank leaves before every rank has entered. Unlike a tree barrier (gather then release) it needs
// no second pass and no power of two.
//
// Cost with P ranks: ceil(log2 P) steps, one byte sent and received per step per rank.
//
// The token is one byte rather than an empty message so that a transport needs no special case
// for zero-length sends to carry a barrier.
#pragma once

#include "collectives/context.h"

namespace weft::collectives {

// Returns once every rank of the group has called it (with the same ctx.seq).
void dissemination_barrier(const Context& ctx);

}  // namespace weft::collectives
