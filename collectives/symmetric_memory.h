// collectives/symmetric_memory.h: symmetric buffers as the zero-copy algorithms see them, and the
// capability a transport offers when its ranks share memory.
//
// A SymmetricRegion is one symmetric buffer (weft/symmetric_buffer.h): one mapping per host that
// holds a header page, then one block per rank of that host, each `stride` bytes apart:
//
//   [SymmetricHeader, then SymmetricSlot of rank 0, 1, ... (128 bytes each)] page-aligned
//   [block of rank 0][block of rank 1]...[block of rank P-1]                 each page-aligned
//
// Ranks and blocks here are the host's: in a group on one host, block r is group rank r's; in a
// group that spans hosts, the mapping holds the L ranks of this host only, block l being its l-th
// rank by group rank (members()), and the zero-copy algorithms run their inter-host phase over
// the transport (collectives/symmetric.h).
//
// Each rank's slot is written by that rank only and read by all: `arrived` counts the barriers it
// has entered on this region; the words before it describe the collective it runs (SymmetricCall),
// written before `arrived` is released, so that a peer which has seen the count also sees them.
// Slots are 128 bytes apart, as ShmRing's counters (shm_ring.h), so that two ranks' arrivals never
// share a cache line, nor an adjacent-line prefetch pair.
//
// Invariants:
//   1. Every rank of the group runs the same barriers on a region in the same order (the group's
//      collectives run in issue order on every rank), so the k-th barrier of every rank on a
//      region has epoch k, and a rank waits for slot[p].arrived >= k.
//   2. A slot's call words change only when its rank enters a collective's first barrier, which
//      it can do only after every rank left the previous collective's last barrier; so after a
//      rank sees slot[p].arrived >= k in a first barrier, p's call words stay put until it has
//      entered the next barrier too.
//   3. Block memory is written by a rank only between the first and last barrier of a collective,
//      in the parts the algorithm assigns to it (collectives/symmetric.h); the barrier's release
//      and acquire order those writes before the peers' reads.
//
// A SymmetricMemory is a transport's (transport.h, symmetric_memory()): it allocates regions
// collectively, wakes and waits for peers (on the transport's doorbells, checking liveness as the
// transport does) and finds the region a tensor lies in.
//
// Thread safety: regions and the registry may be used from any thread (the registry and each
// region's use count lock); barriers run on the group's progress thread only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "weft/symmetric_buffer.h"

#include "collectives/transport.h"

namespace weft::collectives {

// What a rank says it runs in a collective's first barrier; peers compare it with theirs.
struct SymmetricCall {
  uint64_t seq = 0;
  uint64_t shape = 0;   // kind, dtype, op and root, packed
  uint64_t factor = 0;  // PremulSum's factor, bit for bit
  uint64_t count = 0;
  uint64_t in_region = 0, in_offset = 0;
  uint64_t out_region = 0, out_offset = 0;
  bool operator==(const SymmetricCall&) const = default;
};

struct alignas(128) SymmetricSlot {
  SymmetricCall call;
  std::atomic<uint64_t> arrived;
};
static_assert(sizeof(SymmetricSlot) == 128);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct alignas(128) SymmetricHeader {
  uint64_t magic;
  uint64_t ranks;
  uint64_t block_bytes;
  uint64_t stride;
};

inline constexpr uint64_t kSymmetricMagic = 0x7765667473796d31;  // "weftsym1"

// The page-aligned layout of a region of `ranks` blocks of `bytes`.
struct SymmetricLayout {
  size_t header = 0;  // bytes before block 0
  size_t stride = 0;  // bytes from one block to the next
  size_t total = 0;   // the mapping's size
  static SymmetricLayout of(int ranks, size_t bytes);
};

class SymmetricRegion final : public SymmetricBuffer {
 public:
  // `mapping` keeps the memory mapped (destroying it unmaps); `base` is its start, laid out as
  // SymmetricLayout::of(size, bytes) with the header already formatted. `rank` and `size` are
  // the mapping's (this rank's block, the blocks); `members` the group rank of each block
  // (ascending; empty: block r is rank r, the whole group); `group_size` the group's (0: size).
  SymmetricRegion(std::shared_ptr<void> mapping, std::byte* base, int rank, int size, size_t bytes,
                  uint64_t id, std::string group, std::vector<int> members = {},
                  int group_size = 0);

  void* data() const override;
  size_t size() const override { return bytes_; }
  const std::string& group_name() const override { return group_; }
  uint64_t id() const override { return id_; }
  void release() override;

  // This rank's block and the number of blocks: the mapping's, not the group's.
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // The group rank of block `r` (for messages and for the group's layout).
  int member(int r) const { return members_.empty() ? r : members_[static_cast<size_t>(r)]; }
  int group_rank() const { return member(rank_); }
  int group_size() const { return group_size_; }
  // Whether some rank of the group is on another host (its block in another mapping).
  bool spans_hosts() const { return group_size_ > ranks_; }
  // Rank r's block as mapped in this process. REQUIRES: not released (the caller holds a Use).
  std::byte* block(int r) const { return base_ + layout_.header + layout_.stride * r; }
  SymmetricSlot& slot(int r) const;
  // Barriers this rank has entered on the region (progress thread only).
  uint64_t& epoch() { return epoch_; }
  // Chunks the bounce collectives have run on the region (progress thread only): chunk k uses
  // half k % 2 of every block (symmetric.h).
  uint64_t& chunks() { return chunks_; }

  // Holds the region mapped for one collective: release() refuses while any Use lives.
  class Use {
   public:
    Use(std::shared_ptr<SymmetricRegion> region, std::list<std::string>::iterator entry)
        : region_(std::move(region)), entry_(entry) {}
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    SymmetricRegion& region() const { return *region_; }

   private:
    std::shared_ptr<SymmetricRegion> region_;
    std::list<std::string>::iterator entry_;  // in region_->users_
  };
  // A Use of `self`, or null when it was released. The caller names the collective in `what`.
  static std::shared_ptr<Use> use(const std::shared_ptr<SymmetricRegion>& self, std::string what);

 private:
  // The users for an error message: the oldest few, then how many more. REQUIRES: mutex_ held.
  std::string users_text() const;

  const std::string group_;
  const uint64_t id_;
  const int rank_;
  const int ranks_;
  const std::vector<int> members_;
  const int group_size_;
  const size_t bytes_;
  const SymmetricLayout layout_;
  std::byte* const base_;
  uint64_t epoch_ = 0;
  uint64_t chunks_ = 0;
  mutable std::mutex mutex_;
  std::shared_ptr<void> mapping_;  // guarded by mutex_; null once released
  // Guarded by mutex_: the collectives holding a Use, oldest first. A list: thousands of queued
  // collectives may hold one each, and each Use removes its own entry in O(1) when it ends.
  std::list<std::string> users_;
};

class SymmetricMemory {
 public:
  virtual ~SymmetricMemory() = default;

  // Collective over the group (every rank calls it, in the same order with other allocations):
  // maps `bytes` per rank. Blocks at most until `deadline`. Throws Error(Io) when the memory
  // cannot be made (a full /dev/shm), Timeout, PeerLost.
  virtual std::shared_ptr<SymmetricRegion> allocate(size_t bytes, Clock::time_point deadline) = 0;

  // The id of the group's bounce region: no buffer of the program's has it.
  static constexpr uint64_t kBounceId = ~uint64_t{0};
  // Collective over the group (every rank calls it at the same collective, once per group, on
  // the progress thread): a region of `bytes` per rank that weft's own bounce collectives use
  // (symmetric.h, bounce_all_reduce), id kBounceId, apart from the program's buffers (their ids
  // and find() are unaffected, so it may run while the program allocates on another thread).
  // Null when this memory offers none (the default; a group spanning hosts). Throws as allocate().
  virtual std::shared_ptr<SymmetricRegion> allocate_bounce(size_t /*bytes*/,
                                                           Clock::time_point /*deadline*/) {
    return nullptr;
  }

  // Whether this rank can read every local peer's memory with read_peer() (cross-memory attach,
  // probed at setup). Ranks may differ: a collective that relies on it agrees first.
  virtual bool reads_peers() const { return false; }
  // Copies `bytes` at `address` in the memory of group rank `peer` (on this host) into `to`.
  // REQUIRES: reads_peers(). Throws Error(PeerLost) when the peer is gone, Error(Io) when the
  // kernel refuses.
  virtual void read_peer(int peer, void* to, const void* address, size_t bytes);
  // Whether this host's ranks of the group fit its cores (the same answer on every rank): a
  // kernel copy that holds a core for long pays only then (bounce_all_gather).
  virtual bool ranks_fit_cores() const { return false; }

  // Wakes every peer that may wait in wait_until() (after publishing an arrival).
  virtual void wake_peers() = 0;
  // Blocks until ready() returns true (true) or the deadline passes (false), sleeping in the
  // kernel between wake-ups (a bounded spin first only while the host's ranks fit its cores).
  // Throws Error(PeerLost) naming a peer found dead (checked at least every 50 ms), and
  // Error(Aborted) after the transport's abort().
  virtual bool wait_until(const std::function<bool()>& ready, Clock::time_point deadline) = 0;

  // The live region of this group holding [p, p + bytes), with the offset of p in its block.
  // Empty when none does; Error(InvalidArgument) when the range straddles a region's end.
  struct Found {
    std::shared_ptr<SymmetricRegion> region;
    size_t offset = 0;
  };
  Found find(const void* p, size_t bytes);
  // Whether this group ever allocated a region: when not, find() finds nothing, and a caller
  // that plans every collective skips its lock (a lock-free load).
  bool ever_allocated() const { return ever_allocated_.load(std::memory_order_acquire); }

 protected:
  // Adds a region allocate() made to what find() searches.
  void remember(const std::shared_ptr<SymmetricRegion>& region);

 private:
  std::mutex mutex_;
  std::vector<std::weak_ptr<SymmetricRegion>> regions_;  // guarded by mutex_
  std::atomic<bool> ever_allocated_{false};
};

}  // namespace weft::collectives
