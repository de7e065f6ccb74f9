// The planner: small messages to the latency algorithms, large to the ring, one place per op,
// and WEFT_ALGO-style overrides.
#include "collectives/planner.h"

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "collectives/slot_collectives.h"

namespace weft::collectives {
namespace {

// Only what slots_fit() asks: the capacity and whether the ranks are crowded.
class FakeSlots final : public SharedSlots {
 public:
  FakeSlots(size_t capacity, bool crowded) : capacity_(capacity), crowded_(crowded) {}
  size_t capacity() const override { return capacity_; }
  bool crowded() const override { return crowded_; }
  SlotCall& call(int, int) override { return call_; }
  std::byte* data(int, int) override { return nullptr; }
  uint64_t arrivals() const override { return 0; }
  void arrive_and_wait(Clock::time_point) override {}

 private:
  size_t capacity_;
  bool crowded_;
  SlotCall call_;
};

TEST_CASE("small collectives take the shared slots by kind, size and crowding",
          "[collectives][planner]") {
  const FakeSlots crowded(65536, true), roomy(65536, false);
  for (Op op : {Op::AllReduce, Op::AllGather, Op::ReduceScatter}) {
    CHECK(slots_fit(crowded, op, 8));
    CHECK(slots_fit(crowded, op, 65536));
    CHECK_FALSE(slots_fit(crowded, op, 65537));  // past the capacity
    CHECK(slots_fit(roomy, op, kUncrowdedSlotBytes));
    CHECK_FALSE(slots_fit(roomy, op, kUncrowdedSlotBytes + 1));
  }
  for (Op op : {Op::Broadcast, Op::Reduce}) {
    CHECK_FALSE(slots_fit(crowded, op, 8));  // the message trees need no group-wide barrier
    CHECK(slots_fit(crowded, op, kCrowdedRootedSlotBytes));
    CHECK(slots_fit(roomy, op, 8));
    CHECK(slots_fit(roomy, op, 65536));
    CHECK_FALSE(slots_fit(roomy, op, 65537));
  }
  CHECK(slots_fit(crowded, Op::Barrier, 0));
  CHECK(slots_fit(roomy, Op::Barrier, 0));
  for (Op op : {Op::Gather, Op::Scatter, Op::AllToAll, Op::AllGatherUneven}) {
    CHECK_FALSE(slots_fit(crowded, op, 8));
  }
  CHECK(parse_algorithm("slots") == Algorithm::Slots);
  CHECK(supports(Op::AllReduce, Algorithm::Slots));
  CHECK_FALSE(supports(Op::AllToAll, Algorithm::Slots));
  // Forcing "slots" leaves choose() to the planner: the dispatch takes the slots where they fit.
  CHECK(choose(Op::AllReduce, 8, 4, Link::SharedMemory, "slots") == Algorithm::RecursiveDoubling);
  // "bounce" likewise: all_reduce, reduce_scatter and all_gather, taken by the dispatch
  // (transport_backend.cc).
  CHECK(parse_algorithm("bounce") == Algorithm::Bounce);
  CHECK(algorithm_name(Algorithm::Bounce) == "bounce");
  CHECK(supports(Op::AllReduce, Algorithm::Bounce));
  CHECK(supports(Op::ReduceScatter, Algorithm::Bounce));
  CHECK(supports(Op::AllGather, Algorithm::Bounce));
  CHECK_FALSE(supports(Op::Broadcast, Algorithm::Bounce));
  CHECK(choose(Op::AllReduce, 1 << 20, 2, Link::SharedMemory, "bounce") == Algorithm::Ring);
}

TEST_CASE("planner sends small all_reduce to recursive doubling and large to the ring",
          "[collectives][planner]") {
  CHECK(choose(Op::AllReduce, 1024, 8, Link::SharedMemory) == Algorithm::RecursiveDoubling);
  CHECK(choose(Op::AllReduce, kSmallMessageBytesSharedMemory, 8, Link::SharedMemory) ==
        Algorithm::RecursiveDoubling);
  CHECK(choose(Op::AllReduce, kSmallMessageBytesSharedMemory + 1, 8, Link::SharedMemory) ==
        Algorithm::Ring);
  // The network's higher start-up cost moves the crossover up.
  CHECK(choose(Op::AllReduce, 128 * 1024, 8, Link::Tcp) == Algorithm::RecursiveDoubling);
  CHECK(choose(Op::AllReduce, 128 * 1024, 8, Link::SharedMemory) == Algorithm::Ring);
  CHECK(choose(Op::AllReduce, 64 << 20, 3, Link::Ucx) == Algorithm::Ring);
  CHECK(choose(Op::AllReduce, 4, 1, Link::Self) == Algorithm::Ring);
}

TEST_CASE("planner picks bruck for small all_gather and the one algorithm of every other op",
          "[collectives][planner]") {
  CHECK(choose(Op::AllGather, 4096, 5, Link::Tcp) == Algorithm::Bruck);
  CHECK(choose(Op::AllGather, 1 << 20, 5, Link::Tcp) == Algorithm::Ring);
  CHECK(choose(Op::AllGatherUneven, 16, 5, Link::Tcp) == Algorithm::Ring);
  CHECK(choose(Op::ReduceScatter, 16, 5, Link::Tcp) == Algorithm::Ring);
  CHECK(choose(Op::Broadcast, 16, 5, Link::Tcp) == Algorithm::Tree);
  CHECK(choose(Op::Reduce, 1 << 30, 5, Link::Tcp) == Algorithm::Tree);
  CHECK(choose(Op::Gather, 16, 5, Link::Tcp) == Algorithm::Linear);
  CHECK(choose(Op::Scatter, 16, 5, Link::Tcp) == Algorithm::Linear);
  CHECK(choose(Op::AllToAll, 16, 5, Link::Tcp) == Algorithm::Pairwise);
  CHECK(choose(Op::Barrier, 0, 5, Link::Tcp) == Algorithm::Dissemination);
}

TEST_CASE("a forced algorithm applies where it implements the op and is ignored elsewhere",
          "[collectives][planner]") {
  CHECK(choose(Op::AllReduce, 16, 8, Link::Tcp, "ring") == Algorithm::Ring);
  CHECK(choose(Op::AllReduce, 1 << 30, 8, Link::Tcp, "recursive_doubling") ==
        Algorithm::RecursiveDoubling);
  CHECK(choose(Op::AllGather, 1 << 30, 8, Link::Tcp, "bruck") == Algorithm::Bruck);
  CHECK(choose(Op::AllGatherUneven, 16, 8, Link::Tcp, "bruck") == Algorithm::Ring);
  CHECK(choose(Op::Barrier, 0, 8, Link::Tcp, "ring") == Algorithm::Dissemination);
  CHECK(choose(Op::AllReduce, 16, 8, Link::Tcp, "auto") == Algorithm::RecursiveDoubling);
  CHECK(choose(Op::AllReduce, 16, 8, Link::Tcp, "") == Algorithm::RecursiveDoubling);
}

TEST_CASE("halving_doubling implements all_reduce and reduce_scatter and applies when forced",
          "[collectives][planner]") {
  CHECK(supports(Op::AllReduce, Algorithm::HalvingDoubling));
  CHECK(supports(Op::ReduceScatter, Algorithm::HalvingDoubling));
  for (Op op : {Op::AllGather, Op::AllGatherUneven, Op::Broadcast, Op::Reduce, Op::Gather,
                Op::Scatter, Op::AllToAll, Op::Barrier}) {
    INFO(op_name(op));
    CHECK_FALSE(supports(op, Algorithm::HalvingDoubling));
  }
  CHECK(choose(Op::AllReduce, 16, 8, Link::Tcp, "halving_doubling") == Algorithm::HalvingDoubling);
  CHECK(choose(Op::AllReduce, 1 << 30, 6, Link::SharedMemory, "halving_doubling") ==
        Algorithm::HalvingDoubling);
  CHECK(choose(Op::ReduceScatter, 16, 5, Link::Tcp, "halving_doubling") ==
        Algorithm::HalvingDoubling);
  // Ignored where it does not apply: one variable can force it for the collective under test.
  CHECK(choose(Op::AllGather, 1 << 30, 8, Link::Tcp, "halving_doubling") == Algorithm::Ring);
  CHECK(choose(Op::Barrier, 0, 8, Link::Tcp, "halving_doubling") == Algorithm::Dissemination);
  CHECK(choose(Op::ReduceScatter, 16, 5, Link::Tcp, "ring") == Algorithm::Ring);
}

TEST_CASE("an unknown forced algorithm throws InvalidArgument listing the valid names",
          "[collectives][planner]") {
  try {
    choose(Op::AllReduce, 16, 8, Link::Tcp, "rabenseifner");
    FAIL("accepted an unknown algorithm");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(std::string(e.what()), Catch::Contains("rabenseifner") &&
                                          Catch::Contains("recursive_doubling") &&
                                          Catch::Contains("halving_doubling"));
  }
}

TEST_CASE("algorithm names round-trip through parse_algorithm", "[collectives][planner]") {
  for (Algorithm a : {Algorithm::Auto, Algorithm::Ring, Algorithm::RecursiveDoubling,
                      Algorithm::Bruck, Algorithm::Tree, Algorithm::Linear, Algorithm::Pairwise,
                      Algorithm::Dissemination, Algorithm::HalvingDoubling}) {
    CHECK(parse_algorithm(algorithm_name(a)) == a);
  }
  CHECK(algorithm_name(Algorithm::HalvingDoubling) == "halving_doubling");
  CHECK_FALSE(parse_algorithm("Ring").has_value());
  CHECK_FALSE(parse_algorithm("halving-doubling").has_value());
  CHECK(op_name(Op::AllToAll) == "all_to_all");
}

}  // namespace
}  // namespace weft::collectives
