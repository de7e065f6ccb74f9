#include "collectives/planner.h"

#include <array>
#include <utility>

#include <fmt/format.h>

#include "weft/error.h"

namespace weft::collectives {
namespace {

constexpr std::array<std::pair<Algorithm, std::string_view>, 12> kAlgorithmNames = {{
    {Algorithm::Auto, "auto"},
    {Algorithm::Ring, "ring"},
    {Algorithm::RecursiveDoubling, "recursive_doubling"},
    {Algorithm::Bruck, "bruck"},
    {Algorithm::Tree, "tree"},
    {Algorithm::Linear, "linear"},
    {Algorithm::Pairwise, "pairwise"},
    {Algorithm::Dissemination, "dissemination"},
    {Algorithm::HalvingDoubling, "halving_doubling"},
    {Algorithm::Hierarchical, "hierarchical"},
    {Algorithm::Slots, "slots"},
    {Algorithm::Bounce, "bounce"},
}};

size_t small_message_bytes(Link link) {
  switch (link) {
    case Link::Self:
    case Link::SharedMemory:
      return kSmallMessageBytesSharedMemory;
    case Link::Tcp:
    case Link::Ucx:
      return kSmallMessageBytesNetwork;
  }
  return kSmallMessageBytesNetwork;  // a Link outside the enum: assume the slower kind
}

}  // namespace

std::string_view op_name(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "all_reduce";
    case Op::ReduceScatter:
      return "reduce_scatter";
    case Op::AllGather:
      return "all_gather";
    case Op::AllGatherUneven:
      return "all_gather_uneven";
    case Op::Broadcast:
      return "broadcast";
    case Op::Reduce:
      return "reduce";
    case Op::Gather:
      return "gather";
    case Op::Scatter:
      return "scatter";
    case Op::AllToAll:
      return "all_to_all";
    case Op::Barrier:
      return "barrier";
  }
  return "invalid";
}

std::string_view algorithm_name(Algorithm algorithm) {
  for (const auto& [value, name] : kAlgorithmNames) {
    if (value == algorithm) return name;
  }
  return "invalid";
}

std::optional<Algorithm> parse_algorithm(std::string_view name) {
  for (const auto& [value, known] : kAlgorithmNames) {
    if (known == name) return value;
  }
  return std::nullopt;
}

bool supports(Op op, Algorithm algorithm) {
  if (algorithm == Algorithm::Auto) return true;
  if (algorithm == Algorithm::Hierarchical) {
    return op == Op::AllReduce || op == Op::ReduceScatter || op == Op::AllGather ||
           op == Op::Broadcast;
  }
  if (algorithm == Algorithm::Bounce) {
    return op == Op::AllReduce || op == Op::ReduceScatter || op == Op::AllGather;
  }
  if (algorithm == Algorithm::Slots) {
    return op == Op::AllReduce || op == Op::Reduce || op == Op::AllGather ||
           op == Op::ReduceScatter || op == Op::Broadcast || op == Op::Barrier;
  }
  switch (op) {
    case Op::AllReduce:
      return algorithm == Algorithm::Ring || algorithm == Algorithm::RecursiveDoubling ||
             algorithm == Algorithm::HalvingDoubling;
    case Op::ReduceScatter:
      return algorithm == Algorithm::Ring || algorithm == Algorithm::HalvingDoubling;
    case Op::AllGatherUneven:
      return algorithm == Algorithm::Ring;
    case Op::AllGather:
      return algorithm == Algorithm::Ring || algorithm == Algorithm::Bruck;
    case Op::Broadcast:
    case Op::Reduce:
      return algorithm == Algorithm::Tree;
    case Op::Gather:
    case Op::Scatter:
      return algorithm == Algorithm::Linear;
    case Op::AllToAll:
      return algorithm == Algorithm::Pairwise;
    case Op::Barrier:
      return algorithm == Algorithm::Dissemination;
  }
  return false;
}

Algorithm choose(Op op, size_t bytes, int world_size, Link link) {
  const bool small = bytes <= small_message_bytes(link);
  switch (op) {
    case Op::AllReduce:
      // One rank: both are a copy; the ring also takes the zero-step path cheaply.
      // HalvingDoubling would slot in between the two, for world sizes a power of two >= 4,
      // once a measured large-message threshold bounds it from above (planner.h).
      return small && world_size > 1 ? Algorithm::RecursiveDoubling : Algorithm::Ring;
    case Op::AllGather:
      return small && world_size > 1 ? Algorithm::Bruck : Algorithm::Ring;
    case Op::ReduceScatter:
      // HalvingDoubling would take the sizes below a measured threshold (planner.h).
      return Algorithm::Ring;
    case Op::AllGatherUneven:
      return Algorithm::Ring;
    case Op::Broadcast:
    case Op::Reduce:
      return Algorithm::Tree;
    case Op::Gather:
    case Op::Scatter:
      return Algorithm::Linear;
    case Op::AllToAll:
      return Algorithm::Pairwise;
    case Op::Barrier:
      return Algorithm::Dissemination;
  }
  throw_error(ErrorCode::InvalidArgument, "planner",
              fmt::format("unknown collective op {}", static_cast<int>(op)));
}

bool use_hierarchical(Op op, size_t bytes, const NodeLayout& layout, int root,
                      std::string_view forced) {
  if (layout.node_count() < 2 || !supports(op, Algorithm::Hierarchical)) return false;
  const int per_node = layout.ranks_per_node();
  if (op != Op::Broadcast && per_node < 2) return false;  // uneven nodes, or one rank on each
  if (!forced.empty() && forced != "auto") {
    // An unknown name is refused by choose(), which the caller runs too.
    const std::optional<Algorithm> algorithm = parse_algorithm(forced);
    if (algorithm && *algorithm != Algorithm::Auto && supports(op, *algorithm)) {
      return *algorithm == Algorithm::Hierarchical;
    }
  }
  if (op == Op::Broadcast) {
    return binomial_tree_cross_node_edges(layout, root) > layout.node_count() - 1;
  }
  return bytes > kSmallMessageBytesNetwork;
}

Algorithm choose(Op op, size_t bytes, int world_size, Link link, std::string_view forced) {
  if (forced.empty()) return choose(op, bytes, world_size, link);
  const std::optional<Algorithm> algorithm = parse_algorithm(forced);
  if (!algorithm) {
    std::string names;
    for (const auto& [value, name] : kAlgorithmNames) {
      names += names.empty() ? "" : ", ";
      names += name;
    }
    throw_error(
        ErrorCode::InvalidArgument, "planner",
        fmt::format("unknown algorithm \"{}\" (WEFT_ALGO takes one of: {})", forced, names));
  }
  if (*algorithm == Algorithm::Auto || *algorithm == Algorithm::Hierarchical ||
      *algorithm == Algorithm::Slots || *algorithm == Algorithm::Bounce ||
      !supports(op, *algorithm)) {
    return choose(op, bytes, world_size, link);
  }
  return *algorithm;
}

}  // namespace weft::collectives
