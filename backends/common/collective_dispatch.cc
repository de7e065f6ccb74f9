#include "backends/common/collective_dispatch.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include "weft/error.h"

#include "collectives/binomial_tree.h"
#include "collectives/bruck.h"
#include "collectives/dissemination.h"
#include "collectives/gather_scatter.h"
#include "collectives/halving_doubling.h"
#include "collectives/hierarchical.h"
#include "collectives/pairwise.h"
#include "collectives/recursive_doubling.h"
#include "collectives/ring.h"
#include "collectives/slot_collectives.h"
#include "runtime/flight_recorder.h"

namespace weft::backends {

using collectives::Algorithm;
using collectives::Link;
using collectives::Op;

namespace {

bool all_equal(const std::vector<size_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

// Runs `c` through the transport's shared slots when it is one of their kinds and fits; false
// when it is not (the caller takes the message path). Decided from the call alone, so alike on
// every rank of a correct program.
bool run_in_slots(const Collective& c, const collectives::Context& ctx,
                  collectives::SharedSlots& slots, DType dtype) {
  using collectives::slots_fit;
  const int size = ctx.transport.size();
  auto note = [&] { note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Slots)); };
  switch (c.kind) {
    case CollectiveKind::AllReduce:
      if (!slots_fit(slots, Op::AllReduce, c.inputs[0].nbytes())) return false;
      note();
      collectives::slot_all_reduce(ctx, slots, c.inputs[0].data, c.outputs[0].data,
                                   c.inputs[0].count, dtype, c.op);
      return true;
    case CollectiveKind::Reduce:
      if (!slots_fit(slots, Op::Reduce, c.inputs[0].nbytes())) return false;
      note();
      collectives::slot_reduce(ctx, slots, c.inputs[0].data,
                               ctx.transport.rank() == c.root ? c.outputs.at(0).data : nullptr,
                               c.inputs[0].count, dtype, c.op, c.root);
      return true;
    case CollectiveKind::Broadcast: {
      const Tensor& data = c.outputs[0];
      if (!slots_fit(slots, Op::Broadcast, data.nbytes())) return false;
      note();
      if (ctx.transport.rank() == c.root && c.inputs[0].data != data.data && data.count > 0) {
        std::memcpy(data.data, c.inputs[0].data, data.nbytes());
      }
      collectives::slot_broadcast(ctx, slots, data.data, data.nbytes(), c.root);
      return true;
    }
    case CollectiveKind::AllGather: {
      if (!all_equal(c.counts)) return false;
      const size_t count = c.counts.empty() ? 0 : c.counts[0];
      if (!slots_fit(slots, Op::AllGather, count * dtype_size(dtype))) return false;
      note();
      collectives::slot_all_gather(ctx, slots, c.inputs[0].data, c.outputs[0].data, count, dtype);
      return true;
    }
    case CollectiveKind::ReduceScatter: {
      if (!all_equal(c.counts)) return false;
      const size_t count = c.counts.empty() ? 0 : c.counts[0];
      if (!slots_fit(slots, Op::ReduceScatter, count * size * dtype_size(dtype))) return false;
      note();
      collectives::slot_reduce_scatter(ctx, slots, c.inputs[0].data, c.outputs[0].data, count,
                                       dtype, c.op);
      return true;
    }
    case CollectiveKind::Barrier:
      note();
      collectives::slot_barrier(ctx, slots);
      return true;
    default:
      return false;
  }
}

}  // namespace

Link slowest_link_of(const collectives::Transport& transport) {
  Link slowest = Link::Self;
  for (int peer = 0; peer < transport.size(); ++peer) {
    if (peer == transport.rank()) continue;
    Link link = transport.link(peer);
    if (link == Link::Tcp || link == Link::Ucx) return link;
    slowest = link;
  }
  return slowest;
}

void run_collective(const Collective& c, const collectives::Context& ctx,
                    const DispatchPlan& plan) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const std::string& forced = plan.algo;
  const Link slowest_link = plan.slowest_link;
  auto in = [&](size_t i = 0) -> const void* { return c.inputs.at(i).data; };
  auto out = [&](size_t i = 0) -> void* { return c.outputs.at(i).data; };
  const DType dtype = !c.inputs.empty()    ? c.inputs[0].dtype
                      : !c.outputs.empty() ? c.outputs[0].dtype
                                           : DType::Float32;
  // A group on one host whose transport offers shared slots runs small collectives through them,
  // unless an algorithm other than "slots" is forced.
  if (collectives::SharedSlots* slots = ctx.transport.shared_slots();
      slots != nullptr && (forced.empty() || forced == "auto" || forced == "slots") &&
      run_in_slots(c, ctx, *slots, dtype)) {
    return;
  }

  switch (c.kind) {
    case CollectiveKind::AllReduce: {
      const size_t count = c.inputs[0].count;
      if (collectives::use_hierarchical(Op::AllReduce, c.inputs[0].nbytes(), plan.nodes, 0,
                                        forced)) {
        note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Hierarchical));
        collectives::hierarchical_all_reduce(ctx, plan.nodes, in(), out(), count, dtype, c.op);
        return;
      }
      Algorithm algorithm =
          collectives::choose(Op::AllReduce, c.inputs[0].nbytes(), size, slowest_link, forced);
      note_algorithm(c.trace, collectives::algorithm_name(algorithm));
      if (algorithm == Algorithm::RecursiveDoubling) {
        collectives::recursive_doubling_all_reduce(ctx, in(), out(), count, dtype, c.op);
      } else if (algorithm == Algorithm::HalvingDoubling) {
        collectives::halving_doubling_all_reduce(ctx, in(), out(), count, dtype, c.op);
      } else {
        collectives::ring_all_reduce(ctx, in(), out(), count, dtype, c.op);
      }
      return;
    }
    case CollectiveKind::Reduce:
      note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Tree));
      collectives::binomial_reduce(ctx, in(), rank == c.root ? out() : nullptr, c.inputs[0].count,
                                   dtype, c.op, c.root);
      return;
    case CollectiveKind::Broadcast: {
      const Tensor& data = c.outputs[0];
      if (rank == c.root && c.inputs[0].data != data.data && data.count > 0) {
        std::memcpy(data.data, c.inputs[0].data, data.nbytes());
      }
      if (collectives::use_hierarchical(Op::Broadcast, data.nbytes(), plan.nodes, c.root, forced)) {
        note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Hierarchical));
        collectives::hierarchical_broadcast(ctx, plan.nodes, data.data, data.nbytes(), c.root);
        return;
      }
      note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Tree));
      collectives::binomial_broadcast(ctx, data.data, data.nbytes(), c.root);
      return;
    }
    case CollectiveKind::AllGather: {
      if (all_equal(c.counts)) {
        const size_t count = c.counts.empty() ? 0 : c.counts[0];
        if (collectives::use_hierarchical(Op::AllGather, c.outputs[0].nbytes(), plan.nodes, 0,
                                          forced)) {
          note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Hierarchical));
          collectives::hierarchical_all_gather(ctx, plan.nodes, in(), out(), count, dtype);
          return;
        }
        Algorithm algorithm =
            collectives::choose(Op::AllGather, c.outputs[0].nbytes(), size, slowest_link, forced);
        note_algorithm(c.trace, collectives::algorithm_name(algorithm));
        if (algorithm == Algorithm::Bruck) {
          collectives::bruck_all_gather(ctx, in(), out(), count, dtype);
        } else {
          collectives::ring_all_gather(ctx, in(), out(), count, dtype);
        }
      } else {
        note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Ring));
        collectives::ring_all_gather(ctx, in(), out(), c.counts, dtype);
      }
      return;
    }
    case CollectiveKind::ReduceScatter: {
      if (collectives::use_hierarchical(Op::ReduceScatter, c.inputs[0].nbytes(), plan.nodes, 0,
                                        forced)) {
        note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Hierarchical));
        collectives::hierarchical_reduce_scatter(ctx, plan.nodes, in(), out(), c.counts, dtype,
                                                 c.op);
        return;
      }
      Algorithm algorithm =
          collectives::choose(Op::ReduceScatter, c.inputs[0].nbytes(), size, slowest_link, forced);
      note_algorithm(c.trace, collectives::algorithm_name(algorithm));
      if (algorithm == Algorithm::HalvingDoubling) {
        collectives::halving_doubling_reduce_scatter(ctx, in(), out(), c.counts, dtype, c.op);
      } else {
        collectives::ring_reduce_scatter(ctx, in(), out(), c.counts, dtype, c.op);
      }
      return;
    }
    case CollectiveKind::Gather:
      note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Linear));
      collectives::linear_gather(ctx, in(), rank == c.root ? out() : nullptr, c.inputs[0].count,
                                 dtype, c.root);
      return;
    case CollectiveKind::Scatter:
      note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Linear));
      collectives::linear_scatter(ctx, rank == c.root ? in() : nullptr, out(), c.outputs[0].count,
                                  dtype, c.root);
      return;
    case CollectiveKind::AllToAll:
      note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Pairwise));
      if (all_equal(c.send_counts) && all_equal(c.recv_counts) && c.send_counts == c.recv_counts) {
        const size_t count = c.send_counts.empty() ? 0 : c.send_counts[0];
        collectives::pairwise_all_to_all(ctx, in(), out(), count, dtype);
      } else {
        collectives::pairwise_all_to_all(ctx, in(), out(), c.send_counts, c.recv_counts, dtype);
      }
      return;
    case CollectiveKind::Barrier:
      note_algorithm(c.trace, collectives::algorithm_name(Algorithm::Dissemination));
      collectives::dissemination_barrier(ctx);
      return;
    case CollectiveKind::Send:
    case CollectiveKind::Recv:
      ctx.transport.wait(post_point_to_point(ctx.transport, c), ctx.deadline);
      return;
  }
  throw Error(ErrorCode::Unsupported,
              fmt::format("backend: unknown collective kind {}", static_cast<int>(c.kind)));
}

collectives::Request post_point_to_point(collectives::Transport& transport, const Collective& c) {
  if (c.kind == CollectiveKind::Send) {
    return transport.send(c.peer, c.inputs.at(0).data, c.inputs[0].nbytes(),
                          collectives::point_to_point_tag(c.tag));
  }
  if (c.peer == kAnySource) {
    return transport.recv_any(c.outputs.at(0).data, c.outputs[0].nbytes(),
                              collectives::point_to_point_tag(c.tag), c.source.get());
  }
  return transport.recv(c.peer, c.outputs.at(0).data, c.outputs[0].nbytes(),
                        collectives::point_to_point_tag(c.tag));
}

}  // namespace weft::backends
