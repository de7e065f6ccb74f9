// LocalTransport against transport.h's contract: matching, buffering, copies, reduction, sizes,
// deadlines, abort and bad arguments.
#include "collectives/local_transport.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "collectives/transport.h"

namespace weft::collectives {
namespace {

using namespace std::chrono_literals;

Clock::time_point soon() { return Clock::now() + 10s; }

ErrorCode code_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  FAIL("no weft::Error thrown");
  return ErrorCode::Io;
}

TEST_CASE("messages with the same peer and tag match in posting order, others by tag",
          "[collectives][local_transport]") {
  LocalFabric fabric(2);
  Transport& a = fabric.transport(0);
  Transport& b = fabric.transport(1);
  const int first = 1, second = 2, other = 3;
  a.wait(a.send(1, &first, sizeof first, make_tag(1, 0)), soon());
  a.wait(a.send(1, &other, sizeof other, make_tag(1, 7)), soon());
  a.wait(a.send(1, &second, sizeof second, make_tag(1, 0)), soon());
  int x = 0, y = 0, z = 0;
  // Posted out of tag order: the tag-7 message is found although older tag-0 ones wait.
  b.wait(b.recv(0, &z, sizeof z, make_tag(1, 7)), soon());
  b.wait(b.recv(0, &x, sizeof x, make_tag(1, 0)), soon());
  b.wait(b.recv(0, &y, sizeof y, make_tag(1, 0)), soon());
  CHECK(x == 1);
  CHECK(y == 2);
  CHECK(z == 3);
}

TEST_CASE("an eager send is copied at once, so the sender may reuse its buffer",
          "[collectives][local_transport]") {
  LocalFabric fabric(2);
  int value = 42;
  const Request send = fabric.transport(0).send(1, &value, sizeof value, 5);
  CHECK(fabric.transport(0).test(send));
  fabric.transport(0).wait(send, soon());
  value = -1;
  int got = 0;
  fabric.transport(1).wait(fabric.transport(1).recv(0, &got, sizeof got, 5), soon());
  CHECK(got == 42);
}

TEST_CASE("with eager limit 0 a send completes only when its receive has copied it",
          "[collectives][local_transport]") {
  LocalFabric fabric(2, 0);
  const std::vector<int> data = {1, 2, 3};
  const Request send = fabric.transport(0).send(1, data.data(), 12, 9);
  CHECK_FALSE(fabric.transport(0).test(send));
  std::vector<int> got(3, 0);
  const Request recv = fabric.transport(1).recv(0, got.data(), 12, 9);
  CHECK(fabric.transport(0).test(send));
  fabric.transport(0).wait(send, soon());
  fabric.transport(1).wait(recv, soon());
  CHECK(got == data);
}

TEST_CASE("recv_reduce combines the incoming elements into the destination",
          "[collectives][local_transport]") {
  LocalFabric fabric(2);
  const std::vector<int32_t> incoming = {5, -7, 100};
  std::vector<int32_t> dst = {1, 2, 3};
  fabric.transport(0).wait(fabric.transport(0).send(1, incoming.data(), 12, 1), soon());
  fabric.transport(1).wait(
      fabric.transport(1).recv_reduce(0, dst.data(), 3, DType::Int32, ReduceOp::Max, 1), soon());
  CHECK(dst == std::vector<int32_t>{5, 2, 100});
  // Avg combines as Sum: the algorithm divides once at the end.
  fabric.transport(0).wait(fabric.transport(0).send(1, incoming.data(), 12, 2), soon());
  fabric.transport(1).wait(
      fabric.transport(1).recv_reduce(0, dst.data(), 3, DType::Int32, ReduceOp::Avg, 2), soon());
  CHECK(dst == std::vector<int32_t>{10, -5, 200});
}

TEST_CASE("a receive whose size differs from the send fails both with Protocol naming sizes",
          "[collectives][local_transport]") {
  LocalFabric fabric(2, 0);
  const int64_t value = 7;
  int32_t small = 0;
  const Request send = fabric.transport(0).send(1, &value, 8, make_tag(3, 4));
  const Request recv = fabric.transport(1).recv(0, &small, 4, make_tag(3, 4));
  std::string message;
  CHECK(code_of([&] { fabric.transport(1).wait(recv, soon()); }, &message) == ErrorCode::Protocol);
  CHECK_THAT(message, Catch::Contains("rank 0 sent 8 bytes with tag 3:4") &&
                          Catch::Contains("rank 1 posted a receive of 4"));
  CHECK(code_of([&] { fabric.transport(0).wait(send, soon()); }) == ErrorCode::Protocol);
}

TEST_CASE("a wait past its deadline throws Timeout naming the peer, the tag and the bytes",
          "[collectives][local_transport]") {
  LocalFabric fabric(3);
  std::vector<std::byte> buffer(64);
  const Request recv = fabric.transport(0).recv(2, buffer.data(), 64, make_tag(8, 1));
  std::string message;
  const auto start = Clock::now();
  CHECK(code_of([&] { fabric.transport(0).wait(recv, Clock::now() + 50ms); }, &message) ==
        ErrorCode::Timeout);
  CHECK(Clock::now() - start < 5s);
  CHECK_THAT(message, Catch::Contains("rank 2") && Catch::Contains("tag 8:1") &&
                          Catch::Contains("64 bytes"));
  // The cancelled receive no longer matches: a later message goes to the next receive.
  const int value = 3;
  fabric.transport(2).wait(fabric.transport(2).send(0, &value, 4, make_tag(8, 1)), soon());
  int got = 0;
  fabric.transport(0).wait(fabric.transport(0).recv(2, &got, 4, make_tag(8, 1)), soon());
  CHECK(got == 3);
  // And the finished request cannot be waited for again.
  CHECK(code_of([&] { fabric.transport(0).wait(recv, soon()); }) == ErrorCode::InvalidArgument);
}

TEST_CASE("abort wakes a blocked wait with Aborted and fails the peers' requests with PeerLost",
          "[collectives][local_transport]") {
  LocalFabric fabric(2);
  int value = 0;
  const Request recv = fabric.transport(0).recv(1, &value, 4, 1);
  const Request peer_recv = fabric.transport(1).recv(0, &value, 4, 2);
  ErrorCode blocked = ErrorCode::Io;
  std::thread waiter(
      [&] { blocked = code_of([&] { fabric.transport(0).wait(recv, Clock::now() + 60s); }); });
  fabric.transport(0).abort("test says stop");
  waiter.join();  // returns long before the 60 s deadline only because abort woke it
  CHECK(blocked == ErrorCode::Aborted);
  std::string message;
  CHECK(code_of([&] { fabric.transport(1).wait(peer_recv, soon()); }, &message) ==
        ErrorCode::PeerLost);
  CHECK_THAT(message, Catch::Contains("rank 0 aborted: test says stop"));
  // Later requests fail at once, on both sides.
  CHECK(code_of([&] {
          fabric.transport(0).wait(fabric.transport(0).send(1, &value, 4, 3), soon());
        }) == ErrorCode::Aborted);
  CHECK(code_of([&] {
          fabric.transport(1).wait(fabric.transport(1).recv(0, &value, 4, 3), soon());
        }) == ErrorCode::PeerLost);
}

TEST_CASE("bad peers, null buffers and unsupported reductions throw InvalidArgument at post",
          "[collectives][local_transport]") {
  LocalFabric fabric(2);
  Transport& t = fabric.transport(0);
  int value = 0;
  CHECK(code_of([&] { t.send(0, &value, 4, 1); }) == ErrorCode::InvalidArgument);  // itself
  CHECK(code_of([&] { t.send(2, &value, 4, 1); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { t.recv(-1, &value, 4, 1); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { t.recv(1, nullptr, 4, 1); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { t.recv_reduce(1, &value, 1, DType::Float32, ReduceOp::BXor, 1); }) ==
        ErrorCode::InvalidArgument);
  CHECK(code_of([&] { t.recv_reduce(1, &value, SIZE_MAX / 2, DType::Int32, ReduceOp::Sum, 1); }) ==
        ErrorCode::InvalidArgument);
  CHECK(code_of([] { LocalFabric empty(0); }) == ErrorCode::InvalidArgument);
  CHECK(t.link(0) == Link::Self);
  CHECK(t.link(1) == Link::SharedMemory);
}

TEST_CASE("zero-byte messages match like any other", "[collectives][local_transport]") {
  LocalFabric fabric(2, 0);
  const Request send = fabric.transport(0).send(1, nullptr, 0, 4);
  const Request recv = fabric.transport(1).recv(0, nullptr, 0, 4);
  fabric.transport(1).wait(recv, soon());
  fabric.transport(0).wait(send, soon());
  SUCCEED("both completed");
}

}  // namespace
}  // namespace weft::collectives
