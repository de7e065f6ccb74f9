// collectives/scratch_pool.h: the scratch memory of one process group, mapped once and reused by
// every collective the group runs (DESIGN.md: scratch is "allocated once per group, touched up
// front, and reused across calls (a pool), never per collective").
//
// Why: a fresh buffer pays the kernel's first-touch cost on every page (a fault and a zeroing
// per 4 KiB), and glibc hands blocks above its mmap threshold (32 MiB at most) back to the
// kernel on free, so a per-call std::vector of 64 MiB pays it again on every call. Measured on
// the 2-core development VM (Firecracker, kernel 6.18, shared): faulting 64 MiB in takes 25-39 ms
// when the machine is quiet, and a one-rank 64 MiB ring reduce_scatter (a 64 MiB scratch copy,
// no traffic) took a median 55-150 ms per call with a per-call vector and 14-46 ms with a pool.
// Memory that stays mapped and faulted in costs nothing after the first call.
//
//   ScratchPool pool;                                    // one per group, on its progress thread
//   ScratchPool::Lease work = pool.get(bytes);           // work.data()[0, bytes) is ours
//   ...                                                  // back to the pool when `work` dies
//
// Algorithms do not call get() themselves: detail::Scratch (context.h) leases from ctx.scratch
// and falls back to a plain allocation when the group has no pool.
//
// How: the pool is a few slabs, each one anonymous private mapping that serves one lease at a
// time. get() hands out the smallest free slab that fits; when none does, it grows: the largest
// free slab is replaced by one at least twice its size (never less than asked), or, when every
// slab is leased, a slab of the size asked is added. So a group whose algorithms need at most k
// buffers at once ends with k slabs, and a workload of repeating sizes stops growing after its
// first call; growth is geometric, so a slab regrows about log2(largest / smallest) times. The
// pool never shrinks: its memory stays mapped until it is destroyed.
//
// Every new slab is faulted in before get() returns (MADV_POPULATE_WRITE, or a write per page on
// kernels before 5.14), so no collective takes a page fault on pool memory. Slabs of 2 MiB and
// more are rounded to 2 MiB and marked MADV_HUGEPAGE: on that VM (THP "madvise") it halves the
// cost of populating (64 MiB: 13-16 ms instead of 25-39 ms), makes munmap 20x cheaper (0.2 ms
// instead of 4.8 ms) and spares the TLB; where THP is off the advice is ignored.
//
// Contents: a lease's bytes hold whatever an earlier lease left there (zero only when the slab is
// new). Alignment: data() is page-aligned (so at least 64, a cache line), except for a lease of
// zero bytes, whose data() is null and which takes no slab.
//
// Thread safety: none. A pool is used by one thread at a time (its group's progress thread);
// leases may be released only on that thread. Ownership: the pool owns its mappings; every lease
// must be released before the pool is destroyed (REQUIRES), and the destructor unmaps them.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace weft::collectives {

class ScratchPool {
 public:
  // One buffer of the pool: data()[0, size()) belongs to the holder until the lease is destroyed,
  // reassigned or moved from. Movable, not copyable; a default-constructed lease holds nothing.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }

    std::byte* data() const { return data_; }
    size_t size() const { return size_; }
    std::span<std::byte> span() const { return {data_, size_}; }

   private:
    friend class ScratchPool;
    Lease(ScratchPool* pool, size_t slab, std::byte* data, size_t size)
        : pool_(pool), slab_(slab), data_(data), size_(size) {}
    void release();

    ScratchPool* pool_ = nullptr;  // null: holds no slab (moved from, or zero bytes)
    size_t slab_ = 0;              // index into pool_->slabs_
    std::byte* data_ = nullptr;
    size_t size_ = 0;
  };

  ScratchPool() = default;
  // REQUIRES: no lease of this pool is alive.
  ~ScratchPool();
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // A buffer of `bytes` that no other live lease shares, growing the pool when no free slab is
  // large enough. Zero bytes: an empty lease (null data) that takes nothing. Throws Error(Io)
  // when the kernel refuses the mapping; the pool is then unchanged.
  Lease get(size_t bytes);

  // Grows the pool now, unless some slab already holds `bytes`, so that a later get(bytes) made
  // while no other lease is alive neither maps nor faults (pre-warming before the first
  // collective). Throws Error(Io) like get().
  void reserve(size_t bytes);

  // Bytes mapped, over all slabs. Never decreases while the pool lives.
  size_t capacity() const;
  // How many slabs were mapped so far (the number of times the pool grew).
  size_t growths() const { return growths_; }
  // How many leases are alive now.
  size_t leases() const;

 private:
  struct Slab {
    std::byte* base = nullptr;
    size_t bytes = 0;
    bool leased = false;
  };

  // The index of a free slab of at least `bytes`, after mapping one (see the file comment).
  size_t grow(size_t bytes);

  std::vector<Slab> slabs_;  // a handful (one per buffer an algorithm holds at once)
  size_t growths_ = 0;
};

}  // namespace weft::collectives
