// collectives/symmetric.h: zero-copy collectives on symmetric buffers (symmetric_memory.h).
//
// When every tensor of a collective lies in a symmetric buffer, at the same offset on every rank,
// each rank can read its peers' inputs and write their outputs through the shared mapping: no
// message carries data, and a reduction is the only work left. Every algorithm here is
//
//   1. enter: a barrier on the anchor region (the buffer of the tensor every rank passes), in
//      which each rank publishes its call (SymmetricCall) and checks that every peer runs the
//      same one (else Error(Desync) naming the first peer that differs);
//   2. this rank's share of the work, straight between the blocks;
//   3. leave: a second barrier, after which every output is final and every input may be reused.
//
// Costs, for P ranks and S bytes per rank (all_reduce: S the tensor; the others as named below):
//   all_reduce      rank r reduces elements [r S/P, (r+1) S/P) of all P inputs, in rank order
//                   0..P-1 (so results are the same bits on every rank and for every P-way
//                   split), through an L2-sized chunk of scratch, then writes the result into
//                   every rank's output: reads S, writes S, reduces (P-1) S/P per rank.
//   reduce_scatter  rank r reduces block r of all P inputs (S = one block) into its output:
//                   reads P S, writes S.
//   all_gather      rank r copies every rank's input (S) into its output: reads and writes P S.
//   broadcast       the root copies its input (which may lie anywhere) into its output (unless
//                   in place), then every rank copies the root's output into its own: reads and
//                   writes S.
//   reduce          as all_reduce, but rank r writes its reduced slice into the root's output
//                   only: reads S, writes S/P, reduces (P-1) S/P per rank. When the root's output
//                   is not in the inputs' buffer (the peers cannot name it), the root reduces all
//                   of it alone: reads P S, writes S; the others only pass the barriers.
//   all_to_all      (S = one block, equal splits everywhere) rank r copies block r of every
//                   rank's input into its output: reads and writes P S. In place, each pair of
//                   blocks is swapped by one of its two ranks. Uneven splits cost two barriers,
//                   then the message path.
// Two barriers each, every one a handful of cache-line transfers plus, when a rank sleeps, a
// futex wake-up. Against the message path (a ring: 2 (P-1)/P S through shared-memory rings, each
// byte copied twice, with 2 (P-1) handshakes), all_reduce saves the copies and the handshakes.
//
// In place: all_reduce and reduce (on the root) with output == input; reduce_scatter with the
// output at this rank's block of the input; all_gather with the input at this rank's block of the
// output; broadcast with output == input. Safe because a rank writes only what no peer reads in the
// same collective (all_reduce: slice r of the outputs, which only rank r reads as input).
//
// Failure: a barrier waits until the context's deadline (Error(Timeout) naming the ranks that had
// not arrived), and fails with Error(PeerLost) naming a dead peer within the memory's liveness
// interval (50 ms) or Error(Aborted) after abort().
//
// Thread safety: none; runs on the thread that drives the group's transport.
#pragma once

#include <cstddef>

#include "weft/dtype.h"
#include "weft/reduce_op.h"

#include "collectives/context.h"
#include "collectives/hierarchical.h"
#include "collectives/symmetric_memory.h"

namespace weft::collectives {

struct SymmetricContext {
  const Context& ctx;  // deadline and scratch; its transport only across hosts (below)
  SymmetricMemory& memory;
  SymmetricRegion& anchor;  // whose barriers the collective uses
  SymmetricCall call;       // what this rank runs, compared with every peer's
  // reduce: call.out_region and out_offset are the root's alone (the others have no output), so
  // the enter barrier compares calls without them, and the peers read them from the root's slot.
  bool root_output = false;
  // all_to_all: only seq and shape must match; the rest of the calls decides whether the ranks
  // run it here or all decline to the message path (symmetric_all_to_all).
  bool negotiate = false;
};

// A tensor in a symmetric buffer: the same `offset` in every rank's block of `region`.
struct SymmetricOperand {
  SymmetricRegion* region = nullptr;
  size_t offset = 0;
  std::byte* at(int rank) const { return region->block(rank) + offset; }
};

void symmetric_all_reduce(const SymmetricContext& c, SymmetricOperand input,
                          SymmetricOperand output, size_t count, DType dtype, ReduceOp op);
// `count`: elements per rank (the output's); the input holds P * count, rank-major.
void symmetric_reduce_scatter(const SymmetricContext& c, SymmetricOperand input,
                              SymmetricOperand output, size_t count, DType dtype, ReduceOp op);
// `count`: elements per rank (the input's); the output holds P * count, rank-major. An input
// without a region means in place on every rank: rank p's input is its block p of the output.
void symmetric_all_gather(const SymmetricContext& c, SymmetricOperand input,
                          SymmetricOperand output, size_t count, DType dtype);
// all_reduce, reduce_scatter and all_gather of ordinary buffers (any memory) between the ranks of
// one host, through the group's bounce region (c.anchor, SymmetricMemory::allocate_bounce). Each
// works in chunks, chunk k in half k % 2 of every rank's block (SymmetricRegion::chunks(), counted
// across calls of all three), and the first barrier of each call's first chunk checks the call
// (c.call), as every symmetric collective's. A rank writes a half only after passing the previous
// chunk's first barrier, which every peer enters after its last read of that half two chunks back:
// so neither needs a barrier at the end.
//   all_reduce      a half is an inputs area and a results area of a chunk each. Each rank
//                   copies the slices of its input chunk that its peers sum into its inputs area;
//                   barrier; rank r sums slice r, in rank order, from its own input and the peers'
//                   areas straight into its output and copies it into its results area; barrier;
//                   each rank copies the peers' slices from their results areas. Per rank and
//                   chunk of C bytes: copies 2 (P-1)/P C, reduces (P-1)/P C.
//   reduce_scatter  (count: elements per block) a chunk is one piece of each of the P blocks,
//                   half a half in all.
//                   Each rank copies its input's pieces of the peers' blocks into its half;
//                   barrier; rank r sums its own block's piece, in rank order, from its input and
//                   the peers' halves straight into its output. One barrier per chunk (two for
//                   a call of one chunk: the call words must stay put until every rank has
//                   compared them); per rank: copies (P-1)/P of its input, reduces the rest.
//   all_gather      (count: elements per block) direct where the host's ranks fit its cores
//                   (SymmetricMemory::ranks_fit_cores) and every rank can read its peers'
//                   memory (reads_peers, agreed through the region): each reads the peers'
//                   inputs straight into its output (read_peer); two barriers per call. Else
//                   staged: a chunk is at most 256 KiB of the rank's input, so that it is still
//                   in cache when the peers read it. Each rank copies its chunk into its half;
//                   barrier; each copies every rank's chunk (its own too, unless in place) from
//                   the halves into its output. Barriers as reduce_scatter's.
// PremulSum premultiplies the rank's own part into the region too; so do ranks from 2 on in place
// (the sum, written straight into the output, would overwrite their own part before its turn).
// Same bits on every rank.
void bounce_all_reduce(const SymmetricContext& c, const void* input, void* output, size_t count,
                       DType dtype, ReduceOp op);
void bounce_reduce_scatter(const SymmetricContext& c, const void* input, void* output, size_t count,
                           DType dtype, ReduceOp op);
void bounce_all_gather(const SymmetricContext& c, const void* input, void* output, size_t count,
                       DType dtype);
// Every rank passes `input`; `output` is the root's (null elsewhere). When the root's call names
// its output in the input's region (out_region == in_region), rank r reduces its slice straight
// into it; otherwise the root reduces every element alone into `output`, wherever it lies.
void symmetric_reduce(const SymmetricContext& c, SymmetricOperand input, void* output, size_t count,
                      DType dtype, ReduceOp op, int root);
// `input` is the root's (anywhere in its memory; ignored elsewhere); every rank passes `output`.
void symmetric_broadcast(const SymmetricContext& c, const void* input, SymmetricOperand output,
                         size_t count, DType dtype, int root);

// Equal splits everywhere: `count` elements per block, input and output P * count, block p to
// (from) rank p; input and output at the same place: in place, each pair of blocks swapped by one
// rank of the pair. Every rank publishes n + 1 in call.factor when it sends and receives n to and
// from everyone (else 0); unless every rank's factor and tensor places are equal, every rank
// returns false after both barriers, touching nothing, and the caller takes the message path.
bool symmetric_all_to_all(const SymmetricContext& c, SymmetricOperand input,
                          SymmetricOperand output, size_t count, DType dtype);

// Groups that span hosts: the anchor region is this host's mapping (its L ranks' blocks, local
// index = SymmetricRegion::rank()), `layout` the group's hosts, each with the same number of ranks
// L, the region's ranks being this host's (the caller checks both). Each is: enter barrier on this
// host; this rank's local share; the inter-host phase over the group's transport along this
// rank's rail (the ranks of the same local index on every host: hierarchical.h), in place in
// symmetric memory; this rank's share pushed to its local peers; leave barrier. No barrier
// between the phases: what the rail phase reads and writes, no local peer touches. For H hosts,
// P = H L ranks, S bytes per rank:
//   all_reduce      rank l reduces slice l (as above) of the L local inputs in local order into
//                   its own output, all_reduces it along the rail (the planner's choice for
//                   S/L bytes on H ranks: every one leaves the same bits on every rank), finalises
//                   (Avg: / P), and writes it into the L-1 local peers' outputs. Between hosts
//                   per rank: 2 (H-1)/H S/L each way for the ring.
//   reduce_scatter  rank l reduces, over the L local inputs, the H blocks of its rail's ranks into
//                   scratch (H S bytes), then a ring reduce-scatter along the rail leaves it its
//                   block: (H-1) S between hosts per rank.
//   all_gather      rank l sends its block to its rail, receives the rail's H-1 others straight
//                   into its output, and copies the rail's H blocks into every local peer's
//                   output: (H-1) S each way between hosts per rank.
//   broadcast       slice l of the root's output is copied by rank l of the root's host into its
//                   own output, broadcast along rail l (binomial tree from the root's host), and
//                   copied by rank l into its local peers' outputs.
// Avg and PremulSum as the one-host ones: premultiplied once, summed through both phases, Avg's
// division once at the end. The summation order (host by host) differs from the one-host
// algorithms' and the message path's, so floating sums may differ from theirs in the last bits;
// every rank gets the same bits. A dead local peer is PeerLost in the barriers as on one host; a
// dead remote one is the transport's PeerLost in the rail phase, or reaches the others through
// the group's failure (a rank whose group broke hangs up).
void symmetric_hierarchical_all_reduce(const SymmetricContext& c, const NodeLayout& layout,
                                       SymmetricOperand input, SymmetricOperand output,
                                       size_t count, DType dtype, ReduceOp op);
void symmetric_hierarchical_reduce_scatter(const SymmetricContext& c, const NodeLayout& layout,
                                           SymmetricOperand input, SymmetricOperand output,
                                           size_t count, DType dtype, ReduceOp op);
// In place when input.region is null (every rank's input is its block of the output).
void symmetric_hierarchical_all_gather(const SymmetricContext& c, const NodeLayout& layout,
                                       SymmetricOperand input, SymmetricOperand output,
                                       size_t count, DType dtype);
void symmetric_hierarchical_broadcast(const SymmetricContext& c, const NodeLayout& layout,
                                      const void* input, SymmetricOperand output, size_t count,
                                      DType dtype, int root);

// The barrier the algorithms use (published for tests): every rank enters it once per call, in
// the same order. With `check_call`, this rank's call is published first and compared with every
// peer's once all have arrived. `phase` names it in errors ("enter", "leave").
void symmetric_barrier(const SymmetricContext& c, bool check_call, const char* phase);

}  // namespace weft::collectives
