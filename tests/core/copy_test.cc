// copy_bytes: the same bytes as memcpy at every size around the streaming threshold, for
// destinations and sources at every alignment, and nothing written outside the destination.
#include "runtime/copy.h"

#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

namespace {

// Bytes no copy produces: a write outside the destination shows.
constexpr uint8_t kGuard = 0xA5;

uint8_t pattern(size_t i) { return static_cast<uint8_t>((i * 131 + 7) % 251); }

void check_copy(size_t bytes, size_t whole, size_t dst_offset, size_t src_offset) {
  std::vector<uint8_t> src(bytes + src_offset + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(i);
  std::vector<uint8_t> dst(bytes + dst_offset + 128, kGuard);
  weft::copy_bytes(dst.data() + dst_offset, src.data() + src_offset, bytes, whole);
  size_t wrong = 0;
  for (size_t i = 0; i < dst.size(); ++i) {
    const bool inside = i >= dst_offset && i < dst_offset + bytes;
    const uint8_t expected = inside ? pattern(i - dst_offset + src_offset) : kGuard;
    if (dst[i] != expected) ++wrong;
  }
  INFO("bytes " << bytes << " whole " << whole << " dst+" << dst_offset << " src+" << src_offset);
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("copy_bytes copies exactly, below and above the streaming threshold") {
  const size_t big = weft::kStreamingCopyBytes;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{15}, size_t{255}, size_t{256}, size_t{257},
                       size_t{4096 + 63}, size_t{65536 + 17}}) {
    for (size_t dst_offset : {0, 1, 8, 15}) {
      for (size_t src_offset : {0, 3, 16}) {
        check_copy(bytes, bytes, dst_offset, src_offset);  // memcpy
        check_copy(bytes, big, dst_offset, src_offset);    // a piece of a large copy: streamed
      }
    }
  }
  // A whole large copy, streamed, with a tail that is not a multiple of 64.
  check_copy(big + 37, big + 37, 5, 9);
}
