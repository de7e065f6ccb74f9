// ShmRing: wraparound at every offset, streams between real processes (blocking on doorbells,
// with and without spinning), zero-copy production and consumption, and reduction straight from
// the ring.
#include "backends/tcp/shm_ring.h"

#include <array>
#include <cstring>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "runtime/reduce.h"
#include "tests/support/multiproc.h"
#include "tests/tcp_backend/shm_test_util.h"

namespace weft::tcp {
namespace {

using test::check_pattern;
using test::fill_pattern;
using test::ShmLayout;
using test::StreamEnd;
using test::unique_name;
using namespace std::chrono_literals;

// One segment for the single-process tests, formatted afresh by each LocalRing.
ShmSegment& scratch_segment() {
  static ShmSegment segment = ShmSegment::create(unique_name("local"), 64 << 10);
  return segment;
}

// A ring of `capacity`, advanced to stream position `offset` (empty there).
struct LocalRing {
  LocalRing(size_t capacity, uint64_t offset)
      : segment(scratch_segment()),
        ring(ShmRing::create(segment.data(), ShmRing::footprint(capacity), capacity)) {
    if (offset > 4 * capacity) {
      // Far positions (up to where the 64-bit counters wrap) are set directly, as if that many
      // bytes had passed, and a fresh view picks them up.
      auto* header = reinterpret_cast<detail::ShmRingHeader*>(segment.data());
      header->head.store(offset);
      header->tail.store(offset);
      ring = ShmRing::attach(segment.data(), ShmRing::footprint(capacity));
      return;
    }
    std::vector<std::byte> scratch(capacity);
    while (offset > 0) {
      size_t n = std::min<uint64_t>(offset, capacity);
      REQUIRE(ring.write_some(scratch.data(), n) == n);
      REQUIRE(ring.read_some(scratch.data(), n) == n);
      offset -= n;
    }
  }
  ShmSegment& segment;
  ShmRing ring;
};

// Writes `size` pattern bytes at stream position `offset` with write_some and reads them back
// with read_some, checking sizes and every byte.
void copy_round_trip(size_t capacity, uint64_t offset, size_t size) {
  INFO("capacity " << capacity << ", offset " << offset << ", size " << size);
  LocalRing local(capacity, offset);
  ShmRing& ring = local.ring;
  std::vector<std::byte> in(size), out(size + 1);
  fill_pattern(0, offset, in);
  REQUIRE(ring.write_some(in.data(), size) == size);
  REQUIRE(ring.readable_bytes() == size);
  REQUIRE(ring.writable_bytes() == capacity - size);
  REQUIRE(ring.readable().size() == std::min<size_t>(size, capacity - offset % capacity));
  REQUIRE(ring.read_some(out.data(), size + 1) == size);
  check_pattern(0, offset, std::span(out).first(size));
  REQUIRE(ring.readable_bytes() == 0);
  REQUIRE(ring.readable().empty());
}

// The same through writable()/commit() and readable()/consume(), in the contiguous pieces the
// ring hands out.
void span_round_trip(size_t capacity, uint64_t offset, size_t size) {
  INFO("capacity " << capacity << ", offset " << offset << ", size " << size);
  LocalRing local(capacity, offset);
  ShmRing& ring = local.ring;
  size_t written = 0;
  for (int piece = 0; written < size; ++piece) {
    REQUIRE(piece < 2);  // free space is at most two pieces: up to the end, then from the start
    std::span<std::byte> space = ring.writable();
    REQUIRE(space.size() == (piece == 0 ? capacity - offset % capacity : capacity - written));
    size_t n = std::min(space.size(), size - written);
    fill_pattern(0, offset + written, space.first(n));
    ring.commit(n);
    written += n;
  }
  size_t read = 0;
  for (int piece = 0; read < size; ++piece) {
    REQUIRE(piece < 2);
    std::span<const std::byte> data = ring.readable();
    REQUIRE(data.size() == std::min(size - read, capacity - (offset + read) % capacity));
    check_pattern(0, offset + read, data);
    ring.consume(data.size());
    read += data.size();
  }
  REQUIRE(ring.readable().empty());
  REQUIRE(ring.writable_bytes() == capacity);
}

TEST_CASE("every size from 1 to capacity round-trips at every start offset of a 64-byte ring",
          "[shm][ring]") {
  for (uint64_t offset = 0; offset < 64; ++offset) {
    for (size_t size = 1; size <= 64; ++size) {
      copy_round_trip(64, offset, size);
      span_round_trip(64, offset, size);
    }
  }
}

TEST_CASE(
    "sizes around the wrap round-trip at each offset class of a 4 KiB ring, up to where "
    "the 64-bit counters wrap",
    "[shm][ring]") {
  const size_t c = 4096;
  for (uint64_t offset : {0ul, 1ul, 7ul, 8ul, 63ul, 64ul, 65ul, 2047ul, 2048ul, 4095ul, 4096ul,
                          (1ul << 32) + 3, ~0ul - 4095, ~0ul - 100, ~0ul}) {
    for (size_t size : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{64}, c - 1, c}) {
      copy_round_trip(c, offset, size);
      span_round_trip(c, offset, size);
    }
    uint64_t to_end = c - offset % c;
    for (size_t size : {to_end - 1, to_end, to_end + 1}) {
      if (size == 0 || size > c) continue;
      copy_round_trip(c, offset, size);
      span_round_trip(c, offset, size);
    }
  }
}

TEST_CASE("a full ring takes no more bytes until the reader frees some", "[shm][ring]") {
  LocalRing local(64, 10);
  ShmRing& ring = local.ring;
  std::array<std::byte, 100> bytes{};
  fill_pattern(3, 10, bytes);
  REQUIRE(ring.write_some(bytes.data(), 100) == 64);  // copies what fits
  REQUIRE(ring.write_some(bytes.data() + 64, 36) == 0);
  REQUIRE(ring.writable().empty());
  REQUIRE(ring.writable_bytes() == 0);
  std::array<std::byte, 5> out{};
  REQUIRE(ring.read_some(out.data(), 5) == 5);
  check_pattern(3, 10, out);
  REQUIRE(ring.writable_bytes() == 5);
  REQUIRE(ring.write_some(bytes.data() + 64, 36) == 5);
}

TEST_CASE("a corrupted head is refused as Protocol rather than read past the data", "[shm][ring]") {
  LocalRing local(64, 0);
  auto* header = reinterpret_cast<detail::ShmRingHeader*>(local.segment.data());
  header->head.store(65);  // more than the capacity above tail 0
  ShmRing reader = ShmRing::attach(local.segment.data(), ShmRing::footprint(64));
  CHECK_THROWS_MATCHES(reader.readable(), Error, Catch::Predicate<Error>([](const Error& e) {
                         return e.code() == ErrorCode::Protocol;
                       }));
  header->head.store(0);
  header->tail.store(1);  // tail above head
  ShmRing writer = ShmRing::attach(local.segment.data(), ShmRing::footprint(64));
  CHECK_THROWS_AS(writer.writable_bytes(), Error);
}

TEST_CASE("attach refuses memory that holds no ring, and create refuses bad capacities",
          "[shm][ring]") {
  ShmSegment segment = ShmSegment::create(unique_name("bad"), 8192);
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode{0};
  };
  CHECK(code_of([&] { ShmRing::attach(segment.data(), segment.size()); }) == ErrorCode::Protocol);
  CHECK(code_of([&] { ShmRing::create(segment.data(), segment.size(), 100); }) ==
        ErrorCode::InvalidArgument);
  CHECK(code_of([&] { ShmRing::create(segment.data(), segment.size(), 32); }) ==
        ErrorCode::InvalidArgument);
  CHECK(code_of([&] { ShmRing::create(segment.data(), segment.size(), 8192); }) ==
        ErrorCode::InvalidArgument);  // the header does not fit as well
  CHECK(code_of([&] { ShmRing::create(segment.data() + 64, 4096, 1024); }) ==
        ErrorCode::InvalidArgument);  // misaligned
}

// Two processes: rank 0 streams `total` pattern bytes in random-sized writes, rank 1 checks
// them in random-sized reads; each blocks on its doorbell when it cannot progress.
void stream_between_two_processes(uint64_t total, size_t capacity, size_t max_piece,
                                  std::chrono::nanoseconds spin) {
  ShmLayout layout{.bells = 2, .rings = 1, .capacity = capacity};
  std::string name = unique_name("stream");
  ShmSegment segment = layout.create(name);
  weft::test::run_ranks_ok(
      2,
      [&](int rank) {
        ShmSegment mapped = ShmSegment::open(name, layout.bytes());
        ShmRing ring = layout.ring(mapped, 0);
        Doorbell mine = layout.bell(mapped, rank);
        Doorbell peer = layout.bell(mapped, 1 - rank);
        std::mt19937_64 rng(1234 + rank);
        StreamEnd end{.ring = &ring, .peer = &peer, .stream = 7, .total = total};
        auto deadline = test::Clock::now() + 40s;
        if (rank == 0) {
          test::pump(&end, nullptr, mine, rng, max_piece, spin, deadline);
        } else {
          test::pump(nullptr, &end, mine, rng, max_piece, spin, deadline);
          RANK_CHECK(ring.readable_bytes() == 0);
        }
      },
      60s);
}

TEST_CASE("64 MiB of random-sized writes through a 1 MiB ring arrive intact, always blocking",
          "[shm][ring][multiproc]") {
  stream_between_two_processes(64 << 20, 1 << 20, 2 << 20, 0ns);
}

TEST_CASE("64 MiB of random-sized writes through a 1 MiB ring arrive intact, spinning first",
          "[shm][ring][multiproc]") {
  stream_between_two_processes(64 << 20, 1 << 20, 2 << 20, 50us);
}

TEST_CASE("small pieces through a 4 KiB ring arrive intact, always blocking",
          "[shm][ring][multiproc]") {
  stream_between_two_processes(4 << 20, 4096, 700, 0ns);
}

TEST_CASE(
    "a producer building data in writable() and a consumer checking it in readable() "
    "need no copies",
    "[shm][ring][multiproc]") {
  const uint64_t total = 16 << 20;
  ShmLayout layout{.bells = 2, .rings = 1, .capacity = 64 << 10};
  std::string name = unique_name("zerocopy");
  ShmSegment segment = layout.create(name);
  weft::test::run_ranks_ok(2, [&](int rank) {
    ShmSegment mapped = ShmSegment::open(name, layout.bytes());
    ShmRing ring = layout.ring(mapped, 0);
    Doorbell mine = layout.bell(mapped, rank);
    mine.set_slice(std::chrono::hours(1));  // a lost wake-up fails at the deadline
    Doorbell peer = layout.bell(mapped, 1 - rank);
    std::mt19937_64 rng(99 + rank);
    auto deadline = test::Clock::now() + 30s;
    uint64_t done = 0;
    while (done < total) {
      if (rank == 0) {
        std::span<std::byte> space = ring.writable();
        if (space.empty()) {
          RANK_CHECK(mine.wait([&] { return ring.writable_bytes() > 0; }, deadline, 0ns));
          continue;
        }
        size_t n =
            std::min<uint64_t>({space.size(), test::random_size(rng, 32 << 10), total - done});
        fill_pattern(5, done, space.first(n));  // built in place: no staging buffer
        ring.commit(n);
        done += n;
      } else {
        std::span<const std::byte> data = ring.readable();
        if (data.empty()) {
          RANK_CHECK(mine.wait([&] { return ring.readable_bytes() > 0; }, deadline, 0ns));
          continue;
        }
        size_t n = std::min(data.size(), test::random_size(rng, 32 << 10));
        check_pattern(5, done, data.first(n));
        ring.consume(n);
        done += n;
      }
      peer.ring();
    }
  });
}

// Float inputs as functions of the index, so each process computes the reference alone.
float input(int who, size_t i) {
  return static_cast<float>(static_cast<int64_t>(test::splitmix64(who * 1000003 + i) >> 40) -
                            (1 << 23)) /
         4096.0f;
}

TEST_CASE("a receiver reduces float32 straight from the ring into its output",
          "[shm][ring][multiproc]") {
  const size_t count = (1 << 20) + 13;  // not a multiple of anything the ring uses
  ShmLayout layout{.bells = 2, .rings = 1, .capacity = 64 << 10};
  std::string name = unique_name("reduce");
  ShmSegment segment = layout.create(name);
  for (ReduceOp op : {ReduceOp(ReduceOp::Sum), ReduceOp(ReduceOp::Max)}) {
    INFO("op " << reduce_op_name(op));
    weft::test::run_ranks_ok(2, [&](int rank) {
      ShmSegment mapped = ShmSegment::open(name, layout.bytes());
      ShmRing ring = layout.ring(mapped, 0);
      Doorbell mine = layout.bell(mapped, rank);
      mine.set_slice(std::chrono::hours(1));  // a lost wake-up fails at the deadline
      Doorbell peer = layout.bell(mapped, 1 - rank);
      std::mt19937_64 rng(7 + rank);
      auto deadline = test::Clock::now() + 30s;
      std::vector<float> mine_values(count);
      for (size_t i = 0; i < count; ++i) mine_values[i] = input(rank, i);
      size_t done = 0;  // elements
      while (done < count) {
        bool progressed = false;
        if (rank == 0) {
          // Whole elements in random numbers, as the transport's sender does.
          size_t n = std::min(test::random_size(rng, 20000), count - done);
          size_t wrote = ring.write_some(mine_values.data() + done, n * sizeof(float));
          RANK_CHECK(wrote % sizeof(float) == 0, "wrote {} bytes", wrote);
          done += wrote / sizeof(float);
          progressed = wrote > 0;
        } else {
          std::span<const std::byte> data = ring.readable();
          RANK_CHECK(data.size() % sizeof(float) == 0, "span of {} bytes", data.size());
          size_t n = data.size() / sizeof(float);
          reduce::accumulate(mine_values.data() + done, data.data(), n, DType::Float32, op);
          ring.consume(data.size());
          done += n;
          progressed = n > 0;
        }
        if (progressed) {
          peer.ring();
        } else if (rank == 0) {
          RANK_CHECK(mine.wait([&] { return ring.writable_bytes() > 0; }, deadline, 0ns));
        } else {
          RANK_CHECK(mine.wait([&] { return ring.readable_bytes() > 0; }, deadline, 0ns));
        }
      }
      if (rank == 1) {
        for (size_t i = 0; i < count; ++i) {
          float a = input(0, i), b = input(1, i);
          float want = op == ReduceOp::Sum ? b + a : std::max(a, b);
          RANK_CHECK(std::memcmp(&mine_values[i], &want, sizeof(float)) == 0,
                     "element {}: got {}, want {} ({} {} {})", i, mine_values[i], want, b,
                     reduce_op_name(op), a);
        }
      }
    });
  }
}

TEST_CASE("four processes streaming around a ring on two cores, all blocking, finish quickly",
          "[shm][ring][multiproc]") {
  const int ranks = 4;
  const uint64_t total = 16 << 20;
  ShmLayout layout{.bells = ranks, .rings = ranks, .capacity = 256 << 10};
  std::string name = unique_name("four");
  ShmSegment segment = layout.create(name);
  auto start = test::Clock::now();
  weft::test::run_ranks_ok(
      ranks,
      [&](int rank) {
        ShmSegment mapped = ShmSegment::open(name, layout.bytes());
        int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
        // Ring r carries rank r's stream to rank r + 1.
        ShmRing out = layout.ring(mapped, rank);
        ShmRing in = layout.ring(mapped, prev);
        Doorbell mine = layout.bell(mapped, rank);
        Doorbell next_bell = layout.bell(mapped, next), prev_bell = layout.bell(mapped, prev);
        std::mt19937_64 rng(rank);
        StreamEnd send{.ring = &out, .peer = &next_bell, .stream = uint64_t(rank), .total = total};
        StreamEnd recv{.ring = &in, .peer = &prev_bell, .stream = uint64_t(prev), .total = total};
        test::pump(&send, &recv, mine, rng, 512 << 10, 0ns, test::Clock::now() + 20s);
      },
      30s);
  auto seconds = std::chrono::duration<double>(test::Clock::now() - start).count();
  // Each rank moves 32 MiB (16 out, 16 in, generated and checked byte by byte): about 1 s of
  // CPU in all on two cores. pump() sleeps in hour-long slices, so a lost wake-up fails it at its
  // deadline; the time is reported, not asserted (under TSan it is 8x longer).
  WARN("four ranks, 16 MiB each around the ring: " << seconds << " s");
}

}  // namespace
}  // namespace weft::tcp
