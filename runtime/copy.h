// runtime/copy.h: the large local copies collectives make whose destination nothing reads next (a
// rank's own block into an all_gather's or gather's output).
//
// A copy much larger than the caches gains nothing from leaving its destination in them: it is
// evicted before anyone reads it, and each of its cache lines was first read from memory only to
// be overwritten (the store's "read for ownership"). Such copies use non-temporal stores, which
// write around the caches: 16 GB/s instead of memcpy's 10-11 GB/s for 8 MiB here (AMD EPYC VM),
// which is what an out-of-place all_gather's local copy costs while the transfers need the same
// memory bus. Smaller copies are memcpy, which keeps their destination hot for what follows; so
// is any copy whose destination is read next (a working buffer), whatever its size.
#pragma once

#include <cstddef>

namespace weft {

// From this many bytes in one copy (the whole copy, when it goes in pieces) the destination is
// written around the caches: well past a core's L2 and a fair share of a shared L3.
inline constexpr size_t kStreamingCopyBytes = size_t{4} << 20;

// Copies `bytes` from `src` to `dst` (no overlap; memcpy's contract). `whole` is the size of the
// copy this one is a piece of (or `bytes`): from kStreamingCopyBytes on, non-temporal stores
// where the CPU has them (x86-64's SSE2), memcpy otherwise.
void copy_bytes(void* dst, const void* src, size_t bytes, size_t whole);
inline void copy_bytes(void* dst, const void* src, size_t bytes) {
  copy_bytes(dst, src, bytes, bytes);
}

}  // namespace weft
