#include "collectives/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "weft/error.h"

#include "collectives/binomial_tree.h"
#include "collectives/bruck.h"
#include "collectives/halving_doubling.h"
#include "collectives/planner.h"
#include "collectives/recursive_doubling.h"
#include "collectives/ring.h"
#include "collectives/sub_transport.h"
#include "runtime/reduce.h"

namespace weft::collectives {

int NodeLayout::ranks_per_node() const {
  if (nodes.empty()) return 0;
  const size_t first = nodes[0].size();
  for (const auto& members : nodes) {
    if (members.size() != first) return 0;
  }
  return static_cast<int>(first);
}

std::vector<int> NodeLayout::rail(int l) const {
  std::vector<int> members;
  members.reserve(nodes.size());
  for (const auto& node_ranks : nodes) members.push_back(node_ranks.at(static_cast<size_t>(l)));
  return members;
}

int NodeLayout::node_of_rank(int r) const {
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (std::find(nodes[n].begin(), nodes[n].end(), r) != nodes[n].end()) {
      return static_cast<int>(n);
    }
  }
  WEFT_CHECK(false, "a rank outside the layout");
  return -1;
}

NodeLayout node_layout(std::span<const int> node_ids, int rank) {
  NodeLayout layout;
  std::map<int, size_t> index_of_id;  // node id -> index in layout.nodes
  for (size_t r = 0; r < node_ids.size(); ++r) {
    auto [it, added] = index_of_id.emplace(node_ids[r], layout.nodes.size());
    if (added) layout.nodes.emplace_back();
    layout.nodes[it->second].push_back(static_cast<int>(r));
  }
  layout.node = layout.node_of_rank(rank);
  const auto& mine = layout.nodes[static_cast<size_t>(layout.node)];
  layout.local = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  return layout;
}

NodeLayout node_layout(const Transport& transport) {
  std::vector<int> ids(static_cast<size_t>(transport.size()));
  for (int r = 0; r < transport.size(); ++r) ids[static_cast<size_t>(r)] = transport.node_of(r);
  return node_layout(ids, transport.rank());
}

int binomial_tree_cross_node_edges(const NodeLayout& layout, int root) {
  int size = 0;
  for (const auto& members : layout.nodes) size += static_cast<int>(members.size());
  std::vector<int> node(static_cast<size_t>(size));
  for (size_t n = 0; n < layout.nodes.size(); ++n) {
    for (int r : layout.nodes[n]) node[static_cast<size_t>(r)] = static_cast<int>(n);
  }
  int edges = 0;
  for (int v = 1; v < size; ++v) {  // v's parent is v with its lowest set bit cleared
    const int parent = v & (v - 1);
    if (node[static_cast<size_t>((v + root) % size)] !=
        node[static_cast<size_t>((parent + root) % size)]) {
      ++edges;
    }
  }
  return edges;
}

namespace {

using detail::run_phase;

std::string describe(std::string_view op, const NodeLayout& layout) {
  return fmt::format("hierarchical {} ({} nodes x {} ranks)", op, layout.node_count(),
                     layout.ranks_per_node());
}

// Checks what every rail-based algorithm needs: the layout is this group's, uniform.
int checked_ranks_per_node(std::string_view where, const Context& ctx, const NodeLayout& layout) {
  const int per_node = layout.ranks_per_node();
  if (per_node == 0 || layout.node_count() * per_node != ctx.transport.size() ||
      layout.nodes[static_cast<size_t>(layout.node)][static_cast<size_t>(layout.local)] !=
          ctx.transport.rank()) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("needs the group's nodes with the same number of ranks on each; "
                            "given {} nodes for a group of {}",
                            layout.node_count(), ctx.transport.size()));
  }
  return per_node;
}

// The slowest link of this rank within `view`.
Link slowest_link(const Transport& view) {
  Link slowest = Link::Self;
  for (int peer = 0; peer < view.size(); ++peer) {
    if (peer == view.rank()) continue;
    const Link link = view.link(peer);
    if (link == Link::Tcp || link == Link::Ucx) return link;
    slowest = link;
  }
  return slowest;
}

// The op that later phases combine with: the premultiply and Avg's division happen once, outside.
ReduceOp summing(ReduceOp op) {
  return op.kind == ReduceOp::Avg || op.kind == ReduceOp::PremulSum ? ReduceOp(ReduceOp::Sum) : op;
}

}  // namespace

void hierarchical_all_reduce(const Context& ctx, const NodeLayout& layout, const void* input,
                             void* output, size_t count, DType dtype, ReduceOp op) {
  const std::string where = describe("all_reduce", layout);
  const size_t bytes = detail::checked_bytes(where, count, dtype);
  detail::check_buffer(where, input, bytes, "input");
  detail::check_buffer(where, output, bytes, "output");
  reduce::check_supported(dtype, op);
  const int per_node = checked_ranks_per_node(where, ctx, layout);
  if (input != output && detail::overlaps(input, bytes, output, bytes)) {
    throw_error(ErrorCode::InvalidArgument, where, "input and output overlap but are not equal");
  }
  if (count == 0) return;

  // The node's shards: as even as elements allow, one per local index.
  std::vector<size_t> shard_counts(static_cast<size_t>(per_node));
  for (int l = 0; l < per_node; ++l) {
    shard_counts[static_cast<size_t>(l)] =
        count / per_node + (static_cast<size_t>(l) < count % per_node ? 1 : 0);
  }
  size_t offset = 0;
  for (int l = 0; l < layout.local; ++l) offset += shard_counts[static_cast<size_t>(l)];
  const size_t shard_count = shard_counts[static_cast<size_t>(layout.local)];
  std::byte* shard = static_cast<std::byte*>(output) + offset * dtype_size(dtype);
  const ReduceOp later = summing(op);
  const auto& node_ranks = layout.nodes[static_cast<size_t>(layout.node)];

  run_phase(where, "node reduce-scatter", [&] {
    SubTransport node(ctx.transport, node_ranks, 0);
    const Context inner{node, ctx.seq, ctx.deadline, ctx.scratch};
    ring_reduce_scatter(inner, input, shard, shard_counts, dtype,
                        op.kind == ReduceOp::Avg ? ReduceOp(ReduceOp::Sum) : op);
  });
  run_phase(where, "inter-node all_reduce", [&] {
    SubTransport rail(ctx.transport, layout.rail(layout.local), 0);
    const Context inner{rail, ctx.seq, ctx.deadline, ctx.scratch};
    const Algorithm algorithm =
        choose(Op::AllReduce, shard_count * dtype_size(dtype), rail.size(), slowest_link(rail));
    if (algorithm == Algorithm::RecursiveDoubling) {
      recursive_doubling_all_reduce(inner, shard, shard, shard_count, dtype, later);
    } else if (algorithm == Algorithm::HalvingDoubling) {
      halving_doubling_all_reduce(inner, shard, shard, shard_count, dtype, later);
    } else {
      ring_all_reduce(inner, shard, shard, shard_count, dtype, later);
    }
  });
  reduce::finalize(shard, shard_count, dtype, op, ctx.transport.size());
  run_phase(where, "node all-gather", [&] {
    // Steps in phases 2 and 3: the node reduce-scatter paired the same ranks in phase 0.
    SubTransport node(ctx.transport, node_ranks, phase_step(2));
    const Context inner{node, ctx.seq, ctx.deadline, ctx.scratch};
    ring_all_gather(inner, shard, output, shard_counts, dtype);
  });
}

void hierarchical_reduce_scatter(const Context& ctx, const NodeLayout& layout, const void* input,
                                 void* output, std::span<const size_t> counts, DType dtype,
                                 ReduceOp op) {
  const std::string where = describe("reduce_scatter", layout);
  const int size = ctx.transport.size();
  const std::vector<size_t> offsets = detail::offsets_of(where, counts, size);
  const size_t element = dtype_size(dtype);
  const size_t total = detail::checked_bytes(where, offsets.back(), dtype);
  detail::check_buffer(where, input, total, "input");
  const int rank = ctx.transport.rank();
  detail::check_buffer(where, output, counts[static_cast<size_t>(rank)] * element, "output");
  reduce::check_supported(dtype, op);
  const int per_node = checked_ranks_per_node(where, ctx, layout);
  if (total == 0) return;

  const int node_count = layout.node_count();
  auto rank_at = [&](int n, int l) {
    return static_cast<size_t>(layout.nodes[static_cast<size_t>(n)][static_cast<size_t>(l)]);
  };
  // PremulSum: every input premultiplied once, here, so the phases only sum.
  const bool premultiply = reduce::needs_premultiply(op);
  const detail::Scratch scaled(ctx, premultiply ? total : 0);
  const auto* in = static_cast<const std::byte*>(input);
  if (premultiply) {
    reduce::premultiply(scaled.data(), input, offsets.back(), dtype, op.factor);
    in = scaled.data();
  }
  auto block = [&](size_t r) { return in + offsets[r] * element; };
  // This rank's rail's blocks (node 0's rank of the rail, node 1's, ...), summed over the node.
  std::vector<size_t> rail_counts(static_cast<size_t>(node_count));
  std::vector<size_t> rail_offsets(static_cast<size_t>(node_count) + 1, 0);
  for (int n = 0; n < node_count; ++n) {
    rail_counts[static_cast<size_t>(n)] = counts[rank_at(n, layout.local)];
    rail_offsets[static_cast<size_t>(n) + 1] =
        rail_offsets[static_cast<size_t>(n)] + rail_counts[static_cast<size_t>(n)];
  }
  const detail::Scratch rail_sum(ctx, rail_offsets.back() * element);
  for (int n = 0; n < node_count; ++n) {
    const size_t bytes = rail_counts[static_cast<size_t>(n)] * element;
    if (bytes > 0) {
      std::memcpy(rail_sum.data() + rail_offsets[static_cast<size_t>(n)] * element,
                  block(rank_at(n, layout.local)), bytes);
    }
  }
  const ReduceOp later = summing(op);

  run_phase(where, "node reduce-scatter", [&] {
    // Every local peer gets its rail's blocks straight from the input, all sent at once; the
    // peers' blocks for this rail are reduced in as they arrive, one peer after another in a
    // fixed order, so that the sum's order (and bits) do not depend on timing.
    SubTransport node(ctx.transport, layout.nodes[static_cast<size_t>(layout.node)], 0);
    const Context inner{node, ctx.seq, ctx.deadline, ctx.scratch};
    detail::Inflight inflight(inner, "direct reduce-scatter");
    for (int k = 1; k < per_node; ++k) {
      const int peer = (layout.local + k) % per_node;
      for (int n = 0; n < node_count; ++n) {
        inflight.send(peer, block(rank_at(n, peer)), counts[rank_at(n, peer)] * element,
                      static_cast<uint32_t>(n));
      }
    }
    for (int k = 1; k < per_node; ++k) {
      const int peer = (layout.local - k + per_node) % per_node;
      std::vector<Request> pending;
      for (int n = 0; n < node_count; ++n) {
        pending.push_back(inflight.recv_reduce(
            peer, rail_sum.data() + rail_offsets[static_cast<size_t>(n)] * element,
            rail_counts[static_cast<size_t>(n)], dtype, later, static_cast<uint32_t>(n)));
      }
      for (Request request : pending) inflight.wait(request, "", k - 1, per_node - 1);
    }
    inflight.wait_all("", per_node - 2, per_node - 1);
  });
  run_phase(where, "inter-node reduce-scatter", [&] {
    SubTransport rail(ctx.transport, layout.rail(layout.local), 0);
    const Context inner{rail, ctx.seq, ctx.deadline, ctx.scratch};
    ring_reduce_scatter(inner, rail_sum.data(), output, rail_counts, dtype, later);
  });
  reduce::finalize(output, counts[static_cast<size_t>(rank)], dtype, op, size);
}

void hierarchical_all_gather(const Context& ctx, const NodeLayout& layout, const void* input,
                             void* output, size_t count, DType dtype) {
  const std::string where = describe("all_gather", layout);
  const int size = ctx.transport.size();
  const size_t block = detail::checked_bytes(where, count, dtype);
  const size_t total = detail::checked_bytes(where, count * static_cast<size_t>(size), dtype);
  detail::check_buffer(where, input, block, "input");
  detail::check_buffer(where, output, total, "output");
  const int per_node = checked_ranks_per_node(where, ctx, layout);
  auto* out = static_cast<std::byte*>(output);
  std::byte* mine = out + static_cast<size_t>(ctx.transport.rank()) * block;
  if (input != mine && detail::overlaps(input, block, output, total)) {
    throw_error(ErrorCode::InvalidArgument, where,
                "input overlaps output but is not this rank's block of it");
  }
  if (count == 0) return;
  detail::copy_unless_same(mine, input, block);

  // Every block travels straight to its place in the output: first along the rail (this rank's
  // block to the same local index on every other node), then inside the node (the rail's blocks
  // to every local peer). Each phase posts all its messages at once.
  const int node_count = layout.node_count();
  auto slot = [&](int n, int l) {
    return out + static_cast<size_t>(layout.nodes[static_cast<size_t>(n)][static_cast<size_t>(l)]) *
                     block;
  };
  run_phase(where, "inter-node all-gather", [&] {
    SubTransport rail(ctx.transport, layout.rail(layout.local), 0);
    const Context inner{rail, ctx.seq, ctx.deadline, ctx.scratch};
    detail::Inflight inflight(inner, "direct all-gather");
    for (int k = 1; k < node_count; ++k) {
      const int peer = (layout.node + k) % node_count;
      inflight.recv(peer, slot(peer, layout.local), block, 0);
    }
    for (int k = 1; k < node_count; ++k) {
      inflight.send((layout.node - k + node_count) % node_count, mine, block, 0);
    }
    inflight.wait_all("", 0, 1);
  });
  run_phase(where, "node all-gather", [&] {
    SubTransport node(ctx.transport, layout.nodes[static_cast<size_t>(layout.node)], 0);
    const Context inner{node, ctx.seq, ctx.deadline, ctx.scratch};
    detail::Inflight inflight(inner, "direct all-gather");
    for (int k = 1; k < per_node; ++k) {
      const int peer = (layout.local + k) % per_node;
      for (int n = 0; n < node_count; ++n) {
        inflight.recv(peer, slot(n, peer), block, static_cast<uint32_t>(n));
      }
    }
    for (int k = 1; k < per_node; ++k) {
      const int peer = (layout.local - k + per_node) % per_node;
      for (int n = 0; n < node_count; ++n) {
        inflight.send(peer, slot(n, layout.local), block, static_cast<uint32_t>(n));
      }
    }
    inflight.wait_all("", 0, 1);
  });
}

void hierarchical_broadcast(const Context& ctx, const NodeLayout& layout, void* data, size_t bytes,
                            int root) {
  const std::string where = fmt::format("hierarchical broadcast ({} nodes)", layout.node_count());
  detail::check_root(where, root, ctx.transport.size());
  detail::check_buffer(where, data, bytes, "data");
  if (bytes == 0) return;
  const int root_node = layout.node_of_rank(root);
  std::vector<int> leaders;
  for (int n = 0; n < layout.node_count(); ++n) {
    leaders.push_back(n == root_node ? root : layout.nodes[static_cast<size_t>(n)][0]);
  }
  const int my_leader = leaders[static_cast<size_t>(layout.node)];
  if (my_leader == ctx.transport.rank() && layout.node_count() > 1) {
    run_phase(where, "between node leaders", [&] {
      SubTransport between(ctx.transport, leaders, 0);
      const Context inner{between, ctx.seq, ctx.deadline, ctx.scratch};
      binomial_broadcast(inner, data, bytes, root_node);
    });
  }
  const auto& node_ranks = layout.nodes[static_cast<size_t>(layout.node)];
  if (node_ranks.size() > 1) {
    run_phase(where, "inside the node", [&] {
      SubTransport node(ctx.transport, node_ranks, phase_step(1));
      const Context inner{node, ctx.seq, ctx.deadline, ctx.scratch};
      const auto leader_index =
          std::find(node_ranks.begin(), node_ranks.end(), my_leader) - node_ranks.begin();
      binomial_broadcast(inner, data, bytes, static_cast<int>(leader_index));
    });
  }
}

}  // namespace weft::collectives
