// Shared slots (backends/tcp/shm_slots.h) and the small collectives over them
// (collectives/slot_collectives.h), between real rank processes: every result checked element by
// element against a reference computed here, many collectives in a row (both slot parities, ranks
// outnumbering cores), waits that sleep, a killed rank, a timeout, abort, desync, and ranks that
// disagree about the slot size.
#include "backends/tcp/shm_slots.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/file_store.h"

#include "backends/tcp/shm_transport.h"
#include "backends/tcp/tcp_mesh.h"
#include "collectives/slot_collectives.h"
#include "tests/tcp_backend/shm_transport_support.h"
#include "tests/tcp_backend/tcp_test_support.h"

namespace weft::tcp::test {
namespace {

using collectives::Context;
using collectives::SharedSlots;

struct SlotRank : ShmRank {
  SharedSlots& slots() const {
    SharedSlots* slots = transport->shared_slots();
    RANK_CHECK(slots != nullptr, "the transport offers no shared slots");
    return *slots;
  }
  ShmSlots& shm_slots() const { return dynamic_cast<ShmSlots&>(slots()); }
};

SlotRank connect_slots(const std::string& store_path, int rank, int size,
                       size_t slot_bytes = ShmTransport::Options{}.slot_bytes) {
  ShmTransport::Options options = test_shm_options();
  options.slot_bytes = slot_bytes;
  return SlotRank{connect_shm(store_path, rank, size, options)};
}

// Rank r's element i in collective k: distinct across ranks, elements and collectives.
int64_t value(int r, size_t i, int k) {
  return (r + 1) * 1000003 + static_cast<int64_t>(i) * 7 - k * 13;
}

// Runs `rounds` small collectives of every kind over the slots, checking each result.
void run_mix(SlotRank& r, int rank, int size, int rounds) {
  ShmTransport& t = *r.transport;
  SharedSlots& slots = r.slots();
  const size_t cap64 = slots.capacity() / sizeof(int64_t) / size;  // reduce_scatter's bound
  for (int k = 0; k < rounds; ++k) {
    Context ctx{t, static_cast<uint64_t>(k + 1), within(30s)};
    const size_t count = (static_cast<size_t>(k) * 37) % (cap64 + 1);
    const int root = (k / 7) % size;
    switch (k % 7) {
      case 0: {  // all_reduce int64 sum, in place on odd rounds of this kind
        std::vector<int64_t> in(count), out(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = value(rank, i, k);
        const bool in_place = (k / 7) % 2 == 1;
        int64_t* dst = in_place ? in.data() : out.data();
        collectives::slot_all_reduce(ctx, slots, in.data(), dst, count, DType::Int64, ReduceOp{});
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int p = 0; p < size; ++p) want += value(p, i, k);
          RANK_CHECK(dst[i] == want, "all_reduce #{} element {}: {} != {}", k, i, dst[i], want);
        }
        break;
      }
      case 1: {  // all_reduce float32 avg and premul_sum (exact in float)
        std::vector<float> in(count), out(count);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank * 2 + i % 5 + k % 3);
        const bool avg = (k / 7) % 2 == 0;
        ReduceOp op = avg ? ReduceOp{ReduceOp::Avg} : ReduceOp::premul_sum(0.5);
        collectives::slot_all_reduce(ctx, slots, in.data(), out.data(), count, DType::Float32, op);
        for (size_t i = 0; i < count; ++i) {
          float sum = 0;
          for (int p = 0; p < size; ++p)
            sum += static_cast<float>(p * 2 + i % 5 + k % 3) * (avg ? 1 : 0.5f);
          const float want = avg ? sum / static_cast<float>(size) : sum;
          RANK_CHECK(out[i] == want, "all_reduce {} #{} element {}: {} != {}",
                     avg ? "avg" : "premul", k, i, out[i], want);
        }
        break;
      }
      case 2: {  // all_gather int32, in place on odd rounds of this kind
        std::vector<int32_t> in(count), out(count * size, -1);
        const bool in_place = (k / 7) % 2 == 1;
        int32_t* src = in_place ? out.data() + rank * count : in.data();
        for (size_t i = 0; i < count; ++i) src[i] = static_cast<int32_t>(value(rank, i, k));
        collectives::slot_all_gather(ctx, slots, src, out.data(), count, DType::Int32);
        for (int p = 0; p < size; ++p) {
          for (size_t i = 0; i < count; ++i) {
            const auto want = static_cast<int32_t>(value(p, i, k));
            RANK_CHECK(out[p * count + i] == want, "all_gather #{} block {} element {}", k, p, i);
          }
        }
        break;
      }
      case 3: {  // reduce_scatter int64 max
        std::vector<int64_t> in(count * size), out(count, -1);
        for (size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i, k) * (rank % 2 ? -1 : 1);
        collectives::slot_reduce_scatter(ctx, slots, in.data(), out.data(), count, DType::Int64,
                                         ReduceOp{ReduceOp::Max});
        for (size_t i = 0; i < count; ++i) {
          int64_t want = INT64_MIN;
          for (int p = 0; p < size; ++p) {
            want = std::max(want, value(p, rank * count + i, k) * (p % 2 ? -1 : 1));
          }
          RANK_CHECK(out[i] == want, "reduce_scatter #{} element {}: {} != {}", k, i, out[i], want);
        }
        break;
      }
      case 4: {  // broadcast from a root that moves
        std::vector<int64_t> data(count, -1);
        if (rank == root) {
          for (size_t i = 0; i < count; ++i) data[i] = value(root, i, k);
        }
        collectives::slot_broadcast(ctx, slots, data.data(), count * sizeof(int64_t), root);
        for (size_t i = 0; i < count; ++i) {
          RANK_CHECK(data[i] == value(root, i, k), "broadcast #{} element {}", k, i);
        }
        break;
      }
      case 5: {  // reduce int32 sum to a root that moves
        std::vector<int32_t> in(count), out(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(value(rank, i, k) % 1000);
        collectives::slot_reduce(ctx, slots, in.data(), rank == root ? out.data() : nullptr, count,
                                 DType::Int32, ReduceOp{}, root);
        if (rank == root) {
          for (size_t i = 0; i < count; ++i) {
            int32_t want = 0;
            for (int p = 0; p < size; ++p) want += static_cast<int32_t>(value(p, i, k) % 1000);
            RANK_CHECK(out[i] == want, "reduce #{} element {}", k, i);
          }
        }
        break;
      }
      default:
        collectives::slot_barrier(ctx, slots);
        break;
    }
  }
  RANK_CHECK(slots.arrivals() == static_cast<uint64_t>(rounds));
}

TEST_CASE("slot collectives match the reference element by element, 2 to 8 ranks, 300 in a row",
          "[shm][slots][multiproc]") {
  for (int size : {2, 3, 5, 8}) {
    DYNAMIC_SECTION(size << " ranks") {
      TempDir dir;
      run_ranks_ok(size, [&](int rank) {
        SlotRank r = connect_slots(dir.file("store"), rank, size, 4096);
        run_mix(r, rank, size, 300);
      });
    }
  }
}

TEST_CASE("a rank waiting in the slot barrier sleeps in the kernel and is woken by the last",
          "[shm][slots][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    SlotRank r = connect_slots(dir.file("store"), rank, 2);
    ShmSlots& slots = r.shm_slots();
    int64_t in = rank + 1, out = 0;
    if (rank == 1) {
      // Arrive only once rank 0 sleeps (bounded: rank 0 sleeps within its spin, microseconds).
      const auto until = Clock::now() + 20s;
      while (!slots.has_sleeper()) {
        RANK_CHECK(Clock::now() < until, "rank 0 never slept in the barrier");
        std::this_thread::yield();
      }
    }
    Context ctx{*r.transport, 1, within(30s)};
    collectives::slot_all_reduce(ctx, slots, &in, &out, 1, DType::Int64, ReduceOp{});
    RANK_CHECK(out == 3, "got {}", out);
    if (rank == 0) RANK_CHECK(slots.sleeps() >= 1, "rank 0 never slept ({})", slots.sleeps());
  });
}

TEST_CASE("killing a rank fails the others' slot barrier with PeerLost naming it within 5 s",
          "[shm][slots][faults][multiproc]") {
  TempDir dir;
  auto results = run_ranks(3, [&](int rank) {
    SlotRank r = connect_slots(dir.file("store"), rank, 3);
    int64_t in = rank, out = -1;
    Context first{*r.transport, 1, within(30s)};
    collectives::slot_all_reduce(first, r.slots(), &in, &out, 1, DType::Int64, ReduceOp{});
    RANK_CHECK(out == 3);
    if (rank == 2) ::kill(::getpid(), SIGKILL);
    const auto start = Clock::now();
    Context second{*r.transport, 2, within(30s)};
    Error e = expect_error([&] {
      collectives::slot_all_reduce(second, r.slots(), &in, &out, 1, DType::Int64, ReduceOp{});
    });
    const auto took = Clock::now() - start;
    RANK_CHECK(e.code() == ErrorCode::PeerLost, "got {}", e.what());
    RANK_CHECK(std::string(e.what()).find("rank 2") != std::string::npos, "{}", e.what());
    RANK_CHECK(took < 5s, "PeerLost took {} ms", took / 1ms);
    // Stay until the other survivor has seen it too: a rank that exits looks lost as well.
    r.store->set(fmt::format("test/seen/{}", rank), Bytes{'1'});
    r.store->wait({"test/seen/0", "test/seen/1"}, 30s);
  });
  INFO(describe_failures(results));
  REQUIRE(results[0].exit_code == 0);
  REQUIRE(results[1].exit_code == 0);
  REQUIRE(results[2].signal == SIGKILL);
}

TEST_CASE("a slot barrier past its deadline throws Timeout naming the ranks that had not arrived",
          "[shm][slots][faults][multiproc]") {
  TempDir dir;
  run_ranks_ok(3, [&](int rank) {
    SlotRank r = connect_slots(dir.file("store"), rank, 3);
    if (rank == 2) {
      // Alive but absent: waits until the others have timed out, then leaves.
      r.store->wait({"test/timed-out/0", "test/timed-out/1"}, 30s);
      return;
    }
    int64_t in = rank, out = -1;
    Context ctx{*r.transport, 1, within(300ms)};
    Error e = expect_error([&] {
      collectives::slot_all_reduce(ctx, r.slots(), &in, &out, 1, DType::Int64, ReduceOp{});
    });
    const std::string what = e.what();
    RANK_CHECK(e.code() == ErrorCode::Timeout, "got {}", what);
    RANK_CHECK(what.find("slot barrier: rank 2 had not arrived") != std::string::npos, "{}", what);
    RANK_CHECK(what.starts_with(fmt::format("rank {}/3 group \"world\" shm slots", rank)), "{}",
               what);
    r.store->set(fmt::format("test/timed-out/{}", rank), Bytes{'1'});
  });
}

TEST_CASE("abort from another thread ends a slot barrier with Aborted; a peer sees PeerLost",
          "[shm][slots][faults][multiproc]") {
  TempDir dir;
  run_ranks_ok(3, [&](int rank) {
    SlotRank r = connect_slots(dir.file("store"), rank, 3);
    if (rank == 2) {
      r.store->wait({"test/failed/0", "test/failed/1"}, 30s);
      return;
    }
    int64_t in = rank, out = -1;
    Context ctx{*r.transport, 1, within(30s)};
    const auto start = Clock::now();
    std::thread aborter;
    if (rank == 0) aborter = std::thread([&] { r.transport->abort("test abort"); });
    Error e = expect_error([&] {
      collectives::slot_all_reduce(ctx, r.slots(), &in, &out, 1, DType::Int64, ReduceOp{});
    });
    if (aborter.joinable()) aborter.join();
    if (rank == 0) {
      RANK_CHECK(e.code() == ErrorCode::Aborted, "got {}", e.what());
    } else {
      RANK_CHECK(e.code() == ErrorCode::PeerLost, "got {}", e.what());
      RANK_CHECK(std::string(e.what()).find("rank 0") != std::string::npos, "{}", e.what());
    }
    RANK_CHECK(Clock::now() - start < 5s);
    r.store->set(fmt::format("test/failed/{}", rank), Bytes{'1'});
  });
}

TEST_CASE("ranks running different slot collectives fail with Desync naming the other's call",
          "[shm][slots][faults][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    SlotRank r = connect_slots(dir.file("store"), rank, 2);
    std::vector<int64_t> in(8, rank), out(16, -1);
    Context ctx{*r.transport, 1, within(30s)};
    Error e = expect_error([&] {
      if (rank == 0) {
        collectives::slot_all_reduce(ctx, r.slots(), in.data(), out.data(), 4, DType::Int64,
                                     ReduceOp{});
      } else {
        collectives::slot_all_gather(ctx, r.slots(), in.data(), out.data(), 8, DType::Int64);
      }
    });
    const std::string what = e.what();
    RANK_CHECK(e.code() == ErrorCode::Desync, "got {}", what);
    RANK_CHECK(what.find(rank == 0 ? "rank 1 runs all_gather #1 (64 bytes of int64) but this rank "
                                     "runs all_reduce #1 (32 bytes of int64)"
                                   : "rank 0 runs all_reduce #1 (32 bytes of int64) but this rank "
                                     "runs all_gather #1 (64 bytes of int64)") != std::string::npos,
               "{}", what);
    // Both ranks passed the barrier: the slots stay in step for the next collective.
    Context next{*r.transport, 2, within(30s)};
    int64_t a = rank + 10, b = 0;
    collectives::slot_all_reduce(next, r.slots(), &a, &b, 1, DType::Int64, ReduceOp{});
    RANK_CHECK(b == 21, "got {}", b);
  });
}

TEST_CASE("ranks that disagree about the slot size fail set-up with InvalidArgument",
          "[shm][slots][faults][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    Error e =
        expect_error([&] { connect_slots(dir.file("store"), rank, 2, rank == 0 ? 16384 : 4096); });
    const std::string what = e.what();
    RANK_CHECK(e.code() == ErrorCode::InvalidArgument, "got {}", what);
    RANK_CHECK(what.find("WEFT_SHM_SLOT_BYTES") != std::string::npos, "{}", what);
  });
}

TEST_CASE("slot_bytes 0 offers no shared slots", "[shm][slots][multiproc]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    SlotRank r = connect_slots(dir.file("store"), rank, 2, 0);
    RANK_CHECK(r.transport->shared_slots() == nullptr);
  });
}

}  // namespace
}  // namespace weft::tcp::test
