// backends/common/transport_backend.h: a Backend over any connected collectives::Transport.
//
// What every backend whose collectives run as point-to-point messages needs, written once: a
// backend built on it (the TCP backend today, a UCX backend next) connects its Transport and
// gives it a name; nothing else.
//
// - Dispatch: each posted Collective runs on the group's ProgressThread, one at a time in issue
//   order, with the algorithm the planner picks (or WEFT_ALGO / the "algo" setting forces) from
//   collectives/ (collective_dispatch.h). Send and Recv go straight to the transport.
// - Deferred start and caller runs: collectives moving at most kDeferBytes start deferred, so a
//   caller that waits for one runs it on its own thread without waking the progress thread.
// - Coalescing: post_coalesced() runs its collectives in order, and posts each run of sends and
//   receives all at once before waiting for them, so ranks may order them as they like.
// - Group failure: the first collective that fails with PeerLost, Timeout or Protocol breaks the
//   group: the failure is recorded in the group's store (group_failure.h), the transport is
//   aborted so that every peer blocked on this rank learns at once, and every later collective
//   fails at once with the same error. A PeerLost learned second-hand names the first failure;
//   a collective's Timeout first names the members that did not time out with this rank.
//   A dead process closes its connections, so the first PeerLost comes within the transport's
//   liveness interval, not at the timeout.
// - Symmetric buffers: a collective whose tensors lie in the transport's symmetric buffers runs
//   zero-copy (symmetric_dispatch.h), under the same deadline and failure policy.
// - Errors leave with the collective's context in front: rank, group, op, #seq.
//
// Cost: one virtual call into the Transport per message, as the algorithms always made; the
// backend adds nothing per message or chunk.
//
// Thread safety: post() and abort() from any thread (the group serialises posts); everything else
// runs on the progress thread or on a caller running a task in its place.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "weft/backend.h"

#include "backends/common/collective_dispatch.h"
#include "backends/common/group_failure.h"
#include "backends/common/symmetric_dispatch.h"
#include "collectives/scratch_pool.h"
#include "collectives/transport.h"
#include "runtime/progress_thread.h"

namespace weft::backends {

class TransportBackend final : public Backend {
 public:
  // `name` is the backend's ("tcp"): what name() returns and errors say. `transport` is
  // connected over options.size ranks, this one being options.rank.
  TransportBackend(std::string name, const BackendOptions& options,
                   std::unique_ptr<collectives::Transport> transport);
  ~TransportBackend() override;

  std::string_view name() const override { return name_; }
  std::shared_ptr<Work> post(Collective collective, ErrorContext context) override;
  std::shared_ptr<Work> post_coalesced(std::vector<Collective> collectives,
                                       ErrorContext context) override;
  void abort(const std::string& reason) override;
  // Over the transport's symmetric memory (transport.h); Error(Unsupported) saying why when it
  // has none (a peer on another host, shared memory off).
  std::shared_ptr<SymmetricBuffer> allocate_symmetric(size_t bytes,
                                                      const ErrorContext& context) override;
  bool supports_recv_any() const override { return transport_ && transport_->supports_recv_any(); }

 private:
  // Runs one collective on the progress thread, zero-copy when `zero_copy` (its plan) is given;
  // throws weft::Error.
  void run(const Collective& collective, const ErrorContext& context,
           const SymmetricPlan* zero_copy = nullptr);
  // Runs `body` against the group's deadline and gives what it throws the context: rank, group,
  // op, #seq; a PeerLost, Timeout or Protocol error breaks the group. A Timeout of a symmetric
  // collective (`symmetric`: all_reduce, all_gather, reduce_scatter, all_to_all, barrier, whose
  // ring and pairwise algorithms keep every member waiting to the end for data that passed
  // through every other; not a rooted one, where the root or a leaf often finishes first, nor
  // sends and receives) names the members that did not time out with this rank
  // (GroupFailure::silent_members()) as the likely cause: a heuristic, since a tree algorithm's
  // member whose part was done early is named too.
  void guarded(const ErrorContext& context, bool symmetric,
               const std::function<void(collectives::Clock::time_point)>& body);
  // Whether `c` runs bounced (collectives/symmetric.h, bounce_*): an all_reduce, or a
  // reduce_scatter or all_gather of equal blocks, whose input is at least kBounceBytes (for
  // all_gather: this rank's block), on a group of one host
  // with symmetric memory, no other algorithm forced. Every rank decides alike (the call and the
  // group's layout are the same everywhere).
  bool runs_bounced(const Collective& c) const;
  // Runs `c` bounced, allocating the group's bounce region at its first use.
  // A failed allocation breaks the group (a peer may have mapped it and wait in its barrier).
  void run_bounced(const Collective& c, const collectives::Context& ctx,
                   const ErrorContext& context);
  // After a failure: record it, abort the transport, remember it for later collectives.
  void break_group(const ErrorContext& context, std::exception_ptr error);

  const std::string name_;
  const BackendOptions options_;
  std::unique_ptr<collectives::Transport> transport_;
  DispatchPlan plan_;
  GroupFailure failure_;
  collectives::ScratchPool scratch_;  // progress thread only
  std::exception_ptr broken_;         // progress thread only: the error that broke the group
  // Progress thread only: the bounce region, made by the first bounced collective.
  std::shared_ptr<collectives::SymmetricRegion> bounce_;
  std::mutex abort_mutex_;
  std::string abort_reason_;  // guarded by abort_mutex_; what abort() was called with

  // Last: the thread uses everything above; its destructor drains and joins first.
  std::unique_ptr<ProgressThread> thread_;
};

}  // namespace weft::backends
