// The planner: small messages to the latency algorithms, large to the ring, one place per op,
// and WEFT_ALGO-style overrides.
#include "collectives/planner.h"

#include <catch2/catch.hpp>

#include "weft/error.h"

namespace weft::collectives {
namespace {

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

TEST_CASE("an unknown forced algorithm throws InvalidArgument listing the valid names",
          "[collectives][planner]") {
  try {
    choose(Op::AllReduce, 16, 8, Link::Tcp, "halving_doubling");
    FAIL("accepted an unknown algorithm");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(std::string(e.what()),
               Catch::Contains("halving_doubling") && Catch::Contains("recursive_doubling"));
  }
}

TEST_CASE("algorithm names round-trip through parse_algorithm", "[collectives][planner]") {
  for (Algorithm a :
       {Algorithm::Auto, Algorithm::Ring, Algorithm::RecursiveDoubling, Algorithm::Bruck,
        Algorithm::Tree, Algorithm::Linear, Algorithm::Pairwise, Algorithm::Dissemination}) {
    CHECK(parse_algorithm(algorithm_name(a)) == a);
  }
  CHECK_FALSE(parse_algorithm("Ring").has_value());
  CHECK(op_name(Op::AllToAll) == "all_to_all");
}

}  // namespace
}  // namespace weft::collectives
