// backends/common/collective_dispatch.h: runs one Collective with the algorithm the planner picks.
//
// The one switch from a Collective (include/weft/backend.h) to the algorithms of collectives/:
// all_reduce by the planner's choice (ring, recursive doubling, halving-doubling, or hierarchical
// when the group spans nodes), all_gather, reduce_scatter and broadcast likewise, the rooted ones
// on binomial trees or linear gather/scatter, all_to_all pairwise, barrier by dissemination, and
// send/recv straight on the transport under their point-to-point tags (collectives/tag.h).
//
// Thread safety: none; runs on the thread that drives ctx.transport.
#pragma once

#include <string>

#include "weft/backend.h"

#include "collectives/context.h"
#include "collectives/hierarchical.h"
#include "collectives/planner.h"

namespace weft::backends {

// What the planner plans by, fixed for the life of a group.
struct DispatchPlan {
  collectives::Link slowest_link = collectives::Link::Self;  // this rank's slowest link to a peer
  std::string algo;  // the forced algorithm's name: "" or "auto" lets the planner choose
  collectives::NodeLayout nodes;  // the group's nodes, for hierarchical collectives
};

// The slowest link of this rank to any peer of `transport`.
collectives::Link slowest_link_of(const collectives::Transport& transport);

// Runs `c` to completion on ctx (its transport, sequence number, deadline and scratch pool).
// Throws what the algorithm throws (weft::Error).
void run_collective(const Collective& c, const collectives::Context& ctx, const DispatchPlan& plan);

// Posts a Send or Recv on the transport under its point-to-point tag; the caller waits.
collectives::Request post_point_to_point(collectives::Transport& transport, const Collective& c);

}  // namespace weft::backends
