// backends/tcp/shm_symmetric_memory.h: symmetric buffers (collectives/symmetric_memory.h) over
// the shared-memory transport, one mapping per host holding the blocks of that host's ranks.
//
// In a group on one host, the *host's ranks* are the whole group; in one that spans hosts, each
// host's ranks (the group's ranks that share its /dev/shm, Options::nodes) allocate their own
// mapping alike, and its *leader* is the lowest of them (rank 0 below means the leader).
//
// Allocation (collective, one store round trip per host, one more across hosts): rank 0 creates
// one ShmSegment (shm_segment.h: reserved, mapped and pre-faulted once) holding the header, the
// slots and every local rank's block, formats the header and sets "<key_prefix>/<n>/<leader>" to
// its name (n: the group's allocation number); every other local rank opens and pre-faults it,
// checks the header and sets "<key_prefix>/<n>/<leader>/opened/<r>"; once all have, rank 0
// unlinks the name, so nothing is left in /dev/shm even if the job dies later, and the memory
// goes when the last rank unmaps it. A rank that cannot create or open it writes "! <its error>"
// instead, so that the others fail at once with Error(Io), not at their timeout. Across hosts,
// every leader then sets "<key_prefix>/<n>/ready/<leader>" ("1", or "! <error>" when its host
// failed) and every rank waits for every host's: the allocation fails on every rank (Io naming
// the host's leader) when it failed on one host, so no host goes on with a buffer the others
// lack. Names are "/weft-<job tag>-<group id>s<n>-<pid>-r<leader>" (shm_job_prefix()): the
// "-<pid>-r<rank>" end lets a launcher remove what a rank killed during allocation leaves
// (remove_orphan_segments()), as for the transport's segments.
//
// Barriers sleep on the transport's doorbells and learn of dead peers from its control sockets
// (ShmTransport::wait_beside), so abort() and a peer's death wake them as they wake the rings.
//
// Thread safety: allocate() from any thread (the group serialises it); wake_peers() and
// wait_until() on the progress thread. Ownership: the transport it is given must outlive it;
// regions outlive it (each holds its own mapping).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/store.h"

#include "backends/tcp/shm_transport.h"
#include "collectives/symmetric_memory.h"

namespace weft::tcp {

class ShmSymmetricMemory final : public collectives::SymmetricMemory {
 public:
  struct Options {
    std::string group_name = "world";
    std::string key_prefix = "weft/sym";  // unique per group in its store
    uint64_t group_id = 0;                // goes into segment names
    // Each rank's host: the lowest rank sharing its memory (RoutedTransport's nodes). Empty: every
    // rank on this host.
    std::vector<int> nodes;
  };

  // `shm`: the transport to every peer on this host; null only when there is none.
  ShmSymmetricMemory(Store& store, int rank, int size, ShmTransport* shm, Options options);

  std::shared_ptr<collectives::SymmetricRegion> allocate(
      size_t bytes, collectives::Clock::time_point deadline) override;
  // One mapping for the group's ranks on this host; null when the group spans hosts.
  std::shared_ptr<collectives::SymmetricRegion> allocate_bounce(
      size_t bytes, collectives::Clock::time_point deadline) override;
  bool reads_peers() const override;
  void read_peer(int peer, void* to, const void* address, size_t bytes) override;
  bool ranks_fit_cores() const override { return shm_ != nullptr && !shm_->crowded(); }
  void wake_peers() override;
  bool wait_until(const std::function<bool()>& ready,
                  collectives::Clock::time_point deadline) override;

 private:
  Error error(ErrorCode code, const std::string& detail) const;
  // The values of `keys`, waiting at most until `deadline`; `beside`: waiting on the transport's
  // doorbell with its liveness checks (progress thread only: the bounce region), else in the
  // store alone (allocate(), on any thread).
  std::vector<Bytes> get_all(const std::vector<std::string>& keys,
                             collectives::Clock::time_point deadline, bool beside);
  // allocate()'s work for region `id`: the program's (`bounce` false: its own store keys and
  // segment name by id, found by find()) or the bounce region (keys and name of its own).
  std::shared_ptr<collectives::SymmetricRegion> make_region(size_t bytes,
                                                            collectives::Clock::time_point deadline,
                                                            uint64_t id, bool bounce);

  Store& store_;
  const int rank_;
  const int size_;
  ShmTransport* const shm_;
  const Options options_;
  std::vector<int> local_;    // the group ranks on this host, ascending (this rank among them)
  std::vector<int> leaders_;  // the lowest rank of every host, ascending
  std::atomic<uint64_t> allocations_{0};
};

}  // namespace weft::tcp
