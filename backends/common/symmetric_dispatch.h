// backends/common/symmetric_dispatch.h: runs a Collective zero-copy when its tensors lie in
// symmetric buffers (collectives/symmetric.h), the switch beside collective_dispatch.h's.
//
// plan_symmetric() decides, on the posting thread, from this rank's tensors alone: all_reduce,
// reduce_scatter and all_gather (equal blocks) whose input and output both lie in symmetric
// buffers of the group, broadcast whose output does (the root's input may lie anywhere), and
// reduce whose input does (the root's output may lie anywhere), run zero-copy; so does all_to_all
// whose input and output do, when every rank's splits turn out equal (run_symmetric); everything
// else, and any collective inside a coalesced unit, takes the message path. Every rank decides
// alike when the program passes the same kind of memory on every rank; where it does not, the ranks
// that went zero-copy time out in their barrier naming the others, and the others time out on their
// messages. The plan holds a use of each buffer, so a buffer cannot be released (and stays mapped
// if its handle goes) until the collective is over.
//
// In a group that spans hosts (each buffer one mapping per host), all_reduce, reduce_scatter,
// all_gather and broadcast run zero-copy hierarchically (symmetric.h) when every host has the
// same number of ranks; on uneven hosts, and for every other collective, the message path runs
// (on every rank alike: each rank knows the layout), with the tensors in symmetric memory.
//
// Thread safety: plan_symmetric() from any thread; run_symmetric() on the progress thread.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "weft/backend.h"

#include "collectives/context.h"
#include "collectives/symmetric.h"

namespace weft::backends {

struct SymmetricPlan {
  std::vector<std::shared_ptr<collectives::SymmetricRegion::Use>> uses;
  collectives::SymmetricOperand input;  // region null for a broadcast
  collectives::SymmetricOperand output;
  collectives::SymmetricRegion* anchor = nullptr;
  collectives::SymmetricCall call;
  bool in_place = false;     // all_gather: every rank's input is its block of the output
  bool root_output = false;  // reduce: only the root's call names the output (SymmetricContext)
  bool negotiate = false;    // all_to_all: the ranks' splits decide after the barrier
  // The group's hosts when it spans several (the hierarchical algorithms); null on one host.
  const collectives::NodeLayout* hosts = nullptr;
};

// The zero-copy plan of `c`, or nullopt for the message path. Throws Error(InvalidArgument) with
// `context` when any tensor of `c` (whatever its kind, zero-copy or not) starts inside a symmetric
// buffer and runs past its end. `layout`: the group's nodes (must outlive the plan).
std::optional<SymmetricPlan> plan_symmetric(collectives::SymmetricMemory* memory,
                                            const Collective& c, const ErrorContext& context,
                                            const collectives::NodeLayout& layout);

// Runs `c` by `plan`, with ctx's deadline and scratch; false when it did not, having found with
// every rank that the message path must (an all_to_all whose splits are not equal everywhere),
// which every rank then takes. Throws what the algorithm throws.
bool run_symmetric(const Collective& c, const collectives::Context& ctx,
                   collectives::SymmetricMemory& memory, const SymmetricPlan& plan);

}  // namespace weft::backends
