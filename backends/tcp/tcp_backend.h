// backends/tcp/tcp_backend.h: "tcp", weft's default CPU backend (Gloo's role in c10d).
//
// One TcpBackend serves one process group. It connects the group's ranks with a RoutedTransport
// (shared-memory rings between ranks on one host, TCP between hosts; WEFT_SHM=0 forces TCP) and
// runs each posted Collective on its ProgressThread, one at a time in issue order, with the
// algorithm the planner picks (or WEFT_ALGO forces) from collectives/.
//
// Failure: the first collective that fails with PeerLost, Timeout or Protocol breaks the backend:
// it records which rank was lost in the group's store (key "failure", first writer wins), aborts
// its transport so that every peer blocked on this rank learns at once instead of at its own
// timeout, and fails every later collective at once with the same error. A rank that learns of
// the failure second-hand (its peer hung up because *it* broke) reads the record and names the
// rank that was really lost. A dead process closes its sockets, so the first PeerLost comes
// within the transport's liveness interval (50 ms slices), not at the timeout.
//
// Thread safety: post() and abort() from any thread (the group serialises posts); everything else
// runs on the progress thread.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "weft/backend.h"

#include "backends/tcp/routed_transport.h"
#include "collectives/planner.h"
#include "collectives/scratch_pool.h"
#include "runtime/progress_thread.h"

namespace weft::tcp {

class TcpBackend final : public Backend {
 public:
  // Connects the group (collective over its ranks). Throws what RoutedTransport::connect throws.
  static std::unique_ptr<TcpBackend> create(const BackendOptions& options);
  ~TcpBackend() override;

  std::string_view name() const override { return "tcp"; }
  std::shared_ptr<Work> post(Collective collective, ErrorContext context) override;
  std::shared_ptr<Work> post_coalesced(std::vector<Collective> collectives,
                                       ErrorContext context) override;
  void abort(const std::string& reason) override;

  // The slowest link of this rank to any peer (what the planner plans by).
  collectives::Link slowest_link() const { return slowest_link_; }

  TcpBackend(const BackendOptions& options, std::unique_ptr<RoutedTransport> transport);

 private:
  // Runs one collective on the progress thread; throws weft::Error.
  void run(const Collective& collective, const ErrorContext& context);
  // Runs `body` against the group's deadline and gives what it throws the context: rank, group,
  // op, #seq; a PeerLost, Timeout or Protocol error breaks the group.
  void guarded(const ErrorContext& context,
               const std::function<void(collectives::Clock::time_point)>& body);
  void run_unchecked(const Collective& collective, collectives::Clock::time_point deadline);
  // Posts a Send or Recv on the transport, tagged apart from the collectives' tags.
  collectives::Request post_p2p(const Collective& collective);
  // After a failure: record it, abort the transport, remember it for later collectives.
  void break_group(const ErrorContext& context, std::exception_ptr error);
  // The message a second-hand PeerLost should carry, naming the first lost rank when known.
  std::string failure_record();

  const BackendOptions options_;
  std::unique_ptr<RoutedTransport> transport_;
  collectives::Link slowest_link_ = collectives::Link::Self;
  std::string algo_;                  // forced algorithm name ("" or "auto": the planner chooses)
  collectives::ScratchPool scratch_;  // progress thread only
  std::exception_ptr broken_;         // progress thread only: the error that broke the group
  std::mutex abort_mutex_;
  std::string abort_reason_;  // guarded by abort_mutex_; what abort() was called with

  // Last: the thread uses everything above; its destructor drains and joins first.
  std::unique_ptr<ProgressThread> thread_;
};

}  // namespace weft::tcp
