// ShmTransport between real rank processes: framing and streaming through small rings, matching
// by tag, both directions at once, reduction from the ring, a killed peer, abort.
#include "backends/tcp/shm_transport.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/file_store.h"

#include "backends/tcp/tcp_mesh.h"
#include "tests/tcp_backend/shm_transport_support.h"
#include "tests/tcp_backend/tcp_test_support.h"

namespace weft::tcp::test {
namespace {

// Every peer over shared memory: ring bytes, unexpected limit and single-copy threshold as given.
ShmRank connect_sized(const std::string& store_path, int rank, int size, size_t ring,
                      size_t unexpected_limit = size_t{64} << 20,
                      size_t single_copy_bytes = ShmTransport::Options{}.single_copy_bytes) {
  ShmTransport::Options options = test_shm_options();
  options.ring_bytes = ring;
  options.unexpected_limit = unexpected_limit;
  options.single_copy_bytes = single_copy_bytes;
  return connect_shm(store_path, rank, size, options);
}

TEST_CASE("shm transport delivers 0 B, 1 B, ring+1 B and 64 MiB messages intact on 2, 3, 4 ranks",
          "[shm][multiproc]") {
  for (int n : {2, 3, 4}) {
    TempDir dir;
    run_ranks_ok(n, [&](int rank) {
      ShmRank r = connect_shm(dir.file("store"), rank, n);
      ShmTransport& t = *r.transport;
      RANK_CHECK(t.link((rank + 1) % n) == collectives::Link::SharedMemory);
      const std::vector<size_t> sizes = {0, 1, kRing + 1, size_t{64} << 20};
      // Small messages to and from every peer; the 64 MiB one around the ring (r -> r+1), so
      // that four ranks hold 128 MiB each, not 384.
      std::vector<std::vector<uint8_t>> out, in;
      std::vector<collectives::Request> requests;
      for (int peer = 0; peer < n; ++peer) {
        if (peer == rank) continue;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const bool big = i + 1 == sizes.size();
          if (!big || peer == (rank + 1) % n) {
            out.push_back(pattern(rank * 100 + peer * 10 + i, sizes[i]));
            requests.push_back(t.send(peer, out.back().data(), sizes[i], make_tag(1, i)));
          }
        }
      }
      std::vector<uint64_t> seeds;
      for (int peer = 0; peer < n; ++peer) {
        if (peer == rank) continue;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const bool big = i + 1 == sizes.size();
          if (!big || rank == (peer + 1) % n) {
            in.emplace_back(sizes[i], 0xEE);
            seeds.push_back(peer * 100 + rank * 10 + i);
            requests.push_back(t.recv(peer, in.back().data(), sizes[i], make_tag(1, i)));
          }
        }
      }
      for (auto request : requests) t.wait(request, within(30s));
      for (size_t m = 0; m < in.size(); ++m) check_pattern(in[m], seeds[m], "message");
    });
  }
}

TEST_CASE("shm transport matches receives by tag whatever order they are posted in",
          "[shm][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 2);
    ShmTransport& t = *r.transport;
    // Tags 1..4 sent in order, tag 5 twice (matched in posting order); sizes differ per tag so a
    // wrong match fails on size or content.
    const std::vector<std::pair<uint32_t, size_t>> messages = {
        {1, 10}, {2, kRing * 2 + 3}, {3, 0}, {4, 7}, {5, 100}, {5, 100}};
    if (rank == 0) {
      std::vector<std::vector<uint8_t>> out;
      std::vector<collectives::Request> requests;
      for (size_t m = 0; m < messages.size(); ++m) {
        out.push_back(pattern(m, messages[m].second));
        requests.push_back(
            t.send(1, out.back().data(), out.back().size(), make_tag(7, messages[m].first)));
      }
      for (auto request : requests) t.wait(request, within(20s));
    } else {
      const std::vector<size_t> order = {5, 3, 4, 1, 0, 2};  // tag 5: in[5] posted first
      std::vector<std::vector<uint8_t>> in(messages.size());
      std::vector<collectives::Request> requests;
      for (size_t m : order) {
        in[m].assign(messages[m].second, 0xEE);
        requests.push_back(t.recv(0, in[m].data(), in[m].size(), make_tag(7, messages[m].first)));
      }
      for (size_t k = requests.size(); k-- > 0;) t.wait(requests[k], within(20s));
      for (size_t m = 0; m < messages.size(); ++m) {
        const size_t expected = m == 4 ? 5 : (m == 5 ? 4 : m);  // tag 5: posted 5 first
        check_pattern(in[m], expected, "tagged message");
      }
    }
  });
}

TEST_CASE("shm transport buffers messages that arrive before their receive and hands them over",
          "[shm][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 2);
    ShmTransport& t = *r.transport;
    // Tags 0 (3 rings long) and 1 go first; the receiver waits for tag 2, so both must be
    // buffered to reach it; tag 3, larger than the ring, then streams straight into its receive.
    const std::vector<size_t> sizes = {kRing * 3, 5, 64, kRing * 2 + 8};
    if (rank == 0) {
      std::vector<std::vector<uint8_t>> out;
      std::vector<collectives::Request> requests;
      for (size_t m = 0; m < sizes.size(); ++m) {
        out.push_back(pattern(m + 40, sizes[m]));
        requests.push_back(t.send(1, out.back().data(), sizes[m], make_tag(8, m)));
      }
      for (auto request : requests) t.wait(request, within(20s));
      return;
    }
    std::vector<std::vector<uint8_t>> in;
    for (size_t size : sizes) in.emplace_back(size, 0xEE);
    auto third = t.recv(0, in[2].data(), sizes[2], make_tag(8, 2));
    t.wait(third, within(20s));
    check_pattern(in[2], 42, "message after two unexpected ones");
    auto last = t.recv(0, in[3].data(), sizes[3], make_tag(8, 3));
    auto first = t.recv(0, in[0].data(), sizes[0], make_tag(8, 0));
    auto second = t.recv(0, in[1].data(), sizes[1], make_tag(8, 1));
    t.wait(first, within(20s));
    t.wait(second, within(20s));
    t.wait(last, within(20s));
    for (size_t m = 0; m < sizes.size(); ++m) check_pattern(in[m], m + 40, "buffered message");
  });
}

TEST_CASE(
    "shm transport pauses a peer past the unexpected limit and resumes when the receive "
    "is posted",
    "[shm][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    ShmRank r = connect_sized(dir.file("store"), rank, 2, kRing, 4096);
    ShmTransport& t = *r.transport;
    const std::vector<size_t> sizes = {100, 8192, 1};
    if (rank == 0) {
      std::vector<std::vector<uint8_t>> out;
      std::vector<collectives::Request> requests;
      for (size_t m = 0; m < sizes.size(); ++m) {
        out.push_back(pattern(m + 60, sizes[m]));
        requests.push_back(t.send(1, out.back().data(), sizes[m], make_tag(10, m)));
      }
      for (auto request : requests) t.wait(request, within(20s));
      // Stay until the receiver is done: leaving would close the control socket, and a lost
      // peer's messages are all buffered regardless of the limit.
      uint8_t done = 0;
      t.wait(t.recv(1, &done, 1, make_tag(10, 3)), within(20s));
      return;
    }
    std::vector<std::vector<uint8_t>> in;
    for (size_t size : sizes) in.emplace_back(size, 0xEE);
    // Tag 0 is buffered; tag 1 would pass the 4 KiB limit, so reading pauses before it and tag
    // 2 cannot be reached: the documented cost of bounding memory.
    auto blocked = t.recv(0, in[2].data(), 1, make_tag(10, 2));
    Error e = expect_error([&] { t.wait(blocked, within(300ms)); });
    RANK_CHECK(e.code() == ErrorCode::Timeout, "got {}", e.what());
    auto second = t.recv(0, in[1].data(), sizes[1], make_tag(10, 1));  // resumes reading
    auto first = t.recv(0, in[0].data(), sizes[0], make_tag(10, 0));
    auto third = t.recv(0, in[2].data(), 1, make_tag(10, 2));
    t.wait(third, within(20s));
    t.wait(second, within(20s));
    t.wait(first, within(20s));
    for (size_t m = 0; m < sizes.size(); ++m) check_pattern(in[m], m + 60, "paused message");
    uint8_t done = 1;
    t.wait(t.send(0, &done, 1, make_tag(10, 3)), within(20s));
  });
}

TEST_CASE(
    "shm receive of the wrong size fails with Protocol naming both sizes, and the stream "
    "goes on",
    "[shm][faults][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 2);
    ShmTransport& t = *r.transport;
    std::vector<uint8_t> big = pattern(50, kRing + 24), next = pattern(51, 9);
    if (rank == 0) {
      auto a = t.send(1, big.data(), big.size(), make_tag(9, 0));
      auto b = t.send(1, next.data(), next.size(), make_tag(9, 1));
      t.wait(a, within(20s));
      t.wait(b, within(20s));
      return;
    }
    std::vector<uint8_t> small(16), after(9);
    auto wrong = t.recv(0, small.data(), small.size(), make_tag(9, 0));
    Error e = expect_error([&] { t.wait(wrong, within(20s)); });
    const std::string what = e.what();
    RANK_CHECK(e.code() == ErrorCode::Protocol, "got {}", what);
    RANK_CHECK(what.find(std::to_string(kRing + 24)) != std::string::npos &&
                   what.find("16") != std::string::npos,
               "{}", what);
    auto good = t.recv(0, after.data(), after.size(), make_tag(9, 1));
    t.wait(good, within(20s));
    check_pattern(after, 51, "message after a discarded one");
  });
}

TEST_CASE("shm transport exchanges 64 MiB both ways at once without deadlock", "[shm][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 2);
    const size_t bytes = size_t{64} << 20;
    std::vector<uint8_t> out = pattern(rank, bytes), in(bytes);
    auto send = r.transport->send(1 - rank, out.data(), bytes, make_tag(2, 0));
    auto recv = r.transport->recv(1 - rank, in.data(), bytes, make_tag(2, 0));
    r.transport->wait(send, within(30s));  // the send cannot finish unless we also read
    r.transport->wait(recv, within(30s));
    check_pattern(in, 1 - rank, "exchange");
  });
}

TEST_CASE("shm recv_reduce sums float32 from two peers into the reference, across ring wraps",
          "[shm][multiproc]") {
  TempDir dir;
  constexpr size_t kCount = kRing / 4 * 3 + 5;  // wraps the ring, and not a whole number of it
  auto value = [](int rank, size_t i) { return static_cast<float>((rank + 1) * (i % 97) + rank); };
  run_ranks_ok(3, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 3);
    ShmTransport& t = *r.transport;
    std::vector<float> data(kCount);
    for (size_t i = 0; i < kCount; ++i) data[i] = value(rank, i);
    if (rank != 0) {
      // A 3-byte message first, so that the payload would start misaligned without padding.
      uint8_t odd[3] = {1, 2, 3};
      auto a = t.send(0, odd, sizeof(odd), make_tag(3, 0));
      auto b = t.send(0, data.data(), kCount * sizeof(float), make_tag(3, 1));
      t.wait(a, within(20s));
      t.wait(b, within(20s));
      return;
    }
    uint8_t odd[2][3];
    std::vector<collectives::Request> requests;
    for (int peer : {1, 2}) {
      requests.push_back(t.recv(peer, odd[peer - 1], 3, make_tag(3, 0)));
      requests.push_back(
          t.recv_reduce(peer, data.data(), kCount, DType::Float32, ReduceOp::Sum, make_tag(3, 1)));
    }
    for (auto request : requests) t.wait(request, within(20s));
    for (size_t i = 0; i < kCount; ++i) {
      const float want = value(0, i) + value(1, i) + value(2, i);
      RANK_CHECK(data[i] == want, "element {}: {} != {}", i, data[i], want);
    }
    RANK_CHECK(odd[1][2] == 3);
  });
}

TEST_CASE("killing a rank mid-transfer fails the others with PeerLost within 5 s",
          "[shm][faults][multiproc]") {
  TempDir dir;
  auto results = run_ranks(3, [&](int rank) {
    // Streamed through the ring (no single copy), so that the message is cut off mid-transfer.
    ShmRank r = connect_sized(dir.file("store"), rank, 3, kRing, size_t{64} << 20,
                              /*single_copy_bytes=*/0);
    ShmTransport& t = *r.transport;
    std::vector<uint8_t> buffer(size_t{8} << 20);
    if (rank == 2) {
      auto send = t.send(0, buffer.data(), buffer.size(), make_tag(4, 0));
      t.test(send);  // a ring's worth is written, the rest never will be
      ::kill(::getpid(), SIGKILL);
    }
    const auto start = Clock::now();
    auto recv = t.recv(2, buffer.data(), rank == 0 ? buffer.size() : 1, make_tag(4, 0));
    Error e = expect_error([&] { t.wait(recv, within(30s)); });
    const auto took = Clock::now() - start;
    RANK_CHECK(e.code() == ErrorCode::PeerLost, "got {}", e.what());
    RANK_CHECK(std::string(e.what()).find("rank 2") != std::string::npos, "{}", e.what());
    RANK_CHECK(took < 5s, "PeerLost took {} ms", (took / 1ms));
    // Later requests involving the lost peer fail at once; the other pair still works.
    auto late = t.send(2, buffer.data(), 1, make_tag(4, 1));
    RANK_CHECK(expect_error([&] { t.wait(late, within(1s)); }).code() == ErrorCode::PeerLost);
    uint8_t token = static_cast<uint8_t>(rank), got = 0xFF;
    auto s = t.send(1 - rank, &token, 1, make_tag(4, 2));
    auto g = t.recv(1 - rank, &got, 1, make_tag(4, 2));
    t.wait(s, within(10s));
    t.wait(g, within(10s));
    RANK_CHECK(got == 1 - rank);
  });
  INFO(describe_failures(results));
  REQUIRE(results[0].exit_code == 0);
  REQUIRE(results[1].exit_code == 0);
  REQUIRE(results[2].signal == SIGKILL);
}

TEST_CASE("a rank that cannot make its segment (EMFILE) fails its peer at once, naming it and why",
          "[shm][faults][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    FileStore store(dir.file("store"), 2);
    TcpMeshOptions mesh_options;
    mesh_options.key_prefix = "test/mesh";
    mesh_options.timeout = 20s;
    TcpMesh mesh = TcpMesh::connect(store, rank, 2, mesh_options);
    ShmTransport::Options options;
    options.key_prefix = "test/shm";
    options.group_id = mesh.group_id();
    options.ring_bytes = kRing;
    options.timeout = 20s;  // failing at this timeout would fail the bound below
    if (rank == 1) {
      // No descriptor left below the limit: shm_open fails with EMFILE, as a full /dev/shm fails
      // posix_fallocate; both take the same way out (a failed record), and this needs no root.
      const int lowest_free = ::dup(0);
      RANK_CHECK(lowest_free >= 0);
      ::close(lowest_free);
      rlimit limit{};
      RANK_CHECK(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
      limit.rlim_cur = static_cast<rlim_t>(lowest_free);
      RANK_CHECK(::setrlimit(RLIMIT_NOFILE, &limit) == 0);
    }
    const auto start = Clock::now();
    Error e = expect_error([&] { ShmTransport t(store, rank, 2, mesh.take_sockets(), options); });
    const auto took = Clock::now() - start;
    const std::string what = e.what();
    RANK_CHECK(e.code() == ErrorCode::Io, "got {}", what);
    RANK_CHECK(what.starts_with(fmt::format("rank {}/2 group \"world\" shm transport: Io: ", rank)),
               "{}", what);
    RANK_CHECK(what.find("too many open files: RLIMIT_NOFILE is") != std::string::npos &&
                   what.find("ulimit -n") != std::string::npos,
               "{}", what);
    if (rank == 0) {
      RANK_CHECK(what.find("rank 1 on this host could not make its shared-memory segment") !=
                     std::string::npos,
                 "{}", what);
    }
    RANK_CHECK(took < 5s, "failing took {} ms", (took / 1ms));
  });
}

TEST_CASE("abort from another thread fails a blocked wait with Aborted and the peer with PeerLost",
          "[shm][faults][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 2);
    ShmTransport& t = *r.transport;
    uint8_t byte = 0;
    auto recv = t.recv(1 - rank, &byte, 1, make_tag(5, 0));  // nobody sends it
    const auto start = Clock::now();
    if (rank == 0) {
      std::thread aborter([&] { t.abort("test abort"); });
      Error e = expect_error([&] { t.wait(recv, within(30s)); });
      aborter.join();
      RANK_CHECK(e.code() == ErrorCode::Aborted, "got {}", e.what());
      RANK_CHECK(std::string(e.what()).find("test abort") != std::string::npos, "{}", e.what());
      auto later = t.send(1, &byte, 1, make_tag(5, 1));
      RANK_CHECK(expect_error([&] { t.wait(later, within(1s)); }).code() == ErrorCode::Aborted);
    } else {
      Error e = expect_error([&] { t.wait(recv, within(30s)); });
      RANK_CHECK(e.code() == ErrorCode::PeerLost, "got {}", e.what());
    }
    RANK_CHECK(Clock::now() - start < 5s);
  });
}

TEST_CASE("shm wait past its deadline throws Timeout naming the peer, tag and bytes",
          "[shm][faults][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 2);
    ShmTransport& t = *r.transport;
    std::vector<uint8_t> data(1000, 7);
    if (rank == 1) {
      auto recv = t.recv(0, data.data(), data.size(), make_tag(6, 9));
      Error e = expect_error([&] { t.wait(recv, within(100ms)); });
      RANK_CHECK(e.code() == ErrorCode::Timeout, "got {}", e.what());
      const std::string what = e.what();
      RANK_CHECK(what.find("rank 0") != std::string::npos &&
                     what.find("tag 6:9") != std::string::npos &&
                     what.find("1000") != std::string::npos,
                 "{}", what);
    }
    // Then a message goes through both ways: the withdrawn receive left nothing behind.
    uint8_t token = static_cast<uint8_t>(rank + 1), got = 0;
    auto s = t.send(1 - rank, &token, 1, make_tag(6, 10));
    auto g = t.recv(1 - rank, &got, 1, make_tag(6, 10));
    t.wait(s, within(10s));
    t.wait(g, within(10s));
    RANK_CHECK(got == 2 - rank);
  });
}

}  // namespace
}  // namespace weft::tcp::test

namespace weft::tcp::test {
namespace {

TEST_CASE("single copy: large messages are read from the sender's memory, every byte right",
          "[shm][multiproc]") {
  TempDir dir;
  run_ranks_ok(3, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 3);
    ShmTransport& t = *r.transport;
    // 3 MiB + 8 from each rank to each other rank, received plainly and with recv_reduce, and a
    // message posted after its descriptor arrived (unexpected) as well as before.
    const size_t n = (size_t{3} << 20) / 4 + 2;
    std::vector<int32_t> mine(n), got(n), sum(n);
    for (size_t i = 0; i < n; ++i) mine[i] = static_cast<int32_t>(rank * 1000003 + i);
    std::vector<collectives::Request> requests;
    for (int peer = 0; peer < 3; ++peer) {
      if (peer == rank) continue;
      requests.push_back(t.send(peer, mine.data(), n * 4, make_tag(7, 0)));
      requests.push_back(t.send(peer, mine.data(), n * 4, make_tag(7, 1)));
    }
    const int from = (rank + 1) % 3;
    auto plain = t.recv(from, got.data(), n * 4, make_tag(7, 0));
    t.wait(plain, within(20s));
    for (size_t i = 0; i < n; ++i) {
      RANK_CHECK(got[i] == static_cast<int32_t>(from * 1000003 + i), "at {}: {}", i, got[i]);
    }
    std::fill(sum.begin(), sum.end(), 5);
    auto reduced = t.recv_reduce(from, sum.data(), n, DType::Int32, ReduceOp::Sum, make_tag(7, 1));
    t.wait(reduced, within(20s));
    for (size_t i = 0; i < n; ++i) {
      RANK_CHECK(sum[i] == static_cast<int32_t>(5 + from * 1000003 + i), "at {}: {}", i, sum[i]);
    }
    const int other = (rank + 2) % 3;
    for (uint32_t step = 0; step < 2; ++step) {
      std::fill(got.begin(), got.end(), -1);
      auto late = t.recv(other, got.data(), n * 4, make_tag(7, step));
      t.wait(late, within(20s));
      for (size_t i = 0; i < n; ++i) {
        RANK_CHECK(got[i] == static_cast<int32_t>(other * 1000003 + i), "at {}: {}", i, got[i]);
      }
    }
    for (auto request : requests) t.wait(request, within(20s));
  });
}

TEST_CASE("single copy: both ranks sending first, large, still complete (absorbed when idle)",
          "[shm][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    ShmRank r = connect_shm(dir.file("store"), rank, 2);
    ShmTransport& t = *r.transport;
    std::vector<uint8_t> out(size_t{4} << 20, static_cast<uint8_t>(rank + 1)), in(out.size());
    auto send = t.send(1 - rank, out.data(), out.size(), make_tag(8, 0));
    t.wait(send, within(20s));  // completes although the peer has not posted its receive yet
    auto recv = t.recv(1 - rank, in.data(), in.size(), make_tag(8, 0));
    t.wait(recv, within(20s));
    RANK_CHECK(std::all_of(in.begin(), in.end(), [&](uint8_t v) { return v == 2 - rank; }));
  });
}

}  // namespace
}  // namespace weft::tcp::test
