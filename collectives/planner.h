// collectives/planner.h: which algorithm runs a collective, chosen by op, bytes, world size and
// link, or forced by name (WEFT_ALGO, for benchmarks and tests).
//
// The choice is a cost model with two regimes per op: a latency-bound one for small messages,
// where the number of steps decides (recursive doubling, Bruck: log2 P steps), and a
// bandwidth-bound one for large messages, where the bytes each rank moves decide (the ring:
// 2(P-1)/P * S for all_reduce against recursive doubling's log2(P) * S). With a per-message
// start-up cost a and a per-byte cost b, the two cross where
//   a * (2(P-1) - log2 P) = b * S * (log2 P - 2(P-1)/P),
// about S = 9 a/b at P = 8. The thresholds below plug in ASSUMED link figures, to be replaced by
// measured ones once weft-perf runs on both transports (docs/benchmarks.md):
//   shared memory: a ~ 1 us, 1/b ~ 4 GB/s  -> crossover ~ 32 KiB
//   TCP and UCX:   a ~ 25 us, 1/b ~ 1 GB/s -> crossover ~ 256 KiB
//
// Halving-doubling (Rabenseifner, halving_doubling.h) is the mid-size candidate for all_reduce and
// reduce_scatter; choose() does not pick it yet, pending measurements. When P is a power of two
// it moves the ring's bytes, 2(P-1)/P * S, in 2 log2 P steps instead of 2(P-1): the model puts
// it ahead of recursive doubling from
//   S = a log2 P / (b (log2 P - 2(P-1)/P)),
// about 2.4 a/b at P = 8 (below the 9 a/b above, which is recursive doubling against the ring),
// and never behind the ring. The ring should still take the largest sizes, for what the model
// leaves out: it pipelines segments across steps and talks only to its two neighbours. So for P a
// power of two >= 4 all_reduce would run recursive doubling up to a lowered small-message
// threshold, halving-doubling up to a large-message one, the ring beyond; both thresholds are for
// weft-perf to find. At P = 2 it is the ring, step for step. For other P the fold costs the
// 2(P - P') folded ranks two more steps and 2S more bytes, and the model leaves it little or no
// range (none at P = 6: its crossover with the ring falls below the one with recursive doubling).
// reduce_scatter, ring only today, would take it below a measured threshold likewise: log2 P
// steps against P-1, the same bytes when P is a power of two.
//
// Every other op has one algorithm today (binomial trees for broadcast and reduce, linear gather
// and scatter, pairwise all_to_all, dissemination barrier); the planner names it so that callers
// dispatch through one place and a later alternative slots in here.
//
// Thread safety: the functions keep no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "collectives/hierarchical.h"
#include "collectives/transport.h"

namespace weft::collectives {

enum class Op : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,        // equal blocks
  AllGatherUneven,  // per-rank counts
  Broadcast,
  Reduce,
  Gather,
  Scatter,
  AllToAll,
  Barrier,
};

enum class Algorithm : uint8_t {
  Auto,               // "auto": let the planner choose
  Ring,               // "ring": ring.h
  RecursiveDoubling,  // "recursive_doubling": recursive_doubling.h
  Bruck,              // "bruck": bruck.h
  Tree,               // "tree": binomial_tree.h
  Linear,             // "linear": gather_scatter.h
  Pairwise,           // "pairwise": pairwise.h
  Dissemination,      // "dissemination": dissemination.h
  HalvingDoubling,    // "halving_doubling": halving_doubling.h
  Hierarchical,       // "hierarchical": hierarchical.h (all_reduce, reduce_scatter, all_gather,
                      // broadcast on groups that span nodes; chosen by use_hierarchical())
  Slots,              // "slots": slot_collectives.h (small all_reduce, reduce, all_gather,
                      // reduce_scatter, broadcast and barrier on a group on one host, when its
                      // transport offers shared slots; chosen by the dispatch, not by choose())
  Bounce,             // "bounce": symmetric.h's bounce_all_reduce, _reduce_scatter, _all_gather
                      // (from 64 KiB of input on a group on one host with shared memory, through
                      // the group's bounce region; chosen by the dispatch, not by choose())
};

// Crossovers (bytes) from the model above; assumptions until measured.
inline constexpr size_t kSmallMessageBytesSharedMemory = 32 * 1024;
inline constexpr size_t kSmallMessageBytesNetwork = 256 * 1024;

// "all_reduce", "reduce_scatter", ...; the names above in lower case.
std::string_view op_name(Op op);
std::string_view algorithm_name(Algorithm algorithm);
// The names above; nullopt for anything else. Case-sensitive, as WEFT_ALGO is documented.
std::optional<Algorithm> parse_algorithm(std::string_view name);

// Whether `algorithm` implements `op` (Auto implements everything).
bool supports(Op op, Algorithm algorithm);

// The algorithm for `op` on `world_size` ranks whose slowest link is `link`. `bytes` is what the
// choice scales with: all_reduce, broadcast and reduce: the buffer; all_gather: the whole output
// (P blocks); others: ignored. Never returns Auto.
Algorithm choose(Op op, size_t bytes, int world_size, Link link);

// Whether `op` runs hierarchically (hierarchical.h) on a group laid out as `layout`: over
// `bytes` (as choose() counts them) from `root` (broadcast; ignored otherwise). Auto says yes
// when the group spans several nodes and the model says it pays:
//   all_reduce, reduce_scatter, all_gather: every node has the same number L >= 2 of ranks and
//     the flat algorithm would be bandwidth-bound (bytes above the network's small-message
//     crossover): the links between nodes then carry (H-1)/H instead of (P-1)/P of the bytes,
//     for the price of two shared-memory phases. Below the crossover the steps decide, and the
//     hierarchy adds steps.
//   broadcast: the flat binomial tree from `root` has more than H-1 edges between nodes (any
//     size: the hierarchical tree never crosses more often).
// Forced "hierarchical" runs it wherever it can (several nodes; for all but broadcast, the same
// number of ranks on each); any other forced name that supports `op` keeps the flat algorithms.
// The flat algorithm is then choose()'s, which never returns Hierarchical.
bool use_hierarchical(Op op, size_t bytes, const NodeLayout& layout, int root,
                      std::string_view forced);

// The same with an override, as WEFT_ALGO gives it: "" or "auto" chooses as above; a name that
// supports `op` is used; a name that does not (WEFT_ALGO=ring for a barrier) is ignored for this
// op, so one variable can force the algorithm of the collective under benchmark without breaking
// the others. An unknown name throws Error(InvalidArgument) listing the valid ones.
Algorithm choose(Op op, size_t bytes, int world_size, Link link, std::string_view forced);

}  // namespace weft::collectives
