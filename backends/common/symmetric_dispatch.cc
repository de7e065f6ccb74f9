#include "backends/common/symmetric_dispatch.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/flight_recorder.h"

namespace weft::backends {

using collectives::SymmetricMemory;
using collectives::SymmetricOperand;
using collectives::SymmetricRegion;

namespace {

// SymmetricCall::in_offset of an all_gather whose every input lies in its rank's block of the
// output: no offset is this large.
constexpr uint64_t kInPlace = ~uint64_t{0};

bool equal_blocks(const std::vector<size_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

}  // namespace

std::optional<SymmetricPlan> plan_symmetric(SymmetricMemory* memory, const Collective& c,
                                            const ErrorContext& context,
                                            const collectives::NodeLayout& layout) {
  // No buffer allocated yet (most groups, ever): no tensor can lie in one.
  if (memory == nullptr || !memory->ever_allocated()) return std::nullopt;
  auto find = [&](const Tensor& t) {
    try {
      return memory->find(t.data, t.nbytes());
    } catch (const Error& e) {
      // "symmetric buffer #0 of group "g": InvalidArgument: a tensor ...": the code goes in front.
      std::string detail = e.what();
      if (size_t at = detail.find(": InvalidArgument: "); at != std::string::npos) {
        detail.erase(at, std::string_view(": InvalidArgument").size());
      }
      throw Error(ErrorCode::InvalidArgument, context, detail);
    }
  };
  // Every tensor of every kind first: the message path would read or write a straddling tensor
  // past the mapping's end (the conformance suite's symmetric mode found reduce doing so).
  for (const std::vector<Tensor>* tensors : {&c.inputs, &c.outputs}) {
    for (const Tensor& t : *tensors) find(t);
  }
  bool needs_input = true;
  // Reduce: only the root has an output, so every rank decides from its input alone.
  const bool reduce = c.kind == CollectiveKind::Reduce;
  switch (c.kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::Reduce:
      break;
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter:
      if (!equal_blocks(c.counts)) return std::nullopt;
      break;
    case CollectiveKind::Broadcast:
      needs_input = false;
      break;
    case CollectiveKind::AllToAll:
      // Whatever the splits: equal here says nothing of the others' (rank q may send n here and
      // other counts elsewhere), so every rank goes in and the barrier decides (run_symmetric).
      break;
    default:
      return std::nullopt;
  }
  if ((reduce ? c.outputs.size() > 1 : c.outputs.size() != 1) ||
      (needs_input && c.inputs.size() != 1)) {
    return std::nullopt;
  }
  SymmetricMemory::Found out;
  if (!c.outputs.empty()) out = find(c.outputs[0]);
  SymmetricMemory::Found in;
  if (needs_input) in = find(c.inputs[0]);
  if ((!reduce && !out.region) || (needs_input && !in.region)) return std::nullopt;
  SymmetricRegion& any_region = needs_input ? *in.region : *out.region;
  const bool hierarchical = any_region.spans_hosts();
  if (hierarchical) {
    // Across hosts: the four with a hierarchical algorithm, on hosts of equal size (as the
    // message path's hierarchical ones need; every rank knows the layout, so all decide alike).
    const bool has_algorithm =
        c.kind == CollectiveKind::AllReduce || c.kind == CollectiveKind::ReduceScatter ||
        c.kind == CollectiveKind::AllGather || c.kind == CollectiveKind::Broadcast;
    if (!has_algorithm || layout.ranks_per_node() != any_region.ranks() ||
        layout.node_count() < 2 || layout.local != any_region.rank()) {
      return std::nullopt;
    }
  }

  SymmetricPlan plan;
  const std::string user = fmt::format("{} #{}", collective_name(c.kind), c.seq);
  for (const auto& found : {in, out}) {
    if (!found.region) continue;
    auto use = SymmetricRegion::use(found.region, user);
    if (!use) {
      throw Error(ErrorCode::InvalidArgument, context,
                  fmt::format("symmetric buffer #{} was released", found.region->id()));
    }
    plan.uses.push_back(std::move(use));
  }
  if (out.region) plan.output = SymmetricOperand{out.region.get(), out.offset};
  if (needs_input) plan.input = SymmetricOperand{in.region.get(), in.offset};
  plan.anchor = needs_input ? in.region.get() : out.region.get();

  const Tensor& any = needs_input ? c.inputs[0] : c.outputs[0];
  plan.root_output = reduce;
  plan.negotiate = c.kind == CollectiveKind::AllToAll;
  if (hierarchical) plan.hosts = &layout;
  plan.call.seq = c.seq;
  plan.call.shape = static_cast<uint64_t>(c.kind) | static_cast<uint64_t>(any.dtype) << 8 |
                    static_cast<uint64_t>(c.op.kind) << 16 |
                    static_cast<uint64_t>(static_cast<uint32_t>(c.root)) << 32;
  plan.call.factor = c.op.kind == ReduceOp::PremulSum ? std::bit_cast<uint64_t>(c.op.factor) : 0;
  plan.call.count = any.count;
  if (plan.negotiate) {
    // n + 1 when this rank sends and receives n to and from every rank, else 0: zero-copy runs
    // when every rank's is the same non-zero value (and the tensors' places agree).
    const size_t n = c.send_counts.empty() ? 0 : c.send_counts[0];
    const bool equal = equal_blocks(c.send_counts) && c.send_counts == c.recv_counts;
    plan.call.factor = equal ? n + 1 : 0;
  }
  if (needs_input) {
    plan.call.in_region = in.region->id() + 1;  // 0: none
    plan.call.in_offset = in.offset;
  }
  // Reduce: the root's output is named only when it lies in the inputs' buffer, where the peers
  // can write their slices of it; elsewhere (another buffer, ordinary memory) the root reduces
  // alone (out_region 0).
  if (out.region && (!reduce || out.region == in.region)) {
    plan.call.out_region = out.region->id() + 1;
    plan.call.out_offset = out.offset;
  }
  if (c.kind == CollectiveKind::ReduceScatter) {
    // Peers never touch this rank's output: in place or not, each rank's is its own business.
    plan.call.out_region = plan.call.out_offset = 0;
  }
  if (c.kind == CollectiveKind::AllGather) {
    // In place, each rank's input is its own block of the output: at a different offset on each
    // rank, so the call says "in place" instead, and peers read it from the output.
    const int rank = out.region->group_rank();
    plan.in_place =
        in.region == out.region && in.offset == out.offset + rank * c.inputs[0].nbytes();
    if (plan.in_place) {
      plan.call.in_region = 0;
      plan.call.in_offset = kInPlace;
    }
  }
  return plan;
}

bool run_symmetric(const Collective& c, const collectives::Context& ctx, SymmetricMemory& memory,
                   const SymmetricPlan& plan) {
  collectives::SymmetricContext sc{.ctx = ctx,
                                   .memory = memory,
                                   .anchor = *plan.anchor,
                                   .call = plan.call,
                                   .root_output = plan.root_output,
                                   .negotiate = plan.negotiate};
  if (c.kind == CollectiveKind::AllToAll) {
    // The message path notes its own algorithm when the ranks decline.
    if (!collectives::symmetric_all_to_all(sc, plan.input, plan.output,
                                           plan.call.factor == 0 ? 0 : plan.call.factor - 1,
                                           c.inputs[0].dtype)) {
      return false;
    }
    note_algorithm(c.trace, "symmetric");
    return true;
  }
  if (plan.hosts != nullptr) {
    note_algorithm(c.trace, "symmetric_hierarchical");
    const collectives::NodeLayout& hosts = *plan.hosts;
    const Tensor& out = c.outputs[0];
    switch (c.kind) {
      case CollectiveKind::AllReduce:
        collectives::symmetric_hierarchical_all_reduce(sc, hosts, plan.input, plan.output,
                                                       out.count, out.dtype, c.op);
        return true;
      case CollectiveKind::ReduceScatter:
        collectives::symmetric_hierarchical_reduce_scatter(sc, hosts, plan.input, plan.output,
                                                           out.count, out.dtype, c.op);
        return true;
      case CollectiveKind::AllGather:
        collectives::symmetric_hierarchical_all_gather(
            sc, hosts, plan.in_place ? collectives::SymmetricOperand{} : plan.input, plan.output,
            c.inputs[0].count, out.dtype);
        return true;
      case CollectiveKind::Broadcast:
        collectives::symmetric_hierarchical_broadcast(sc, hosts,
                                                      c.inputs.empty() ? nullptr : c.inputs[0].data,
                                                      plan.output, out.count, out.dtype, c.root);
        return true;
      default:
        break;
    }
    throw Error(
        ErrorCode::Unsupported,
        fmt::format("symmetric dispatch: no hierarchical zero-copy {}", collective_name(c.kind)));
  }
  note_algorithm(c.trace, "symmetric");
  if (c.kind == CollectiveKind::Reduce) {
    collectives::symmetric_reduce(sc, plan.input, c.outputs.empty() ? nullptr : c.outputs[0].data,
                                  c.inputs[0].count, c.inputs[0].dtype, c.op, c.root);
    return true;
  }
  const Tensor& out = c.outputs[0];
  switch (c.kind) {
    case CollectiveKind::AllReduce:
      collectives::symmetric_all_reduce(sc, plan.input, plan.output, out.count, out.dtype, c.op);
      return true;
    case CollectiveKind::ReduceScatter:
      collectives::symmetric_reduce_scatter(sc, plan.input, plan.output, out.count, out.dtype,
                                            c.op);
      return true;
    case CollectiveKind::AllGather:
      collectives::symmetric_all_gather(
          sc, plan.in_place ? collectives::SymmetricOperand{} : plan.input, plan.output,
          c.inputs[0].count, out.dtype);
      return true;
    case CollectiveKind::Broadcast:
      collectives::symmetric_broadcast(sc, c.inputs.empty() ? nullptr : c.inputs[0].data,
                                       plan.output, out.count, out.dtype, c.root);
      return true;
    default:
      break;
  }
  throw Error(ErrorCode::Unsupported,
              fmt::format("symmetric dispatch: no zero-copy {}", collective_name(c.kind)));
}

}  // namespace weft::backends
