// Hierarchical all_reduce, reduce_scatter, all_gather and broadcast (collectives/hierarchical.h)
// on node layouts of every size 1..8 (contiguous, round-robin, 3 nodes, one rank per node), against
// the independent references of harness.h, element by element; the sub-transport view they run
// on; and the planner's choice.
#include "collectives/hierarchical.h"

#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/planner.h"
#include "collectives/sub_transport.h"
#include "tests/collectives/harness.h"

namespace weft::test {
namespace {

using collectives::Context;
using collectives::NodeLayout;

Context context(Transport& transport, uint64_t seq, collectives::ScratchPool* scratch) {
  return {.transport = transport, .seq = seq, .deadline = test_deadline(), .scratch = scratch};
}

void report(const std::vector<std::string>& failures) {
  for (const std::string& failure : failures) UNSCOPED_INFO(failure);
  CHECK(failures.empty());
}

// Node ids per rank: which node each rank is on.
const std::vector<std::vector<int>> kUniformLayouts = {
    {0, 0, 1, 1},              // 2 x 2, contiguous
    {0, 1, 0, 1},              // 2 x 2, round-robin
    {7, 3, 3, 7, 7, 3},        // 2 x 3, mixed, arbitrary ids
    {0, 0, 1, 1, 2, 2},        // 3 x 2
    {0, 1, 2, 0, 1, 2},        // 3 x 2, round-robin
    {0, 0, 0, 0, 1, 1, 1, 1},  // 2 x 4
    {0, 1, 2, 3},              // 4 x 1: the node phases are groups of one
    {0},                       // 1 x 1 and the other odd sizes, so that every size 1..8 runs
    {0, 1, 2},
    {4, 3, 2, 1, 0},
    {0, 1, 2, 3, 4, 5, 6},
};

std::string layout_text(const std::vector<int>& ids) {
  return fmt::format("nodes {}", fmt::join(ids, ","));
}

// Runs body(transport, rank, failures, layout, size) on every rank of every layout.
template <typename Body>
void on_every_layout(const std::vector<std::vector<int>>& layouts, Body body) {
  for (const auto& ids : layouts) {
    const int size = static_cast<int>(ids.size());
    INFO(layout_text(ids));
    report(run_world(size, eager_limit_for(size), [&](Transport& transport, int rank, Failures& f) {
      body(transport, rank, f, collectives::node_layout(ids, rank), size);
    }));
  }
}

// Checks `count` elements of `output` against the reference reduction of elements first.. over
// `size` ranks; records the first mismatch.
void expect_reduced(Failures& f, int rank, std::string_view what, DType dtype, ReduceOp op,
                    int size, const std::vector<std::byte>& output, size_t count, size_t first) {
  for (size_t k = 0; k < count; ++k) {
    std::string shown;
    if (!matches(dtype, op, output.data() + k * dtype_size(dtype),
                 reference(dtype, op, size, first + k), &shown)) {
      f.add(fmt::format("rank {} {} element {}: {}", rank, what, k, shown));
      return;
    }
  }
}

TEST_CASE("hierarchical all_reduce equals the reference on every layout, in and out of place",
          "[collectives][hierarchical]") {
  on_every_layout(kUniformLayouts, [&](Transport& transport, int rank, Failures& f,
                                       const NodeLayout& layout, int size) {
    collectives::ScratchPool pool;
    uint64_t seq = 0;
    for (DType dtype : kTestDTypes) {
      for (ReduceOp op : ops_for(dtype)) {
        for (size_t count : counts_for(size)) {
          ++seq;
          const std::vector<std::byte> input = make_input(dtype, op, rank, count);
          std::vector<std::byte> output(input.size());
          const bool in_place = seq % 2 == 0;
          if (in_place) output = input;
          collectives::hierarchical_all_reduce(context(transport, seq, &pool), layout,
                                               in_place ? output.data() : input.data(),
                                               output.data(), count, dtype, op);
          if (!in_place && input != make_input(dtype, op, rank, count)) {
            f.add(fmt::format("rank {} {}: input changed", rank,
                              describe_case("all_reduce", dtype, op, count)));
          }
          expect_reduced(f, rank, describe_case("all_reduce", dtype, op, count), dtype, op, size,
                         output, count, 0);
        }
      }
    }
  });
}

TEST_CASE("hierarchical reduce_scatter gives each rank its block, equal and uneven blocks",
          "[collectives][hierarchical]") {
  on_every_layout(kUniformLayouts, [&](Transport& transport, int rank, Failures& f,
                                       const NodeLayout& layout, int size) {
    collectives::ScratchPool pool;
    uint64_t seq = 0;
    for (DType dtype : kTestDTypes) {
      for (ReduceOp op : ops_for(dtype)) {
        for (int variant = 0; variant < 4; ++variant) {
          std::vector<size_t> counts(size);
          for (int j = 0; j < size; ++j) {
            counts[j] = variant == 0   ? 0
                        : variant == 1 ? 13
                        : variant == 2 ? static_cast<size_t>(j * 3 + 1) % 5  // some empty
                                       : 70;
          }
          const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
          size_t first = 0;
          for (int j = 0; j < rank; ++j) first += counts[j];
          const std::vector<std::byte> input = make_input(dtype, op, rank, total);
          std::vector<std::byte> output(counts[rank] * dtype_size(dtype));
          ++seq;
          collectives::hierarchical_reduce_scatter(context(transport, seq, &pool), layout,
                                                   input.data(), output.data(), counts, dtype, op);
          if (input != make_input(dtype, op, rank, total)) {
            f.add(fmt::format("rank {} {}: input changed", rank,
                              describe_case("reduce_scatter", dtype, op, total)));
          }
          expect_reduced(f, rank,
                         fmt::format("{} variant {}",
                                     describe_case("reduce_scatter", dtype, op, total), variant),
                         dtype, op, size, output, counts[rank], first);
        }
      }
    }
  });
}

TEST_CASE("hierarchical all_gather puts every rank's block in its place, in and out of place",
          "[collectives][hierarchical]") {
  on_every_layout(kUniformLayouts, [&](Transport& transport, int rank, Failures& f,
                                       const NodeLayout& layout, int size) {
    collectives::ScratchPool pool;
    uint64_t seq = 0;
    for (DType dtype : {DType::Float32, DType::Int8, DType::Float64}) {
      for (size_t count : counts_for(size)) {
        ++seq;
        const size_t element = dtype_size(dtype);
        const std::vector<std::byte> input = make_input(dtype, ReduceOp::Sum, rank, count);
        std::vector<std::byte> output(input.size() * size, std::byte{0xee});
        const bool in_place = seq % 2 == 0;
        if (in_place && count > 0) {
          std::copy(input.begin(), input.end(), output.begin() + rank * count * element);
        }
        collectives::hierarchical_all_gather(
            context(transport, seq, &pool), layout,
            in_place ? output.data() + rank * count * element : input.data(), output.data(), count,
            dtype);
        for (int r = 0; r < size; ++r) {
          if (!std::equal(output.begin() + r * count * element,
                          output.begin() + (r + 1) * count * element,
                          make_input(dtype, ReduceOp::Sum, r, count).begin())) {
            f.add(fmt::format("rank {} all_gather {} x {}: rank {}'s block is wrong", rank,
                              dtype_name(dtype), count, r));
          }
        }
      }
    }
  });
}

TEST_CASE("hierarchical broadcast reaches every rank from every root, uneven nodes too",
          "[collectives][hierarchical]") {
  std::vector<std::vector<int>> layouts = kUniformLayouts;
  layouts.push_back({0, 0, 0, 1});        // 3 + 1
  layouts.push_back({0, 1, 1, 2, 2, 2});  // 1 + 2 + 3
  on_every_layout(layouts, [&](Transport& transport, int rank, Failures& f,
                               const NodeLayout& layout, int size) {
    uint64_t seq = 0;
    for (int root = 0; root < size; ++root) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, size_t{300000}}) {
        ++seq;
        std::vector<std::byte> data(bytes);
        for (size_t i = 0; i < bytes; ++i) {
          data[i] = rank == root ? static_cast<std::byte>((i * 7 + root) % 251) : std::byte{0};
        }
        collectives::hierarchical_broadcast(context(transport, seq, nullptr), layout, data.data(),
                                            bytes, root);
        for (size_t i = 0; i < bytes; ++i) {
          if (data[i] != static_cast<std::byte>((i * 7 + root) % 251)) {
            f.add(fmt::format("rank {} broadcast of {} bytes from {}: byte {} is wrong", rank,
                              bytes, root, i));
            break;
          }
        }
      }
    }
  });
}

TEST_CASE("the rail-based collectives refuse uneven nodes with InvalidArgument",
          "[collectives][hierarchical]") {
  const std::vector<int> ids = {0, 0, 0, 1};
  report(run_world(4, LocalFabric::kUnlimited, [&](Transport& transport, int rank, Failures& f) {
    const NodeLayout layout = collectives::node_layout(ids, rank);
    std::vector<float> data(8, 1.0f);
    try {
      collectives::hierarchical_all_reduce(context(transport, 1, nullptr), layout, data.data(),
                                           data.data(), data.size(), DType::Float32, ReduceOp::Sum);
      f.add(fmt::format("rank {}: an all_reduce on uneven nodes was not refused", rank));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::InvalidArgument ||
          std::string(e.what()).find("same number of ranks") == std::string::npos) {
        f.add(fmt::format("rank {}: wrong refusal: {}", rank, e.what()));
      }
    }
  }));
}

TEST_CASE("a sub-transport numbers its members from 0, names parent ranks and shifts steps",
          "[collectives][hierarchical]") {
  report(run_world(4, LocalFabric::kUnlimited, [&](Transport& transport, int rank, Failures& f) {
    if (rank != 1 && rank != 3) return;
    collectives::SubTransport view(transport, {3, 1}, collectives::phase_step(2));
    const int me = view.rank();
    if (me != (rank == 3 ? 0 : 1) || view.size() != 2) {
      f.add(fmt::format("rank {}: view rank {} size {}", rank, me, view.size()));
      return;
    }
    // A message through the view arrives on the parent with the shifted step, from the parent
    // rank; one sent on the parent with the unshifted tag is not taken by the view's receive.
    const collectives::Tag tag = collectives::make_tag(5, 1);
    int through_view = 31, direct = 30, got = -1, plain = -1;
    if (rank == 3) {
      view.wait(view.send(1, &through_view, sizeof through_view, tag), test_deadline());
      transport.wait(transport.send(1, &direct, sizeof direct, tag), test_deadline());
    } else {
      transport.wait(transport.recv(3, &plain, sizeof plain, tag), test_deadline());
      transport.wait(transport.recv(3, &got, sizeof got, tag + collectives::phase_step(2)),
                     test_deadline());
      if (got != 31 || plain != 30) f.add(fmt::format("got {} and {}", got, plain));
    }
  }));
  collectives::LocalFabric fabric(2);
  CHECK_THROWS_AS(collectives::SubTransport(fabric.transport(0), {1}, 0), Error);
  CHECK_THROWS_AS(collectives::SubTransport(fabric.transport(0), {0, 0}, 0), Error);
}

TEST_CASE("the planner runs hierarchically where the nodes are even and the bytes many",
          "[collectives][hierarchical][planner]") {
  using collectives::Op;
  using collectives::use_hierarchical;
  const NodeLayout two_by_two = collectives::node_layout(std::vector<int>{0, 0, 1, 1}, 0);
  const NodeLayout uneven = collectives::node_layout(std::vector<int>{0, 0, 0, 1}, 0);
  const NodeLayout one_node = collectives::node_layout(std::vector<int>{0, 0, 0, 0}, 0);
  const NodeLayout singles = collectives::node_layout(std::vector<int>{0, 1, 2, 3}, 0);
  const size_t big = 16 << 20, small = 8 << 10;
  for (Op op : {Op::AllReduce, Op::ReduceScatter, Op::AllGather}) {
    CHECK(use_hierarchical(op, big, two_by_two, 0, ""));
    CHECK_FALSE(use_hierarchical(op, small, two_by_two, 0, ""));
    CHECK(use_hierarchical(op, small, two_by_two, 0, "hierarchical"));
    CHECK_FALSE(use_hierarchical(op, big, two_by_two, 0, "ring"));
    CHECK_FALSE(use_hierarchical(op, big, uneven, 0, "hierarchical"));
    CHECK_FALSE(use_hierarchical(op, big, one_node, 0, "hierarchical"));
    CHECK_FALSE(use_hierarchical(op, big, singles, 0, ""));
  }
  // Broadcast: from rank 0 the flat tree crosses once (0 -> 2), from rank 1 three times.
  CHECK(collectives::binomial_tree_cross_node_edges(two_by_two, 0) == 1);
  CHECK(collectives::binomial_tree_cross_node_edges(two_by_two, 1) == 3);
  CHECK_FALSE(use_hierarchical(Op::Broadcast, big, two_by_two, 0, ""));
  CHECK(use_hierarchical(Op::Broadcast, 8, two_by_two, 1, ""));
  CHECK(use_hierarchical(Op::Broadcast, 8, uneven, 0, "hierarchical"));
  CHECK_FALSE(use_hierarchical(Op::Barrier, big, two_by_two, 0, "hierarchical"));
  CHECK(collectives::choose(Op::AllReduce, big, 4, collectives::Link::Tcp, "hierarchical") ==
        collectives::Algorithm::Ring);
}

}  // namespace
}  // namespace weft::test
