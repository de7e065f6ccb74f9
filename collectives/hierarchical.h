// collectives/hierarchical.h: collectives for groups that span several nodes (hosts, or
// shared-memory domains): a phase inside each node over shared memory, one phase between the
// nodes, and (for all_reduce) a phase inside each node again, so that the slow links between
// nodes carry as few bytes as the collective allows.
//
// Nodes come from Transport::node_of(); NodeLayout lists them. Inside a node the ranks have a
// *local index* 0..L-1 (by rank). The *rail* of local index l is the l-th rank of every node:
// rails are how the inter-node phase runs, L of them side by side, each on 1/L of the data, so
// every rank of a node (and every connection it has) carries its share, as NCCL's rings over
// NVLink-then-network do.
//
//   all_reduce (S bytes): reduce-scatter inside the node (each local rank ends with 1/L of the
//     node's sum), all_reduce of that shard along its rail (the planner's choice for S/L bytes
//     on H ranks), all-gather inside the node. Per node, the links between nodes carry
//     2(H-1)/H * S bytes each way, against the flat ring's 2(P-1)/P * S across every node
//     boundary it crosses (with P = H * L ranks: 1.5 S against 1 S at 2 x 2, 1.75 S against
//     1 S at 2 x 4).
//   reduce_scatter (S bytes in): inside the node, every rank sends each local peer the blocks
//     of that peer's rail straight from the input and reduces the blocks of its own rail as they
//     arrive (peers in a fixed order, so the bits do not depend on timing); then a ring
//     reduce-scatter along the rail leaves each rank its own block. (H-1)/H * S between nodes
//     per node, against the flat ring's (P-1)/P * S.
//   all_gather (S bytes out): every block goes straight to its place in the output, first to
//     the same local index on every other node (along the rail), then from each rank to its
//     local peers (the rail's H blocks). (H-1)/H * S between nodes per node, against
//     (P-1)/P * S; no scratch and no copy but the rank's own block.
//   broadcast: a binomial tree between one leader per node (the root on its own node, the first
//     rank on the others), then a binomial tree inside each node: each byte crosses between
//     nodes H-1 times, which the flat tree exceeds when the root's neighbours by rank are on
//     other nodes.
//
// The three rail-based ones need the same number of ranks on every node (the planner runs the
// flat algorithms otherwise); broadcast takes any layout. Avg and PremulSum: the premultiply
// happens once per input (in the first phase), the sum through every phase, and Avg's division
// by P once at the end, so results are those of the flat algorithms' definition
// (runtime/reduce.h); the summation order differs, so floating sums may differ from the flat
// ring's in the last bits.
//
// Failure: a phase's error keeps its code and gains the phase: "hierarchical all_reduce (2 nodes
// x 2 ranks) inter-node phase: ring all_reduce reduce-scatter step 1/1: ...", with peers named
// by their rank in the group (the phases run on views of the group's transport,
// sub_transport.h).
//
// Scratch: reduce_scatter S/L bytes (the rail's sum; PremulSum S more for the premultiplied
// input); all_gather, all_reduce and broadcast none of their own (the inner algorithms' only).
//
// Thread safety: as every algorithm (context.h).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "collectives/context.h"

namespace weft::collectives {

// The nodes of a group, as every rank sees them alike.
struct NodeLayout {
  // The ranks of each node, ascending; nodes in the order of their lowest rank.
  std::vector<std::vector<int>> nodes;
  int node = 0;   // this rank's node
  int local = 0;  // this rank's index in it

  int node_count() const { return static_cast<int>(nodes.size()); }
  // The number of ranks on every node, or 0 when the nodes differ.
  int ranks_per_node() const;
  // The l-th rank of every node, in node order. REQUIRES: l < ranks_per_node().
  std::vector<int> rail(int l) const;
  // The node that rank r is on.
  int node_of_rank(int r) const;
};

// The layout from one node id per rank (any numbers: equal ids, one node), for rank `rank`.
NodeLayout node_layout(std::span<const int> node_ids, int rank);
// The layout of `transport`'s group, by Transport::node_of().
NodeLayout node_layout(const Transport& transport);

// All-reduce of `count` elements, as ring_all_reduce (ring.h): in place when input == output,
// else they must not overlap. REQUIRES (else Error(InvalidArgument)): layout.ranks_per_node() > 0.
void hierarchical_all_reduce(const Context& ctx, const NodeLayout& layout, const void* input,
                             void* output, size_t count, DType dtype, ReduceOp op);

// Reduce-scatter from one tensor with per-rank counts, as ring_reduce_scatter (ring.h): output
// may lie anywhere, input is never modified. REQUIRES: layout.ranks_per_node() > 0.
void hierarchical_reduce_scatter(const Context& ctx, const NodeLayout& layout, const void* input,
                                 void* output, std::span<const size_t> counts, DType dtype,
                                 ReduceOp op);

// All-gather of equal blocks, rank-major, as ring_all_gather (ring.h): in place when input is this
// rank's block within output, else they must not overlap. REQUIRES: layout.ranks_per_node() > 0.
void hierarchical_all_gather(const Context& ctx, const NodeLayout& layout, const void* input,
                             void* output, size_t count, DType dtype);

// Broadcast of `bytes` bytes from `root`, as binomial_broadcast (binomial_tree.h). Any layout.
void hierarchical_broadcast(const Context& ctx, const NodeLayout& layout, void* data, size_t bytes,
                            int root);

// How many edges of the flat binomial broadcast tree from `root` join ranks of different nodes:
// the planner's measure of what the hierarchical one saves (it has node_count() - 1).
int binomial_tree_cross_node_edges(const NodeLayout& layout, int root);

}  // namespace weft::collectives
