// backends/tcp/routed_transport.h: the TCP backend's transport: shared memory to the peers on
// this host, TCP to the others, chosen per peer pair as NCCL does.
//
// RoutedTransport::connect() builds the TCP mesh (one connection per peer; tcp_mesh.h), then
// hands each peer's connection to the transport that will serve it: to a ShmTransport as the
// pair's control socket when the peer is on this host and WEFT_SHM is on, to a TcpTransport
// otherwise. link(peer) says which. Request ids carry their transport in the lowest bit.
//
// Progress. When all peers use one transport, wait() is that transport's wait: it blocks on the
// doorbell or in epoll_wait. In the mixed case both must progress while the caller waits for
// either, or two ranks could each wait for the other's bytes on the transport nobody drives.
// The compromise: wait() alternates a non-blocking pass of the TCP transport (test() on one of
// its pending requests) with a sleep of at most kMixedSlice on the shared-memory doorbell, so
// TCP traffic may see up to kMixedSlice of extra latency per wait while shared-memory requests
// are pending, and nothing spins. When only one side has pending requests, that side blocks
// fully.
//
// Thread safety and ownership: as transport.h; owns both transports.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weft/store.h"

#include "backends/tcp/shm_symmetric_memory.h"
#include "backends/tcp/shm_transport.h"
#include "backends/tcp/tcp_transport.h"
#include "collectives/transport.h"

namespace weft::tcp {

class RoutedTransport final : public collectives::Transport {
 public:
  // Longest sleep on the doorbell while TCP requests are pending too (see above).
  static constexpr std::chrono::microseconds kMixedSlice{500};

  struct Options {
    std::string group_name = "world";
    // Store keys: the mesh uses "<key_prefix>/<rank>", shared memory "<key_prefix>/shm/...".
    std::string key_prefix = "weft/tcp";
    // Bounds the setup. 0: config().timeout (WEFT_TIMEOUT).
    std::chrono::milliseconds timeout{0};
    // Whether peers on this host use shared memory. Unset: config().shm (WEFT_SHM, default 1).
    std::optional<bool> shm;
    // Overrides the host test (for tests that need both transports on one machine): shared
    // memory between a and b when it returns true. REQUIRES: symmetric, same on every rank.
    std::function<bool(int a, int b)> shm_between;
    // Connect only the ranks that share this rank's /dev/shm, and carry nothing to the others
    // (sending to them is InvalidArgument): the host side of host memory paired with a transport
    // that reaches every rank (backends/common/host_memory_transport.h). node_of() and symmetric
    // memory across hosts are as without it.
    bool local_only = false;
    TcpTransport::Options tcp;
    ShmTransport::Options shm_options;  // group_name, key_prefix and group_id are filled in
  };

  // Collective over the group: every rank calls it with the same size and key_prefix.
  static std::unique_ptr<RoutedTransport> connect(Store& store, int rank, int size,
                                                  Options options);

  // Either transport may be null when no peer uses it. nodes: each rank's node (node_of()), as
  // connect() finds them; empty: every rank its own.
  RoutedTransport(int rank, int size, std::unique_ptr<ShmTransport> shm,
                  std::unique_ptr<TcpTransport> tcp, std::vector<int> nodes = {});
  ~RoutedTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  collectives::Link link(int peer) const override;
  // Ranks that reach each other over shared memory share a node.
  int node_of(int r) const override;

  collectives::Request send(int peer, const void* data, size_t bytes,
                            collectives::Tag tag) override;
  collectives::Request recv(int peer, void* data, size_t bytes, collectives::Tag tag) override;
  // Over one transport (every peer on shared memory, or every peer over TCP) only: a receive
  // from any source over both would have to be withdrawn from one the moment the other matched.
  collectives::Request recv_any(void* data, size_t bytes, collectives::Tag tag,
                                int* source) override;
  bool supports_recv_any() const override { return !(shm_ && tcp_); }
  collectives::Request recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                                   collectives::Tag tag) override;
  void wait(collectives::Request request, collectives::Clock::time_point deadline) override;
  bool test(collectives::Request request) override;
  void abort(const std::string& reason) override;
  // Symmetric buffers: one mapping per host of that host's ranks, whenever shared memory is on.
  collectives::SymmetricMemory* symmetric_memory() override { return symmetric_.get(); }
  std::string why_no_symmetric_memory() const override { return no_symmetric_; }
  // The shared-memory transport's slots when it serves every peer (the group is on one host).
  collectives::SharedSlots* shared_slots() override {
    return shm_ && !tcp_ ? shm_->shared_slots() : nullptr;
  }

 private:
  enum Side : uint64_t { kTcp = 0, kShm = 1 };

  Transport& route(int peer, const char* what);
  collectives::Request wrap(Side side, collectives::Request inner);
  void forget(Side side, uint64_t inner);

  const int rank_;
  const int size_;
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<TcpTransport> tcp_;
  const std::vector<int> nodes_;
  // Inner ids posted and not yet waited for, per side: a handful, so vectors.
  std::vector<uint64_t> pending_[2];
  // After shm_, which it uses. Null when shared memory is off; then no_symmetric_ says why.
  std::unique_ptr<ShmSymmetricMemory> symmetric_;
  std::string no_symmetric_;
};

}  // namespace weft::tcp
