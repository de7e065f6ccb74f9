// TcpMesh: pairwise connection setup through a store, and what it refuses.
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "backends/tcp/routed_transport.h"
#include "tests/tcp_backend/tcp_test_support.h"

namespace weft::tcp::test {
namespace {

// Every rank sends each peer {from, to} and checks what each peer sent it.
void exchange_ranks_with_every_peer(TcpTransport& t) {
  int n = t.size();
  std::vector<std::array<int32_t, 2>> out(n), in(n);
  std::vector<collectives::Request> requests;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == t.rank()) continue;
    out[peer] = {t.rank(), peer};
    requests.push_back(t.recv(peer, in[peer].data(), sizeof(in[peer]), make_tag(1, 0)));
    requests.push_back(t.send(peer, out[peer].data(), sizeof(out[peer]), make_tag(1, 0)));
  }
  for (auto r : requests) t.wait(r, within(10s));
  for (int peer = 0; peer < n; ++peer) {
    if (peer == t.rank()) continue;
    RANK_CHECK(in[peer][0] == peer && in[peer][1] == t.rank(),
               "rank {} got {{{}, {}}} from rank {}", t.rank(), in[peer][0], in[peer][1], peer);
    RANK_CHECK(t.link(peer) == collectives::Link::Tcp);
  }
}

TEST_CASE("tcp mesh connects every pair of 2, 3, 5 and 8 ranks, who then exchange messages",
          "[tcp][multiproc]") {
  for (int n : {2, 3, 5, 8}) {
    INFO("ranks: " << n);
    TempDir dir;
    run_ranks_ok(n, [&](int rank) {
      FileStore store(dir.file("store"), n);
      TcpMeshOptions options;
      options.key_prefix = "mesh";
      options.timeout = 20s;
      TcpMesh mesh = TcpMesh::connect(store, rank, n, options);
      RANK_CHECK(mesh.records().size() == static_cast<size_t>(n));
      for (int peer = 0; peer < n; ++peer) {
        RANK_CHECK(mesh.same_host(peer), "rank {} not on this host", peer);
        RANK_CHECK(mesh.records()[peer].host == "127.0.0.1", "host {}", mesh.records()[peer].host);
      }
      TcpTransport transport(std::move(mesh), {});
      exchange_ranks_with_every_peer(transport);
    });
  }
}

TEST_CASE("tcp mesh refuses stray connections and still connects the group", "[tcp][multiproc]") {
  TempDir dir;
  // Ranks 0 and 1 form the group; process 2 connects to rank 0's published port first, once
  // with garbage and once with a well-formed handshake for another group, and only then lets
  // rank 1 start. Rank 0 must close both and accept rank 1.
  run_ranks_ok(3, [&](int rank) {
    FileStore store(dir.file("store"), 3);
    if (rank == 2) {
      std::istringstream record(store.get_string("stray/0", 10s));
      std::string version, host, port;
      std::getline(record, version);
      std::getline(record, host);
      std::getline(record, port);
      auto deadline = within(10s);
      net::Socket garbage = net::connect_with_retry(host, std::stoi(port), deadline, "stray");
      std::array<uint8_t, 32> junk;
      junk.fill(0xAB);
      net::write_all(garbage.fd(), junk.data(), junk.size(), deadline, "stray");
      net::Socket other = net::connect_with_retry(host, std::stoi(port), deadline, "stray");
      std::array<uint8_t, 32> handshake{};
      const uint8_t magic[] = {'W', 'F', 'T', 'M', 1, 0};
      std::memcpy(handshake.data(), magic, sizeof(magic));
      handshake[8] = 0x42;  // some other group id
      handshake[16] = 1;    // from rank 1
      handshake[24] = 2;    // size 2
      net::write_all(other.fd(), handshake.data(), handshake.size(), deadline, "stray");
      store.set("stray_sent", "1");
      for (net::Socket* s : {&garbage, &other}) {
        uint8_t byte;
        bool closed = false;
        try {
          net::read_exact(s->fd(), &byte, 1, deadline, "stray");
        } catch (const Error& e) {
          closed = e.code() == ErrorCode::PeerLost;
        }
        RANK_CHECK(closed, "rank 0 did not close a stray connection");
      }
      return;
    }
    if (rank == 1) store.wait({"stray_sent"}, 10s);
    TcpMeshOptions options;
    options.key_prefix = "stray";
    options.timeout = 20s;
    TcpTransport transport(TcpMesh::connect(store, rank, 2, options), {});
    exchange_ranks_with_every_peer(transport);
  });
}

TEST_CASE("tcp mesh setup times out naming the ranks that never published an address",
          "[tcp][multiproc]") {
  TempDir dir;
  // A group of 4 of which only ranks 0 and 1 exist.
  run_ranks_ok(2, [&](int rank) {
    FileStore store(dir.file("store"), 2);
    TcpMeshOptions options;
    options.key_prefix = "partial";
    options.timeout = 300ms;
    auto start = Clock::now();
    try {
      TcpMesh::connect(store, rank, 4, options);
      RANK_CHECK(false, "connect returned without ranks 2 and 3");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::Timeout, "{}", e.what());
      RANK_CHECK(std::string(e.what()).find("ranks 2, 3 did not publish their addresses") !=
                     std::string::npos,
                 "{}", e.what());
    }
    RANK_CHECK(Clock::now() - start < 5s);
  });
}

TEST_CASE("tcp mesh setup times out naming the rank that published but never connected",
          "[tcp][multiproc]") {
  TempDir dir;
  // Process 2 publishes a well-formed record for rank 2 (a port that listens: connecting to it
  // succeeds) but never connects to ranks 0 and 1, nor answers them.
  run_ranks_ok(3, [&](int rank) {
    FileStore store(dir.file("store"), 3);
    if (rank == 2) {
      uint16_t port = 0;
      net::Socket listener = net::listen_on("127.0.0.1", 0, &port);
      store.set("silent/2",
                TcpMesh::encode_record(PeerRecord{"127.0.0.1", port, TcpMesh::host_fingerprint(),
                                                  TcpMesh::shm_domain(), std::nullopt},
                                       0));
      store.wait({"done/0", "done/1"}, 20s);
      return;
    }
    TcpMeshOptions options;
    options.key_prefix = "silent";
    options.timeout = 500ms;
    try {
      TcpMesh::connect(store, rank, 3, options);
      RANK_CHECK(false, "connect returned without rank 2");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::Timeout, "{}", e.what());
      RANK_CHECK(std::string(e.what()).find("rank 2 did not connect within") != std::string::npos,
                 "{}", e.what());
    }
    store.set(fmt::format("done/{}", rank), "1");
  });
}

TEST_CASE("tcp mesh setup names the one rank that never published its address",
          "[tcp][multiproc]") {
  TempDir dir;
  FileStore store(dir.file("store"), 1);
  TcpMeshOptions options;
  options.key_prefix = "alone";
  options.timeout = 300ms;
  try {
    TcpMesh::connect(store, 0, 2, options);
    FAIL("connect returned without rank 1");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Timeout);
    CHECK_THAT(e.what(), Catch::Contains("rank 1 did not publish its address under"));
  }
}

TEST_CASE("ranks on one host with different WEFT_SHM fail at setup naming both settings",
          "[tcp][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    FileStore store(dir.file("store"), 2);
    RoutedTransport::Options options;
    options.key_prefix = "shm-mismatch";
    options.timeout = 20s;
    options.shm = rank == 0;
    auto start = Clock::now();
    try {
      RoutedTransport::connect(store, rank, 2, options);
      RANK_CHECK(false, "connect accepted a shared-memory mismatch");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::InvalidArgument, "{}", e.what());
      const int peer = 1 - rank;
      const std::string expected =
          fmt::format("rank {} has WEFT_SHM={}, rank {} (this rank) has WEFT_SHM={}", peer,
                      peer == 0 ? 1 : 0, rank, rank == 0 ? 1 : 0);
      RANK_CHECK(std::string(e.what()).find(expected) != std::string::npos, "{}", e.what());
    }
    RANK_CHECK(Clock::now() - start < 10s, "took the timeout");
  });
}

TEST_CASE("a peer on another host that published a loopback address fails setup at once", "[tcp]") {
  // Rank 0 stands in for a rank on host "elsewhere" that published 127.0.0.1 (nobody set
  // WEFT_HOST_ADDR there and its store was on loopback): from here, that address reaches this
  // host, never rank 0. Rank 1 must say so at once, not retry until the timeout.
  TempDir dir;
  FileStore store(dir.file("store"), 2);
  uint16_t port = 0;
  net::Socket listener = net::listen_on("127.0.0.1", 0, &port);
  store.set("far/0", TcpMesh::encode_record(
                         PeerRecord{"127.0.0.1", port, "elsewhere/boot", "1:2", std::nullopt}, 7));
  TcpMeshOptions options;
  options.key_prefix = "far";
  options.timeout = 60s;
  const auto start = Clock::now();
  try {
    TcpMesh::connect(store, 1, 2, options);
    FAIL("connect accepted a loopback address from another host");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains(fmt::format(
                             "rank 0 runs on another host but published the loopback address "
                             "127.0.0.1:{}; on rank 0's host (elsewhere), set WEFT_SOCKET_IFNAME "
                             "to the interface, or WEFT_HOST_ADDR to the address",
                             port)));
  }
  CHECK(Clock::now() - start < 5s);
}

TEST_CASE("a published address that refuses connections fails setup in about a second", "[tcp]") {
  // Rank 0's record names a port nobody listens on any more. A rank publishes its address after
  // it listens, so a refusal is final: rank 1 fails after the short grace, naming the address,
  // not after the 60 s timeout.
  TempDir dir;
  FileStore store(dir.file("store"), 2);
  uint16_t port = 0;
  net::listen_on("127.0.0.1", 0, &port).close();
  store.set("refused/0",
            TcpMesh::encode_record(PeerRecord{"127.0.0.1", port, TcpMesh::host_fingerprint(),
                                              TcpMesh::shm_domain(), std::nullopt},
                                   7));
  TcpMeshOptions options;
  options.key_prefix = "refused";
  options.timeout = 60s;
  const auto start = Clock::now();
  try {
    TcpMesh::connect(store, 1, 2, options);
    FAIL("connect returned with nobody listening");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Io);
    CHECK_THAT(e.what(),
               Catch::Contains(fmt::format("127.0.0.1:{} refuses connections or is unreachable "
                                           "(Connection refused)",
                                           port)));
    CHECK_THAT(e.what(), Catch::Contains("the address rank 0 published does not reach it"));
    CHECK_THAT(e.what(), Catch::Contains("WEFT_HOST_ADDR"));
  }
  CHECK(Clock::now() - start < 10s);
}

TEST_CASE("a rank that cannot listen makes the others fail at once, naming it",
          "[tcp][multiproc]") {
  // Rank 1 is told to listen on an address this host does not have: it gives up before it
  // publishes, and writes its error where its record would be, so that rank 0 (waiting for that
  // record) fails now with rank 1's reason, not after the 60 s timeout.
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    FileStore store(dir.file("store"), 2);
    TcpMeshOptions options;
    options.key_prefix = "cannot-listen";
    options.timeout = 60s;
    if (rank == 1) options.host = "192.0.2.1";  // TEST-NET-1: never a local address
    const auto start = Clock::now();
    try {
      TcpMesh::connect(store, rank, 2, options);
      RANK_CHECK(false, "connect returned although rank 1 cannot listen");
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_CHECK(what.find("cannot listen on 192.0.2.1 (from the backend's host option)") !=
                     std::string::npos,
                 "{}", what);
      if (rank == 0) {
        RANK_CHECK(what.find("rank 1 gave up before it published its address") != std::string::npos,
                   "{}", what);
      }
    }
    RANK_CHECK(Clock::now() - start < 10s, "took the timeout");
  });
}

TEST_CASE(
    "a rank out of descriptors fails set-up at once naming RLIMIT_NOFILE, and so do its peers",
    "[tcp][faults][multiproc]") {
  // Rank 1 of 3 has room for `room` more descriptors. With 1, its listening socket takes it and
  // reading the boot id fails (which must not pass for "another host" and blame the addresses);
  // with 2, it connects to rank 0 and then cannot accept rank 2 (which must not spin until the
  // deadline). EMFILE is mended by no amount of waiting: it must fail now, naming the limit and
  // what to do, not at the 60 s timeout, and its peers must not wait for it either.
  for (int room : {1, 2}) {
    INFO("room for " << room << " descriptors");
    TempDir dir;
    run_ranks_ok(3, [&](int rank) {
      FileStore store(dir.file("store"), 3);
      TcpMeshOptions options;
      options.key_prefix = "no-fds";
      options.timeout = 60s;
      if (rank == 1) {
        const int lowest_free = ::dup(0);
        RANK_CHECK(lowest_free >= 0);
        ::close(lowest_free);
        rlimit limit{};
        RANK_CHECK(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
        limit.rlim_cur = static_cast<rlim_t>(lowest_free + room);
        RANK_CHECK(::setrlimit(RLIMIT_NOFILE, &limit) == 0);
      }
      const auto start = Clock::now();
      try {
        TcpMesh::connect(store, rank, 3, options);
        // Rank 0 may have its mesh before rank 1 fails (room 2): its first message will fail.
        RANK_CHECK(rank == 0, "connect returned although rank 1 is out of descriptors");
      } catch (const Error& e) {
        const std::string what = e.what();
        if (rank == 1) {
          RANK_CHECK(what.find("too many open files: RLIMIT_NOFILE is") != std::string::npos &&
                         what.find("raise it with ulimit -n") != std::string::npos,
                     "{}", what);
        }
        RANK_CHECK(what.find("does not reach it") == std::string::npos &&
                       what.find("loopback") == std::string::npos,
                   "blames the address: {}", what);
      }
      RANK_CHECK(Clock::now() - start < 10s, "took {} ms, not at once",
                 (Clock::now() - start) / 1ms);
    });
  }
}

TEST_CASE("tcp mesh rejects a rank outside the group", "[tcp]") {
  TempDir dir;
  FileStore store(dir.file("store"), 1);
  CHECK_THROWS_MATCHES(TcpMesh::connect(store, 3, 2), Error,
                       Catch::Predicate<Error>(
                           [](const Error& e) { return e.code() == ErrorCode::InvalidArgument; }));
}

TEST_CASE("a local-only mesh connects this host's ranks and never another host's", "[tcp]") {
  // Ranks 1 and 2 run here; rank 0 stands in for a rank on host "elsewhere", listening where
  // nobody may connect. With local_only, 1 and 2 connect to each other and not to rank 0.
  TempDir dir;
  uint16_t port = 0;
  net::Socket far_listener = net::listen_on("127.0.0.1", 0, &port);
  {
    FileStore store(dir.file("store"), 3);
    store.set("local/0",
              TcpMesh::encode_record(
                  PeerRecord{"127.0.0.1", port, "elsewhere/boot", "1:2", std::nullopt}, 7));
  }
  TcpMeshOptions options;
  options.key_prefix = "local";
  options.timeout = 30s;
  options.local_only = true;
  std::vector<net::Socket> two;
  std::thread other([&] {
    FileStore store(dir.file("store"), 3);
    two = TcpMesh::connect(store, 2, 3, options).take_sockets();
  });
  FileStore store(dir.file("store"), 3);
  std::vector<net::Socket> one = TcpMesh::connect(store, 1, 3, options).take_sockets();
  other.join();
  REQUIRE(one.size() == 3);
  REQUIRE(two.size() == 3);
  CHECK_FALSE(one[0].valid());
  CHECK(one[2].valid());
  CHECK_FALSE(two[0].valid());
  CHECK(two[1].valid());
  // Nobody knocked at rank 0's door.
  pollfd fd{far_listener.fd(), POLLIN, 0};
  CHECK(::poll(&fd, 1, 0) == 0);
  // The pair that connected talks.
  const char ping = 'p';
  REQUIRE(::send(one[2].fd(), &ping, 1, 0) == 1);
  char got = 0;
  REQUIRE(::recv(two[1].fd(), &got, 1, 0) == 1);
  CHECK(got == 'p');
}

TEST_CASE("tcp mesh of one rank has no connections", "[tcp]") {
  TempDir dir;
  FileStore store(dir.file("store"), 1);
  TcpMesh mesh = TcpMesh::connect(store, 0, 1);
  auto sockets = mesh.take_sockets();
  REQUIRE(sockets.size() == 1);
  CHECK_FALSE(sockets[0].valid());
}

}  // namespace
}  // namespace weft::tcp::test
