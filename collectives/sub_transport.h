// collectives/sub_transport.h: some ranks of a Transport seen as a Transport of their own, so
// that an algorithm written for a whole group runs on a part of it (hierarchical.h runs the ring
// inside one node, and again between the nodes).
//
//   SubTransport node(ctx.transport, {0, 1}, /*step_offset=*/0);  // parent ranks 0 and 1
//   Context inner{node, ctx.seq, ctx.deadline, ctx.scratch};
//   ring_reduce_scatter(inner, ...);                               // a ring of two
//
// Rank i of the view is parent rank members[i]; the calling rank must be one of the members.
// Peers are translated on the way in, so the parent transport's errors name parent ranks (the
// ones the user knows). Tags keep their sequence number and fingerprint; step_offset is added to
// the step, so that two phases of one collective that pair the same ranks can run the same
// algorithm without their messages matching (pass phase_step(k); the inner algorithm must then
// use fewer than 4 - k phases of steps).
//
// Thread safety and ownership: as transport.h; the view borrows the parent, which must outlive
// it, and owns nothing. A request posted through the view is the parent's request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/transport.h"

namespace weft::collectives {

class SubTransport final : public Transport {
 public:
  // REQUIRES (else Error(InvalidArgument)): members are distinct ranks of parent and include
  // parent.rank().
  SubTransport(Transport& parent, std::vector<int> members, uint32_t step_offset);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  Link link(int peer) const override { return parent_.link(parent_rank(peer)); }
  int node_of(int r) const override { return parent_.node_of(parent_rank(r)); }

  Request send(int peer, const void* data, size_t bytes, Tag tag) override;
  Request recv(int peer, void* data, size_t bytes, Tag tag) override;
  Request recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                      Tag tag) override;
  void wait(Request request, Clock::time_point deadline) override {
    parent_.wait(request, deadline);
  }
  bool test(Request request) override { return parent_.test(request); }
  void abort(const std::string& reason) override { parent_.abort(reason); }

 private:
  int parent_rank(int peer) const;
  Tag shifted(Tag tag) const;

  Transport& parent_;
  const std::vector<int> members_;
  const uint32_t step_offset_;
  int rank_ = -1;
};

}  // namespace weft::collectives
