// backends/common/host_memory_transport.h: a Transport whose messages go through one transport
// and whose memory shared between the ranks of a host comes from another.
//
// weft's collectives between ranks of one host run fastest over memory those ranks map in
// common: shared slots for small collectives (collectives/shared_slots.h), the bounce region and
// symmetric buffers for large ones (collectives/symmetric_memory.h). A message transport that
// has no such memory of its own (UCX: its shared memory is inside UCX) gets it by being paired
// here with one that has (the TCP backend's routed transport with shared memory on), as UCC
// pairs its point-to-point layer with a shared-memory one for the ranks of a node:
//
// - send, recv, recv_any, recv_reduce, wait, test, link: the message transport's, always. Every
//   message of every algorithm, the inter-host phases of hierarchical collectives included, goes
//   through it.
// - symmetric_memory, shared_slots, node_of: the host transport's. Its own messages carry
//   nothing; it lends its mappings, the doorbells their barriers sleep on, and the liveness
//   checks that make a dead local peer PeerLost in a barrier.
// - abort: both.
//
// The host transport must connect the same ranks (same rank, same size). It is built and owned
// by the backend that pairs them (backends/ucx/ucx_backend.cc); nothing here knows either.
//
// The host transport's waits carry none of the message transport's traffic, yet a peer may be
// held in a send to this rank until the message transport takes the message in: the backend
// that pairs them has the host transport's waits drive the message transport's progress
// (ShmTransport::Options::progress_beside).
//
// Thread safety and ownership: as transport.h; owns both transports, and destroys the host
// transport first (its waits may call into the message transport).
#pragma once

#include <memory>
#include <string>

#include "collectives/transport.h"

namespace weft::backends {

class HostMemoryTransport final : public collectives::Transport {
 public:
  // REQUIRES: both non-null, connected as the same rank of the same size.
  HostMemoryTransport(std::unique_ptr<collectives::Transport> messages,
                      std::unique_ptr<collectives::Transport> host);
  ~HostMemoryTransport() override;

  int rank() const override { return messages_->rank(); }
  int size() const override { return messages_->size(); }
  collectives::Link link(int peer) const override { return messages_->link(peer); }
  int node_of(int r) const override { return host_->node_of(r); }

  collectives::Request send(int peer, const void* data, size_t bytes,
                            collectives::Tag tag) override {
    return messages_->send(peer, data, bytes, tag);
  }
  collectives::Request recv(int peer, void* data, size_t bytes, collectives::Tag tag) override {
    return messages_->recv(peer, data, bytes, tag);
  }
  collectives::Request recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                                   collectives::Tag tag) override {
    return messages_->recv_reduce(peer, dst, count, dtype, op, tag);
  }
  collectives::Request recv_any(void* data, size_t bytes, collectives::Tag tag,
                                int* source) override {
    return messages_->recv_any(data, bytes, tag, source);
  }
  bool supports_recv_any() const override { return messages_->supports_recv_any(); }
  void wait(collectives::Request request, collectives::Clock::time_point deadline) override {
    messages_->wait(request, deadline);
  }
  bool test(collectives::Request request) override { return messages_->test(request); }
  void abort(const std::string& reason) override;

  collectives::SymmetricMemory* symmetric_memory() override { return host_->symmetric_memory(); }
  std::string why_no_symmetric_memory() const override { return host_->why_no_symmetric_memory(); }
  collectives::SharedSlots* shared_slots() override { return host_->shared_slots(); }

 private:
  std::unique_ptr<collectives::Transport> messages_;
  std::unique_ptr<collectives::Transport> host_;  // declared last: destroyed first
};

}  // namespace weft::backends
