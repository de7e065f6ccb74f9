// tests/tcp_backend/shm_test_util.h: what the shared-memory tests have in common: unique
// segment names, a byte pattern defined by stream position, a segment laid out as doorbells
// followed by rings, and a pump that streams the pattern through rings with blocking waits.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/tcp/doorbell.h"
#include "backends/tcp/shm_ring.h"
#include "backends/tcp/shm_segment.h"
#include "tests/support/multiproc.h"

namespace weft::tcp::test {

using Clock = std::chrono::steady_clock;

// A name no other test process on the host uses: pid and a counter.
inline std::string unique_name(const std::string& what) {
  static std::atomic<int> counter{0};
  return fmt::format("/weft-test-{}-{}-{}", ::getpid(), counter.fetch_add(1), what);
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Byte `position` of stream `stream`: pseudo-random, and a function of the position alone, so
// the receiver checks every byte without the sender's help.
inline uint8_t pattern_byte(uint64_t stream, uint64_t position) {
  return static_cast<uint8_t>(splitmix64((stream << 56) ^ (position >> 3)) >> (8 * (position & 7)));
}

inline void fill_pattern(uint64_t stream, uint64_t position, std::span<std::byte> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>(pattern_byte(stream, position + i));
  }
}

// Throws (RANK_CHECK) naming the first byte that differs from the pattern.
inline void check_pattern(uint64_t stream, uint64_t position, std::span<const std::byte> in) {
  for (size_t i = 0; i < in.size(); ++i) {
    uint8_t want = pattern_byte(stream, position + i);
    uint8_t got = static_cast<uint8_t>(in[i]);
    RANK_CHECK(got == want, "stream {} byte {}: got {:#04x}, want {:#04x}", stream, position + i,
               got, want);
  }
}

// One segment: `bells` doorbells, then `rings` rings of `capacity` bytes each.
struct ShmLayout {
  int bells = 0;
  int rings = 0;
  size_t capacity = 0;

  static size_t align(size_t n) { return (n + 4095) / 4096 * 4096; }
  size_t bell_offset(int i) const { return static_cast<size_t>(i) * Doorbell::kFootprint; }
  size_t ring_offset(int j) const {
    return align(bells * Doorbell::kFootprint) + j * align(ShmRing::footprint(capacity));
  }
  size_t bytes() const { return ring_offset(rings); }

  // Creates the segment and formats everything in it (before any peer opens it).
  ShmSegment create(const std::string& name) const {
    ShmSegment segment = ShmSegment::create(name, bytes());
    for (int i = 0; i < bells; ++i) Doorbell::create(segment.data() + bell_offset(i));
    for (int j = 0; j < rings; ++j) {
      ShmRing::create(segment.data() + ring_offset(j), ShmRing::footprint(capacity), capacity);
    }
    return segment;
  }
  Doorbell bell(const ShmSegment& segment, int i) const {
    return Doorbell::attach(segment.data() + bell_offset(i));
  }
  ShmRing ring(const ShmSegment& segment, int j) const {
    return ShmRing::attach(segment.data() + ring_offset(j), ShmRing::footprint(capacity));
  }
};

// Random sizes from 1 to max, log-uniform, so that tiny and huge pieces both come up often.
inline size_t random_size(std::mt19937_64& rng, size_t max) {
  std::uniform_real_distribution<double> exponent(0.0, std::log2(static_cast<double>(max)));
  size_t n = static_cast<size_t>(std::exp2(exponent(rng)));
  return std::clamp<size_t>(n, 1, max);
}

// One side of a pattern stream: what is still to go, and where the peer's doorbell is.
struct StreamEnd {
  ShmRing* ring = nullptr;
  Doorbell* peer = nullptr;  // rung after each write (wakes the reader) or read (the writer)
  uint64_t stream = 0;
  uint64_t total = 0;
  uint64_t done = 0;
};

// Streams the pattern through `send` and checks it from `recv` (either may be null) with
// write_some/read_some of random sizes up to max_piece, waiting on `mine` whenever neither can
// progress. Throws at the deadline.
inline void pump(StreamEnd* send, StreamEnd* recv, Doorbell& mine, std::mt19937_64& rng,
                 size_t max_piece, std::chrono::nanoseconds spin, Clock::time_point deadline) {
  std::vector<std::byte> out(max_piece), in(max_piece);
  // Slices longer than the test: a lost wake-up then fails it at the deadline instead of
  // costing one 50 ms slice unnoticed.
  mine.set_slice(std::chrono::hours(1));
  auto sending = [&] { return send != nullptr && send->done < send->total; };
  auto receiving = [&] { return recv != nullptr && recv->done < recv->total; };
  while (sending() || receiving()) {
    bool progressed = false;
    if (sending()) {
      size_t n = std::min<uint64_t>(random_size(rng, max_piece), send->total - send->done);
      fill_pattern(send->stream, send->done, std::span(out).first(n));
      size_t wrote = send->ring->write_some(out.data(), n);
      if (wrote > 0) {
        send->done += wrote;
        send->peer->ring();
        progressed = true;
      }
    }
    if (receiving()) {
      size_t n = std::min<uint64_t>(random_size(rng, max_piece), recv->total - recv->done);
      size_t got = recv->ring->read_some(in.data(), n);
      if (got > 0) {
        check_pattern(recv->stream, recv->done, std::span(in).first(got));
        recv->done += got;
        recv->peer->ring();
        progressed = true;
      }
    }
    if (progressed) continue;
    bool ready = mine.wait(
        [&] {
          return (sending() && send->ring->writable_bytes() > 0) ||
                 (receiving() && recv->ring->readable_bytes() > 0);
        },
        deadline, spin);
    RANK_CHECK(ready, "deadline passed: sent {}/{}, received {}/{}", send ? send->done : 0,
               send ? send->total : 0, recv ? recv->done : 0, recv ? recv->total : 0);
  }
}

}  // namespace weft::tcp::test
