// collectives/local_transport.h: an in-process Transport whose ranks are threads of one process.
//
// A LocalFabric connects `size` ranks; fabric.transport(r) is rank r's Transport. It serves the
// algorithm tests (each rank a thread) and a process group of one rank, which needs no network.
// It implements transport.h's contract exactly, including the parts a lenient fake would skip:
//
//   Matching   per (source, destination, tag), sends and receives match in posting order; a send
//              whose receive is not posted yet waits in the fabric ("unexpected message").
//   Copies     data is copied, never shared: a receive gets its own bytes, so an algorithm that
//              aliases buffers wrongly reads wrong values in a test rather than right ones.
//   Buffering  a send of at most `eager_limit_bytes` is copied at once and completes at once; a
//              larger one stays borrowed and completes only when its receive copies out of the
//              sender's buffer. eager_limit_bytes = 0 makes every send synchronous, so a test
//              proves an algorithm does not depend on the transport buffering for it (it would
//              deadlock and time out otherwise), and that it leaves a send's buffer alone until
//              the send completes.
//   Reduction  recv_reduce combines with reduce::accumulate (Avg and PremulSum as Sum).
//   Sizes      a receive whose size differs from its send's fails with Error(Protocol), naming
//              both ranks, the tag and both sizes; the send fails too unless it had completed
//              (eager).
//   Waits      block on a condition variable until done or the deadline: past it, the request
//              is cancelled and wait throws Error(Timeout) naming the peer, the tag and the bytes.
//   Abort      transport(r).abort() fails rank r's pending and later waits with Error(Aborted),
//              and its peers' requests that involve rank r with Error(PeerLost), as a closed
//              connection would. Messages rank r sent before aborting can still be received.
//
// Thread safety: each LocalTransport is used by one thread (its rank), as transport.h requires;
// abort() may come from any thread. The fabric keeps all matching state under one mutex (tests
// run at most a few ranks, so one lock costs nothing and keeps matching obviously right).
// Ownership: the fabric owns its transports; it must outlive every thread that uses them.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "weft/error.h"

#include "collectives/transport.h"

namespace weft::collectives {

class LocalFabric;

class LocalTransport final : public Transport {
 public:
  int rank() const override { return rank_; }
  int size() const override;
  Link link(int peer) const override;

  Request send(int peer, const void* data, size_t bytes, Tag tag) override;
  Request recv(int peer, void* data, size_t bytes, Tag tag) override;
  Request recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                      Tag tag) override;
  void wait(Request request, Clock::time_point deadline) override;
  bool test(Request request) override;
  void abort(const std::string& reason) override;

 private:
  friend class LocalFabric;
  LocalTransport(LocalFabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}

  LocalFabric& fabric_;
  const int rank_;
};

class LocalFabric {
 public:
  static constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();

  // REQUIRES nothing: size < 1 throws Error(InvalidArgument).
  explicit LocalFabric(int size, size_t eager_limit_bytes = kUnlimited);
  ~LocalFabric();
  LocalFabric(const LocalFabric&) = delete;
  LocalFabric& operator=(const LocalFabric&) = delete;

  int size() const { return size_; }
  // Rank r's transport; Error(InvalidArgument) for a rank outside [0, size).
  LocalTransport& transport(int rank);

  // Aborts every rank (a test's way to stop all ranks after one failed).
  void abort_all(const std::string& reason);

 private:
  friend class LocalTransport;

  enum class Kind : uint8_t { Send, Recv, RecvReduce };

  // One posted, unmatched send or receive, waiting in its channel.
  struct Posted {
    uint64_t id = 0;                  // the request id on the rank that posted it
    const void* send_data = nullptr;  // rendezvous send: the caller's buffer
    std::vector<std::byte> eager{};   // eager send: our copy (the send has completed)
    bool is_eager = false;
    void* recv_data = nullptr;
    size_t bytes = 0;
    Kind kind = Kind::Send;
    size_t count = 0;  // RecvReduce only
    DType dtype = DType::Float32;
    ReduceOp op{};
  };
  // The unmatched sends and receives from one rank to another with one tag; at most one of the
  // two queues is non-empty (a post on one side matches the other's front first).
  struct Channel {
    std::deque<Posted> sends;
    std::deque<Posted> recvs;
  };
  using ChannelKey = std::tuple<int, int, Tag>;  // source, destination, tag

  // A request's outcome, kept until its rank waits for it.
  struct State {
    bool done = false;
    std::optional<ErrorCode> error{};
    std::string message{};
    Kind kind = Kind::Send;
    int peer = -1;
    Tag tag = 0;
    size_t bytes = 0;
  };

  Request post(int rank, int peer, Tag tag, Posted posted);
  // Copies or reduces a matched pair; fails both requests on a size mismatch. Holds mu_.
  void deliver(int source, int destination, Tag tag, Posted& send, Posted& recv);
  void complete(int rank, uint64_t id, std::optional<ErrorCode> error, std::string message);
  // Removes rank's request from its channel, if it still sits there. Holds mu_.
  void cancel(int rank, uint64_t id, const State& state);
  void wait(int rank, Request request, Clock::time_point deadline);
  bool test(int rank, Request request);
  void abort(int rank, const std::string& reason);
  void check_peer(int rank, int peer, const char* what) const;

  const int size_;
  const size_t eager_limit_bytes_;
  std::vector<std::unique_ptr<LocalTransport>> transports_;

  std::mutex mu_;
  // Guarded by mu_:
  std::map<ChannelKey, Channel> channels_;
  std::vector<std::unordered_map<uint64_t, State>> states_;  // per rank: request id -> state
  std::vector<uint64_t> next_id_;                            // per rank
  std::vector<std::optional<std::string>> aborted_;          // per rank: the abort reason
  // One per rank, signalled when one of its requests completes or it is aborted.
  std::unique_ptr<std::condition_variable[]> wakeups_;
};

}  // namespace weft::collectives
