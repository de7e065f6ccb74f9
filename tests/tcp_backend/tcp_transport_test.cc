// TcpTransport: messages of every size class, tag matching, both directions at once, and
// recv_reduce, between real processes over loopback.
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "tests/tcp_backend/tcp_test_support.h"

namespace weft::tcp::test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST_CASE("send and recv of 0 B, 1 B, 1 MiB and 64 MiB arrive byte for byte", "[tcp][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 2);
    TcpTransport& t = *r.transport;
    const std::vector<size_t> sizes = {0, 1, kMiB, 64 * kMiB};
    for (size_t i = 0; i < sizes.size(); ++i) {
      uint64_t seed = 100 + i;
      if (rank == 0) {
        auto data = pattern(seed, sizes[i]);
        t.wait(t.send(1, data.data(), data.size(), make_tag(2, i)), within(20s));
      } else {
        std::vector<uint8_t> data(sizes[i], 0);
        t.wait(t.recv(0, data.data(), data.size(), make_tag(2, i)), within(20s));
        check_pattern(data, seed, "rank 1 recv");
      }
    }
  });
}

TEST_CASE("messages with 300 tags match receives posted in the opposite order",
          "[tcp][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 2);
    TcpTransport& t = *r.transport;
    constexpr int kMessages = 300;
    // Sizes from 0 to ~200 KiB, so some messages are read whole, some across many reads.
    auto size_of = [](int i) { return static_cast<size_t>(i * i * 7 % 200'000); };
    std::vector<std::vector<uint8_t>> buffers(kMessages);
    std::vector<collectives::Request> requests;
    if (rank == 0) {
      for (int i = 0; i < kMessages; ++i) {
        buffers[i] = pattern(i, size_of(i));
        requests.push_back(t.send(1, buffers[i].data(), buffers[i].size(), make_tag(5, i)));
      }
    } else {
      for (int i = kMessages; i-- > 0;) {
        buffers[i].assign(size_of(i), 0);
        requests.push_back(t.recv(0, buffers[i].data(), buffers[i].size(), make_tag(5, i)));
      }
    }
    for (auto request : requests) t.wait(request, within(20s));
    if (rank == 1) {
      for (int i = 0; i < kMessages; ++i) check_pattern(buffers[i], i, "out-of-order recv");
    }
  });
}

TEST_CASE("messages with the same tag match receives in posting order", "[tcp][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 2);
    TcpTransport& t = *r.transport;
    std::vector<std::vector<uint8_t>> buffers(3);
    std::vector<collectives::Request> requests;
    for (int i = 0; i < 3; ++i) {
      buffers[i] = rank == 0 ? pattern(40 + i, 1000) : std::vector<uint8_t>(1000, 0);
      requests.push_back(rank == 0 ? t.send(1, buffers[i].data(), 1000, make_tag(9, 0))
                                   : t.recv(0, buffers[i].data(), 1000, make_tag(9, 0)));
    }
    for (int i = 3; i-- > 0;) t.wait(requests[i], within(10s));  // waiting order does not matter
    if (rank == 1) {
      for (int i = 0; i < 3; ++i) check_pattern(buffers[i], 40 + i, "same-tag recv");
    }
  });
}

TEST_CASE("two ranks sending each other 64 MiB at once both complete", "[tcp][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    // A 1 MiB unexpected limit: the exchange must not depend on buffering a whole message.
    TcpTransport::Options options;
    options.unexpected_limit = kMiB;
    TcpRank r = connect_rank(dir.file("store"), rank, 2, options);
    TcpTransport& t = *r.transport;
    int peer = 1 - rank;
    auto out = pattern(rank, 64 * kMiB);
    std::vector<uint8_t> incoming(64 * kMiB, 0);
    auto recv = t.recv(peer, incoming.data(), incoming.size(), make_tag(3, 0));
    auto send = t.send(peer, out.data(), out.size(), make_tag(3, 0));
    t.wait(send, within(20s));  // the send first: it needs our receive to progress meanwhile
    t.wait(recv, within(20s));
    check_pattern(incoming, peer, "exchange");
  });
}

TEST_CASE("a 16 MiB message sent before its receive is posted is buffered and delivered",
          "[tcp][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 2);
    TcpTransport& t = *r.transport;
    int peer = 1 - rank;
    auto out = pattern(rank + 7, 16 * kMiB);
    t.wait(t.send(peer, out.data(), out.size(), make_tag(4, 0)), within(20s));
    std::vector<uint8_t> incoming(16 * kMiB, 0);
    t.wait(t.recv(peer, incoming.data(), incoming.size(), make_tag(4, 0)), within(20s));
    check_pattern(incoming, peer + 7, "late recv");
  });
}

TEST_CASE("messages past the unexpected limit wait in the socket and land when received",
          "[tcp][multiproc]") {
  TempDir dir;
  run_ranks_ok(3, [&](int rank) {
    // 1 MiB limit, 2 MiB messages from rank 0. Rank 1 reads from every socket while it waits
    // for rank 2's go-ahead, so it reads rank 0's first header and pauses on it; its receives,
    // posted afterwards in reverse order, must release it and match the rest as they arrive.
    TcpTransport::Options options;
    options.unexpected_limit = kMiB;
    TcpRank r = connect_rank(dir.file("store"), rank, 3, options);
    TcpTransport& t = *r.transport;
    constexpr int kMessages = 4;
    std::vector<std::vector<uint8_t>> buffers(kMessages);
    std::vector<collectives::Request> requests;
    uint8_t go = 1;
    if (rank == 0) {
      for (int i = 0; i < kMessages; ++i) {
        buffers[i] = pattern(60 + i, 2 * kMiB);
        requests.push_back(t.send(1, buffers[i].data(), buffers[i].size(), make_tag(10, i)));
      }
      r.store->set("sent", "1");  // the first header is on the wire: send() writes eagerly
    } else if (rank == 2) {
      r.store->wait({"sent"}, 20s);
      requests.push_back(t.send(1, &go, 1, make_tag(11, 0)));
    } else {
      t.wait(t.recv(2, &go, 1, make_tag(11, 0)), within(20s));
      for (int i = kMessages; i-- > 0;) {
        buffers[i].assign(2 * kMiB, 0);
        requests.push_back(t.recv(0, buffers[i].data(), buffers[i].size(), make_tag(10, i)));
      }
    }
    for (auto request : requests) t.wait(request, within(20s));
    if (rank == 1) {
      for (int i = 0; i < kMessages; ++i) check_pattern(buffers[i], 60 + i, "paused message");
    }
  });
}

// Values whose sums are exact in float32, so the reference does not depend on order.
float float_value(int rank, size_t i) { return static_cast<float>((i * 7 + rank * 3) % 1000); }
int64_t int_value(int rank, size_t i) {
  return static_cast<int64_t>(i * 0x100000001ULL) * (rank % 2 ? -1 : 1) + rank;
}

TEST_CASE("recv_reduce sums float32 and takes the max of int64 from two peers, as a reference",
          "[tcp][multiproc]") {
  TempDir dir;
  // An odd count and a small staging buffer: elements straddle reads and staging refills.
  constexpr size_t kCount = 1'000'003;
  run_ranks_ok(3, [&](int rank) {
    TcpTransport::Options options;
    options.staging_bytes = 4099;
    TcpRank r = connect_rank(dir.file("store"), rank, 3, options);
    TcpTransport& t = *r.transport;
    std::vector<float> floats(kCount);
    std::vector<int64_t> ints(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      floats[i] = float_value(rank, i);
      ints[i] = int_value(rank, i);
    }
    if (rank != 0) {
      t.wait(t.send(0, floats.data(), kCount * sizeof(float), make_tag(6, 0)), within(20s));
      t.wait(t.send(0, ints.data(), kCount * sizeof(int64_t), make_tag(6, 1)), within(20s));
      return;
    }
    std::vector<collectives::Request> requests;
    for (int peer : {1, 2}) {
      requests.push_back(t.recv_reduce(peer, floats.data(), kCount, DType::Float32, ReduceOp::Sum,
                                       make_tag(6, 0)));
    }
    for (auto request : requests) t.wait(request, within(20s));
    requests.clear();
    for (int peer : {2, 1}) {
      requests.push_back(
          t.recv_reduce(peer, ints.data(), kCount, DType::Int64, ReduceOp::Max, make_tag(6, 1)));
    }
    for (auto request : requests) t.wait(request, within(20s));
    for (size_t i = 0; i < kCount; ++i) {
      float sum = float_value(0, i) + float_value(1, i) + float_value(2, i);
      RANK_CHECK(floats[i] == sum, "float32 sum at {}: {} != {}", i, floats[i], sum);
      int64_t max = std::max({int_value(0, i), int_value(1, i), int_value(2, i)});
      RANK_CHECK(ints[i] == max, "int64 max at {}: {} != {}", i, ints[i], max);
    }
  });
}

TEST_CASE("recv_reduce of a message that arrived before it was posted reduces from the buffer",
          "[tcp][multiproc]") {
  TempDir dir;
  constexpr size_t kCount = 300'001;
  run_ranks_ok(2, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 2);
    TcpTransport& t = *r.transport;
    std::vector<int64_t> values(kCount);
    for (size_t i = 0; i < kCount; ++i) values[i] = int_value(rank, i);
    uint8_t marker = 1;
    if (rank == 1) {
      auto data = t.send(0, values.data(), kCount * sizeof(int64_t), make_tag(8, 0));
      auto after = t.send(0, &marker, 1, make_tag(8, 1));
      t.wait(data, within(20s));
      t.wait(after, within(20s));
      return;
    }
    // The marker travels behind the data on the same connection: once it is in, the data has
    // arrived unexpected.
    t.wait(t.recv(1, &marker, 1, make_tag(8, 1)), within(20s));
    t.wait(t.recv_reduce(1, values.data(), kCount, DType::Int64, ReduceOp::Sum, make_tag(8, 0)),
           within(20s));
    for (size_t i = 0; i < kCount; ++i) {
      int64_t sum = int_value(0, i) + int_value(1, i);
      RANK_CHECK(values[i] == sum, "int64 sum at {}: {} != {}", i, values[i], sum);
    }
  });
}

}  // namespace
}  // namespace weft::tcp::test
