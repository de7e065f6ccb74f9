// ScratchPool: leases alive together never share bytes, freed memory is reused without growing,
// growth is geometric, alignment, zero bytes, reserve, moves; detail::Scratch with and without a
// pool; and collectives run twice through one pool per rank map its memory only once.
#include "collectives/scratch_pool.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/context.h"
#include "collectives/recursive_doubling.h"
#include "collectives/ring.h"
#include "tests/collectives/harness.h"

namespace weft::test {
namespace {

using collectives::Context;
using collectives::ScratchPool;

constexpr size_t kMiB = size_t{1} << 20;

bool disjoint(const ScratchPool::Lease& a, const ScratchPool::Lease& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data());
  const auto b0 = reinterpret_cast<uintptr_t>(b.data());
  return a0 + a.size() <= b0 || b0 + b.size() <= a0;
}

// Fills the lease with a byte pattern that depends on `seed` and the offset.
void fill(const ScratchPool::Lease& lease, int seed) {
  for (size_t i = 0; i < lease.size(); ++i) {
    lease.data()[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(seed) * 7) & 0xFF);
  }
}

// The first offset where fill(lease, seed)'s pattern is gone, or lease.size().
size_t first_changed(const ScratchPool::Lease& lease, int seed) {
  for (size_t i = 0; i < lease.size(); ++i) {
    if (lease.data()[i] !=
        static_cast<std::byte>((i * 131 + static_cast<size_t>(seed) * 7) & 0xFF)) {
      return i;
    }
  }
  return lease.size();
}

TEST_CASE("leases alive at once never share a byte and each is writable end to end",
          "[collectives][scratch_pool]") {
  ScratchPool pool;
  const size_t sizes[] = {1, 100, 4096, 5000, 3 * kMiB + 17, 64};
  std::vector<ScratchPool::Lease> leases;
  for (size_t bytes : sizes) leases.push_back(pool.get(bytes));
  CHECK(pool.leases() == std::size(sizes));
  for (size_t i = 0; i < leases.size(); ++i) {
    REQUIRE(leases[i].data() != nullptr);
    CHECK(leases[i].size() == sizes[i]);
    CHECK(leases[i].span().size() == sizes[i]);
    fill(leases[i], static_cast<int>(i));
  }
  for (size_t i = 0; i < leases.size(); ++i) {
    INFO("lease " << i << " of " << sizes[i] << " bytes");
    CHECK(first_changed(leases[i], static_cast<int>(i)) == sizes[i]);
    for (size_t j = i + 1; j < leases.size(); ++j) {
      INFO("and lease " << j);
      CHECK(disjoint(leases[i], leases[j]));
    }
  }
  leases.clear();
  CHECK(pool.leases() == 0);
}

TEST_CASE("a lease that fits a free slab reuses its memory without growing the pool",
          "[collectives][scratch_pool]") {
  ScratchPool pool;
  std::byte* first = nullptr;
  {
    const ScratchPool::Lease lease = pool.get(kMiB);
    first = lease.data();
    std::memset(lease.data(), 0x5A, lease.size());
  }
  CHECK(pool.growths() == 1);
  const size_t capacity = pool.capacity();
  CHECK(capacity >= kMiB);
  for (size_t bytes : {kMiB, kMiB / 2, size_t{1}, kMiB}) {
    const ScratchPool::Lease lease = pool.get(bytes);
    INFO(bytes << " bytes");
    CHECK(lease.data() == first);
    CHECK(pool.growths() == 1);
    CHECK(pool.capacity() == capacity);
  }
}

TEST_CASE("two leases at once take two slabs, and the same pattern again maps nothing",
          "[collectives][scratch_pool]") {
  ScratchPool pool;
  std::byte* small = nullptr;
  std::byte* large = nullptr;
  for (int call = 0; call < 3; ++call) {
    const ScratchPool::Lease a = pool.get(64 * 1024);
    const ScratchPool::Lease b = pool.get(3 * kMiB);
    CHECK(disjoint(a, b));
    if (call == 0) {
      small = a.data();
      large = b.data();
    }
    INFO("call " << call);
    CHECK(a.data() == small);  // smallest free slab that fits, not the large one
    CHECK(b.data() == large);
    CHECK(pool.growths() == 2);
  }
}

TEST_CASE(
    "a larger request regrows the free slab at least twofold, so creeping sizes regrow rarely",
    "[collectives][scratch_pool]") {
  ScratchPool pool;
  (void)pool.get(kMiB);
  const size_t before = pool.capacity();
  {
    const ScratchPool::Lease lease = pool.get(before + 1);
    CHECK(pool.growths() == 2);
    CHECK(pool.capacity() >= 2 * before);  // replaced, not added: one slab
    fill(lease, 3);
    CHECK(first_changed(lease, 3) == lease.size());
  }
  // 64 KiB more each call up to 8 MiB: 128 sizes, a handful of growths.
  ScratchPool creeping;
  size_t capacity = 0;
  for (size_t bytes = 64 * 1024; bytes <= 8 * kMiB; bytes += 64 * 1024) {
    const ScratchPool::Lease lease = creeping.get(bytes);
    CHECK(creeping.capacity() >= capacity);  // never shrinks
    capacity = creeping.capacity();
  }
  CHECK(creeping.growths() <= 8);  // log2(8 MiB / 64 KiB) + 1
  CHECK(creeping.capacity() >= 8 * kMiB);
}

TEST_CASE("lease memory is aligned to at least 64 bytes", "[collectives][scratch_pool]") {
  ScratchPool pool;
  std::vector<ScratchPool::Lease> leases;
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{65}, size_t{4097}, 2 * kMiB + 1}) {
    leases.push_back(pool.get(bytes));
    INFO(bytes << " bytes");
    CHECK(reinterpret_cast<uintptr_t>(leases.back().data()) % 64 == 0);
  }
  for (ScratchPool* scratch : {&pool, static_cast<ScratchPool*>(nullptr)}) {
    collectives::LocalFabric fabric(1);
    const Context ctx{.transport = fabric.transport(0), .scratch = scratch};
    const collectives::detail::Scratch buffer(ctx, 100);
    INFO((scratch != nullptr ? "from the pool" : "without a pool"));
    CHECK(reinterpret_cast<uintptr_t>(buffer.data()) % 64 == 0);
  }
}

TEST_CASE("a lease of zero bytes is empty and takes nothing from the pool",
          "[collectives][scratch_pool]") {
  ScratchPool pool;
  const ScratchPool::Lease lease = pool.get(0);
  CHECK(lease.data() == nullptr);
  CHECK(lease.size() == 0);
  CHECK(lease.span().empty());
  CHECK(pool.growths() == 0);
  CHECK(pool.capacity() == 0);
  CHECK(pool.leases() == 0);
  collectives::LocalFabric fabric(1);
  for (ScratchPool* scratch : {&pool, static_cast<ScratchPool*>(nullptr)}) {
    const collectives::detail::Scratch buffer(
        {.transport = fabric.transport(0), .scratch = scratch}, 0);
    CHECK(buffer.data() == nullptr);
    CHECK(buffer.size() == 0);
  }
  CHECK(pool.growths() == 0);
}

TEST_CASE("reserve maps once up front so that a later lease of that size maps nothing",
          "[collectives][scratch_pool]") {
  ScratchPool pool;
  pool.reserve(3 * kMiB);
  CHECK(pool.growths() == 1);
  CHECK(pool.capacity() >= 3 * kMiB);
  pool.reserve(kMiB);  // already covered
  pool.reserve(3 * kMiB);
  CHECK(pool.growths() == 1);
  const ScratchPool::Lease lease = pool.get(3 * kMiB);
  CHECK(pool.growths() == 1);
  fill(lease, 9);
  CHECK(first_changed(lease, 9) == lease.size());
}

TEST_CASE("a moved lease keeps its slab, and reassigning a lease releases the old one",
          "[collectives][scratch_pool]") {
  ScratchPool pool;
  ScratchPool::Lease a = pool.get(1000);
  std::byte* data = a.data();
  ScratchPool::Lease b = std::move(a);
  CHECK(a.data() == nullptr);  // a moved-from lease is specified to be empty
  CHECK(a.size() == 0);
  CHECK(b.data() == data);
  CHECK(b.size() == 1000);
  CHECK(pool.leases() == 1);
  b = pool.get(2000);  // the first slab is busy until the assignment, so a second one is mapped
  CHECK(pool.leases() == 1);
  CHECK(pool.growths() == 2);
  b = ScratchPool::Lease();
  CHECK(pool.leases() == 0);
}

TEST_CASE("detail::Scratch leases from ctx.scratch while alive and allocates without a pool",
          "[collectives][scratch_pool]") {
  ScratchPool pool;
  collectives::LocalFabric fabric(1);
  {
    const collectives::detail::Scratch scratch({.transport = fabric.transport(0), .scratch = &pool},
                                               5000);
    CHECK(pool.leases() == 1);
    CHECK(scratch.size() == 5000);
    std::memset(scratch.data(), 0xA5, scratch.size());
  }
  CHECK(pool.leases() == 0);
  CHECK(pool.growths() == 1);
  const collectives::detail::Scratch own({.transport = fabric.transport(0)}, 5000);
  REQUIRE(own.data() != nullptr);
  std::memset(own.data(), 0xA5, own.size());
  CHECK(pool.growths() == 1);
}

// 4 MiB per rank: large enough that a per-call allocation would be an mmap of its own.
TEST_CASE(
    "collectives of several MiB run twice through one pool per rank map its memory once: "
    "ring all_reduce needs none, ring reduce_scatter and recursive doubling share one slab",
    "[collectives][scratch_pool][all_reduce][reduce_scatter]") {
  constexpr int kRanks = 4;  // a power of two: every rank of recursive doubling uses scratch
  constexpr size_t kCount = 4 * kMiB / sizeof(float);
  std::vector<size_t> growths(kRanks * 3, 99);
  const auto failures = run_world(kRanks, 0, [&](Transport& transport, int rank, Failures& f) {
    ScratchPool pool;
    uint64_t seq = 0;
    auto ctx = [&] {
      return Context{
          .transport = transport, .seq = ++seq, .deadline = test_deadline(), .scratch = &pool};
    };
    // Element i of rank r's input is r + 1 + (i % 7): its sum over ranks is exact in float.
    auto input = [&](size_t count) {
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + 1 + i % 7);
      return data;
    };
    auto want = [&](size_t i) { return static_cast<float>(10 + kRanks * (i % 7)); };  // 1+2+3+4
    auto check = [&](const char* what, const std::vector<float>& got, size_t first) {
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != want(first + i)) {
          f.add(fmt::format("rank {} {}: element {}: got {} want {}", rank, what, first + i, got[i],
                            want(first + i)));
          return;
        }
      }
    };
    for (int call = 0; call < 2; ++call) {
      std::vector<float> data = input(kCount);
      collectives::ring_all_reduce(ctx(), data.data(), data.data(), kCount, DType::Float32,
                                   ReduceOp::Sum);
      check("ring all_reduce", data, 0);
    }
    growths[rank * 3] = pool.growths();
    for (int call = 0; call < 2; ++call) {
      const std::vector<float> data = input(kCount);
      std::vector<float> block(kCount / kRanks);
      collectives::ring_reduce_scatter(ctx(), data.data(), block.data(), kCount / kRanks,
                                       DType::Float32, ReduceOp::Sum);
      check("ring reduce_scatter", block, rank * (kCount / kRanks));
    }
    growths[rank * 3 + 1] = pool.growths();
    for (int call = 0; call < 2; ++call) {
      const std::vector<float> data = input(kCount);
      std::vector<float> out(kCount);
      collectives::recursive_doubling_all_reduce(ctx(), data.data(), out.data(), kCount,
                                                 DType::Float32, ReduceOp::Sum);
      check("recursive doubling all_reduce", out, 0);
    }
    growths[rank * 3 + 2] = pool.growths();
  });
  for (const std::string& failure : failures) UNSCOPED_INFO(failure);
  CHECK(failures.empty());
  for (int rank = 0; rank < kRanks; ++rank) {
    INFO("rank " << rank);
    CHECK(growths[rank * 3] == 0);
    CHECK(growths[rank * 3 + 1] == 1);
    CHECK(growths[rank * 3 + 2] == 1);
  }
}

}  // namespace
}  // namespace weft::test
