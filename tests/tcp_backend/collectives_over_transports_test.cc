// The proof that the transports carry the algorithms: every collective in collectives/ run on 2,
// 3 and 4 real processes over ShmTransport, over TcpTransport, and over RoutedTransport with
// some pairs on each, checked element by element against references computed here.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/file_store.h"

#include "backends/tcp/routed_transport.h"
#include "backends/tcp/shm_transport.h"
#include "backends/tcp/tcp_mesh.h"
#include "backends/tcp/tcp_transport.h"
#include "collectives/binomial_tree.h"
#include "collectives/dissemination.h"
#include "collectives/hierarchical.h"
#include "collectives/pairwise.h"
#include "collectives/recursive_doubling.h"
#include "collectives/ring.h"
#include "collectives/symmetric.h"
#include "tests/tcp_backend/tcp_test_support.h"

namespace weft::tcp::test {
namespace {

using collectives::Context;
using collectives::Link;
using collectives::Transport;

enum class Kind { Shm, Tcp, Routed };

const char* kind_name(Kind kind) {
  return kind == Kind::Shm ? "shm" : kind == Kind::Tcp ? "tcp" : "routed";
}

struct Connected {
  std::unique_ptr<FileStore> store;
  std::unique_ptr<Transport> transport;
};

// Connects `rank` over the transport of `kind`. Routed puts ranks of equal parity on shared
// memory and the other pairs on TCP, so that 3 and 4 ranks mix both in one collective.
Connected connect(Kind kind, const std::string& store_path, int rank, int size,
                  size_t ring_bytes = 64 * 1024) {
  Connected result;
  result.store = std::make_unique<FileStore>(store_path, size);
  if (kind == Kind::Routed) {
    RoutedTransport::Options options;
    options.key_prefix = "test/routed";
    options.timeout = 20s;
    options.shm_between = [](int a, int b) { return a % 2 == b % 2; };
    options.shm_options.ring_bytes = ring_bytes;
    result.transport = RoutedTransport::connect(*result.store, rank, size, options);
    return result;
  }
  TcpMeshOptions mesh_options;
  mesh_options.key_prefix = "test/mesh";
  mesh_options.timeout = 20s;
  TcpMesh mesh = TcpMesh::connect(*result.store, rank, size, mesh_options);
  if (kind == Kind::Tcp) {
    result.transport = std::make_unique<TcpTransport>(std::move(mesh), TcpTransport::Options{});
    return result;
  }
  ShmTransport::Options options;
  options.key_prefix = "test/shm";
  options.group_id = mesh.group_id();
  options.ring_bytes = ring_bytes;
  options.timeout = 20s;
  result.transport =
      std::make_unique<ShmTransport>(*result.store, rank, size, mesh.take_sockets(), options);
  return result;
}

// Rank r's element i: small integers, so float32 sums of a few ranks are exact.
float value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13) - rank);
}

void check_equal(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                 int rank) {
  RANK_CHECK(got.size() == want.size(), "{}: {} elements, want {}", what, got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    RANK_CHECK(got[i] == want[i], "{} on rank {}: element {} is {}, want {}", what, rank, i, got[i],
               want[i]);
  }
}

// Runs every algorithm once, in order, each with its own sequence number.
void run_every_collective(Transport& t, int n) {
  const int rank = t.rank();
  uint64_t seq = 1;
  auto ctx = [&] { return Context{.transport = t, .seq = seq++, .deadline = within(30s)}; };
  // Not a multiple of P nor of the segment: uneven chunks and a partial last segment.
  const size_t count = 50'003;
  std::vector<float> input(count);
  for (size_t i = 0; i < count; ++i) input[i] = value(rank, i);
  std::vector<float> sum(count, 0.0f);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) sum[i] += value(r, i);
  }

  std::vector<float> out(count);
  collectives::ring_all_reduce(ctx(), input.data(), out.data(), count, DType::Float32,
                               ReduceOp::Sum, 16 * 1024);
  check_equal(out, sum, "ring all_reduce", rank);

  std::fill(out.begin(), out.end(), -1.0f);
  collectives::recursive_doubling_all_reduce(ctx(), input.data(), out.data(), count, DType::Float32,
                                             ReduceOp::Sum);
  check_equal(out, sum, "recursive doubling all_reduce", rank);

  const size_t block = 1001;
  std::vector<float> gathered(block * n), want_gathered(block * n);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < block; ++i) want_gathered[r * block + i] = value(r, i);
  }
  collectives::ring_all_gather(ctx(), input.data(), gathered.data(), block, DType::Float32, 1024);
  check_equal(gathered, want_gathered, "ring all_gather", rank);

  // reduce_scatter: input holds P blocks; block j of rank r is value(r, j * block + i).
  std::vector<float> scattered(block), want_scattered(block, 0.0f);
  std::vector<float> rs_input(block * n);
  for (size_t i = 0; i < block * n; ++i) rs_input[i] = value(rank, i);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < block; ++i) want_scattered[i] += value(r, rank * block + i);
  }
  collectives::ring_reduce_scatter(ctx(), rs_input.data(), scattered.data(), block, DType::Float32,
                                   ReduceOp::Sum, 1024);
  check_equal(scattered, want_scattered, "ring reduce_scatter", rank);

  const int root = 1 % n;
  std::vector<float> broadcast(count);
  if (rank == root) broadcast = input;
  collectives::binomial_broadcast(ctx(), broadcast.data(), count * sizeof(float), root);
  std::vector<float> want_broadcast(count);
  for (size_t i = 0; i < count; ++i) want_broadcast[i] = value(root, i);
  check_equal(broadcast, want_broadcast, "binomial broadcast", rank);

  // all_to_all: rank r's block for rank j holds value(r, j * block + i).
  std::vector<float> exchanged(block * n), want_exchanged(block * n);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < block; ++i) want_exchanged[r * block + i] = value(r, rank * block + i);
  }
  collectives::pairwise_all_to_all(ctx(), rs_input.data(), exchanged.data(), block, DType::Float32);
  check_equal(exchanged, want_exchanged, "pairwise all_to_all", rank);

  collectives::dissemination_barrier(ctx());
}

TEST_CASE(
    "every collective algorithm gives the reference result over shm, tcp and routed "
    "transports on 2, 3 and 4 processes",
    "[collectives][multiproc]") {
  for (Kind kind : {Kind::Shm, Kind::Tcp, Kind::Routed}) {
    for (int n : {2, 3, 4}) {
      SECTION(fmt::format("{} on {} ranks", kind_name(kind), n)) {
        TempDir dir;
        run_ranks_ok(n, [&](int rank) {
          Connected c = connect(kind, dir.file("store"), rank, n);
          for (int peer = 0; peer < n; ++peer) {
            if (peer == rank) continue;
            const Link want = kind == Kind::Tcp      ? Link::Tcp
                              : kind == Kind::Shm    ? Link::SharedMemory
                              : peer % 2 == rank % 2 ? Link::SharedMemory
                                                     : Link::Tcp;
            RANK_CHECK(c.transport->link(peer) == want, "link to rank {}", peer);
          }
          run_every_collective(*c.transport, n);
        });
      }
    }
  }
}

TEST_CASE("routed transport puts every peer on shared memory when all share the host",
          "[collectives][multiproc]") {
  TempDir dir;
  run_ranks_ok(3, [&](int rank) {
    auto store = std::make_unique<FileStore>(dir.file("store"), 3);
    RoutedTransport::Options options;
    options.key_prefix = "test/routed-default";
    options.timeout = 20s;
    options.shm = true;
    auto t = RoutedTransport::connect(*store, rank, 3, options);
    for (int peer = 0; peer < 3; ++peer) {
      if (peer != rank) RANK_CHECK(t->link(peer) == Link::SharedMemory);
    }
    run_every_collective(*t, 3);
  });
}

TEST_CASE("a 16 MiB ring all_reduce over two hosts' worth of ranks: shm in pairs, TCP between",
          "[collectives][multiproc]") {
  // Ranks {0, 1} and {2, 3} share memory, the ring's other links are TCP: how 2 hosts x 2 ranks
  // run. Large enough that TCP sends fill the socket buffers, so a rank waiting on a shared-memory
  // request must keep reading its TCP peers or the ring deadlocks.
  TempDir dir;
  run_ranks_ok(4, [&](int rank) {
    FileStore store(dir.file("store"), 4);
    RoutedTransport::Options options;
    options.key_prefix = "test/routed-pairs";
    options.timeout = 20s;
    options.shm_between = [](int a, int b) { return a / 2 == b / 2; };
    auto t = RoutedTransport::connect(store, rank, 4, options);
    RANK_CHECK(t->link(rank ^ 1) == Link::SharedMemory);
    RANK_CHECK(t->link((rank + 2) % 4) == Link::Tcp);
    const size_t count = 4 * 1024 * 1024 + 3;
    std::vector<float> input(count), out(count), want(count, 0.0f);
    for (size_t i = 0; i < count; ++i) input[i] = value(rank, i);
    for (int r = 0; r < 4; ++r) {
      for (size_t i = 0; i < count; ++i) want[i] += value(r, i);
    }
    for (uint64_t seq = 1; seq <= 8; ++seq) {
      std::fill(out.begin(), out.end(), -1.0f);
      collectives::ring_all_reduce(Context{.transport = *t, .seq = seq, .deadline = within(20s)},
                                   input.data(), out.data(), count, DType::Float32, ReduceOp::Sum);
      check_equal(out, want, "ring all_reduce over shm pairs and tcp", rank);
    }
  });
}

TEST_CASE("hierarchical collectives over two nodes of shared memory joined by TCP",
          "[collectives][multiproc][hierarchical]") {
  // Nodes {0, 1} and {2, 3} (as 2 hosts x 2 ranks launch), then {0, 2} and {1, 3} (ranks placed
  // round-robin): the transport reports them, and every hierarchical collective is right on them.
  for (bool round_robin : {false, true}) {
    TempDir dir;
    run_ranks_ok(4, [&](int rank) {
      FileStore store(dir.file("store"), 4);
      RoutedTransport::Options options;
      options.key_prefix = "test/hierarchical";
      options.timeout = 20s;
      options.shm_between = [round_robin](int a, int b) {
        return round_robin ? a % 2 == b % 2 : a / 2 == b / 2;
      };
      auto t = RoutedTransport::connect(store, rank, 4, options);
      const collectives::NodeLayout layout = collectives::node_layout(*t);
      RANK_CHECK(layout.node_count() == 2 && layout.ranks_per_node() == 2, "{} nodes",
                 layout.node_count());
      RANK_CHECK(t->node_of(rank) == t->node_of(round_robin ? rank ^ 2 : rank ^ 1));
      RANK_CHECK(t->node_of(rank) != t->node_of(round_robin ? rank ^ 1 : rank ^ 2));
      uint64_t seq = 1;
      auto ctx = [&] { return Context{.transport = *t, .seq = seq++, .deadline = within(20s)}; };
      const size_t count = 2 * 1024 * 1024 + 3;  // 8 MiB: every phase spans many segments
      std::vector<float> input(count), out(count, -1.0f), want(count, 0.0f);
      for (size_t i = 0; i < count; ++i) input[i] = value(rank, i);
      for (int r = 0; r < 4; ++r) {
        for (size_t i = 0; i < count; ++i) want[i] += value(r, i);
      }
      collectives::hierarchical_all_reduce(ctx(), layout, input.data(), out.data(), count,
                                           DType::Float32, ReduceOp::Sum);
      check_equal(out, want, "hierarchical all_reduce", rank);

      const std::vector<size_t> counts = {100'000, 0, 33'333, 250'001};
      const size_t first = std::accumulate(counts.begin(), counts.begin() + rank, size_t{0});
      std::vector<float> mine(counts[rank], -1.0f);
      collectives::hierarchical_reduce_scatter(ctx(), layout, input.data(), mine.data(), counts,
                                               DType::Float32, ReduceOp::Sum);
      check_equal(mine,
                  std::vector<float>(want.begin() + first, want.begin() + first + counts[rank]),
                  "hierarchical reduce_scatter", rank);

      const size_t block = 300'007;
      std::vector<float> gathered(block * 4, -1.0f), want_gathered(block * 4);
      for (int r = 0; r < 4; ++r) {
        for (size_t i = 0; i < block; ++i) want_gathered[r * block + i] = value(r, i);
      }
      collectives::hierarchical_all_gather(ctx(), layout, input.data(), gathered.data(), block,
                                           DType::Float32);
      check_equal(gathered, want_gathered, "hierarchical all_gather", rank);

      for (int root = 0; root < 4; ++root) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = rank == root ? value(root, i) : -1.0f;
        collectives::hierarchical_broadcast(ctx(), layout, data.data(), count * sizeof(float),
                                            root);
        std::vector<float> want_data(count);
        for (size_t i = 0; i < count; ++i) want_data[i] = value(root, i);
        check_equal(data, want_data, "hierarchical broadcast", rank);
      }
    });
  }
}

TEST_CASE("zero-copy hierarchical collectives on symmetric buffers of emulated hosts",
          "[collectives][multiproc][hierarchical][symmetric]") {
  // Each host's ranks share one mapping (their blocks), the hosts join over TCP: 2 x 2 with hosts
  // {0, 1} {2, 3} and round-robin {0, 2} {1, 3}, and 3 x 2 round-robin {0, 3} {1, 4} {2, 5}, so
  // that rails are not runs of consecutive ranks. Offsets one float past a 64-byte line.
  struct Hosts {
    int ranks;
    int hosts;
    bool round_robin;
  };
  for (Hosts h : {Hosts{4, 2, false}, Hosts{4, 2, true}, Hosts{6, 3, true}}) {
    TempDir dir;
    run_ranks_ok(h.ranks, [&](int rank) {
      const int n = h.ranks;
      const int per_host = n / h.hosts;
      auto host_of = [&](int r) { return h.round_robin ? r % h.hosts : r / per_host; };
      FileStore store(dir.file("store"), n);
      RoutedTransport::Options options;
      options.key_prefix = "test/symmetric-hosts";
      options.timeout = 20s;
      options.shm_between = [&](int a, int b) { return host_of(a) == host_of(b); };
      auto t = RoutedTransport::connect(store, rank, n, options);
      const collectives::NodeLayout layout = collectives::node_layout(*t);
      collectives::SymmetricMemory* memory = t->symmetric_memory();
      RANK_CHECK(memory != nullptr, "no symmetric memory: {}", t->why_no_symmetric_memory());
      if (memory == nullptr) return;
      const size_t count = 300'007;  // over 1 MiB of float32, not a multiple of any slice
      const size_t block = 50'001;
      const size_t skew = 64 + sizeof(float);
      const size_t bytes = 2 * (count + 64) * sizeof(float) + 4096;
      auto region = memory->allocate(bytes, within(20s));
      RANK_CHECK(region->ranks() == per_host && region->spans_hosts() &&
                     region->group_rank() == rank && region->group_size() == n,
                 "region of {} blocks, this rank's {} (rank {}/{})", region->ranks(),
                 region->rank(), region->group_rank(), region->group_size());
      RANK_CHECK(region->rank() == layout.local);
      uint64_t seq = 1;
      auto run = [&](auto body) {
        const Context ctx{.transport = *t, .seq = seq, .deadline = within(20s)};
        collectives::SymmetricCall call;
        call.seq = seq++;
        collectives::SymmetricContext sc{
            .ctx = ctx, .memory = *memory, .anchor = *region, .call = call};
        body(sc);
      };
      auto* base = static_cast<std::byte*>(region->data());
      const size_t out_offset = (skew + count * sizeof(float) + 64) / 64 * 64 + sizeof(float);
      auto* in = reinterpret_cast<float*>(base + skew);
      auto* out = reinterpret_cast<float*>(base + out_offset);
      const collectives::SymmetricOperand input{region.get(), skew};
      const collectives::SymmetricOperand output{region.get(), out_offset};
      std::vector<float> sum(count, 0.0f);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) sum[i] += value(r, i);
      }
      auto got = [](const float* p, size_t k) { return std::vector<float>(p, p + k); };

      for (ReduceOp op : {ReduceOp(ReduceOp::Sum), ReduceOp(ReduceOp::Avg)}) {
        for (bool in_place : {false, true}) {
          for (size_t i = 0; i < count; ++i) in[i] = value(rank, i);
          if (!in_place) std::fill(out, out + count, -1.0f);
          run([&](auto& sc) {
            collectives::symmetric_hierarchical_all_reduce(
                sc, layout, input, in_place ? input : output, count, DType::Float32, op);
          });
          std::vector<float> want = sum;
          if (op.kind == ReduceOp::Avg) {
            for (float& w : want) w /= static_cast<float>(n);
          }
          check_equal(got(in_place ? in : out, count), want,
                      in_place ? "symmetric hierarchical all_reduce in place"
                               : "symmetric hierarchical all_reduce",
                      rank);
        }
      }

      // reduce_scatter: n blocks of `block` in, this rank's block out.
      for (size_t i = 0; i < block * n; ++i) in[i] = value(rank, i);
      std::fill(out, out + block, -1.0f);
      run([&](auto& sc) {
        collectives::symmetric_hierarchical_reduce_scatter(sc, layout, input, output, block,
                                                           DType::Float32, ReduceOp::Max);
      });
      std::vector<float> want_max(block);
      for (size_t i = 0; i < block; ++i) {
        float m = value(0, rank * block + i);
        for (int r = 1; r < n; ++r) m = std::max(m, value(r, rank * block + i));
        want_max[i] = m;
      }
      check_equal(got(out, block), want_max, "symmetric hierarchical reduce_scatter max", rank);

      // all_gather, out of place then in place (the input is this rank's block of the output).
      std::vector<float> want_gathered(block * n);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < block; ++i) want_gathered[r * block + i] = value(r, i);
      }
      for (bool in_place : {false, true}) {
        std::fill(out, out + block * n, -1.0f);
        float* mine = in_place ? out + rank * block : in;
        for (size_t i = 0; i < block; ++i) mine[i] = value(rank, i);
        run([&](auto& sc) {
          collectives::symmetric_hierarchical_all_gather(
              sc, layout, in_place ? collectives::SymmetricOperand{} : input, output, block,
              DType::Float32);
        });
        check_equal(got(out, block * n), want_gathered,
                    in_place ? "symmetric hierarchical all_gather in place"
                             : "symmetric hierarchical all_gather",
                    rank);
      }

      for (int root = 0; root < n; ++root) {
        std::vector<float> source(count);
        for (size_t i = 0; i < count; ++i) source[i] = value(root, i);
        std::fill(out, out + count, -1.0f);
        run([&](auto& sc) {
          collectives::symmetric_hierarchical_broadcast(sc, layout, source.data(), output, count,
                                                        DType::Float32, root);
        });
        check_equal(got(out, count), source, "symmetric hierarchical broadcast", rank);
      }
    });
  }
}

// Not a test: prints ring all_reduce times over shm and tcp (run with
// `collectives_over_transports_test "[.perf]" -s`).
TEST_CASE("ring all_reduce timing over shm and tcp", "[.perf]") {
  for (Kind kind : {Kind::Shm, Kind::Tcp}) {
    for (size_t bytes : {size_t{1} << 20, size_t{16} << 20}) {
      TempDir dir;
      const int n = 2;
      run_ranks_ok(n, [&](int rank) {
        Connected c = connect(kind, dir.file("store"), rank, n, size_t{2} << 20);
        const size_t count = bytes / sizeof(float);
        std::vector<float> input(count, 1.0f), out(count);
        uint64_t seq = 1;
        auto once = [&] {
          collectives::ring_all_reduce(
              Context{.transport = *c.transport, .seq = seq++, .deadline = within(60s)},
              input.data(), out.data(), count, DType::Float32, ReduceOp::Sum);
        };
        for (int i = 0; i < 3; ++i) once();
        std::vector<double> ms;
        for (int i = 0; i < 10; ++i) {
          auto start = Clock::now();
          once();
          ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        }
        std::sort(ms.begin(), ms.end());
        if (rank == 0) {
          std::ofstream(dir.file("timing")) << fmt::format(
              "{} ring all_reduce {} MiB on {} ranks: median {:.2f} ms, min {:.2f} ms",
              kind_name(kind), bytes >> 20, n, ms[ms.size() / 2], ms[0]);
        }
      });
      std::string line;  // the ranks' output is captured: rank 0 leaves its line in a file
      std::getline(std::ifstream(dir.file("timing")), line);
      fmt::print("{}\n", line);
    }
  }
}

}  // namespace
}  // namespace weft::tcp::test
