// runtime/trace_dump.h: writing the flight recorders out, and the thread that serves a job's
// requests for them (docs/flight-recorder.md).
//
// A TraceWorld belongs to one world group (one init_process_group) and to every group made from
// it: it makes their FlightRecorders, writes them as one JSON file per rank
// (WEFT_TRACE_DIR/weft-trace-rank<R>.json), and runs one low-rate thread that
//   - answers dump requests found in the world's store (another rank timed out, or weft-trace
//     --store asked), polling a counter every WEFT_TRACE_POLL;
//   - after this rank's own Timeout, posts such a request so that every rank keeps its view;
//   - dumps on SIGUSR1;
//   - is the watchdog: an operation running (or waiting to start) well past its group's
//     timeout means the thread that should end it is stuck; it says so and dumps.
// The thread never touches a group's progress thread: a stuck one cannot stop it.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "weft/error.h"
#include "weft/store.h"

#include "runtime/flight_recorder.h"

namespace weft::trace {

class TraceWorld : public std::enable_shared_from_this<TraceWorld> {
 public:
  // nullptr when WEFT_TRACE_BUFFER is 0. `store`: the world's store (its trace keys live there
  // unprefixed); `rank`, `size`: this process in the world.
  static std::shared_ptr<TraceWorld> create(std::shared_ptr<Store> store, int rank, int size);
  // Stops the thread (at most one store call in flight, bounded by a short timeout) and joins it.
  ~TraceWorld();

  TraceWorld(const TraceWorld&) = delete;
  TraceWorld& operator=(const TraceWorld&) = delete;

  // A recorder for a new group of this world, kept in its dumps while the group lives.
  std::shared_ptr<FlightRecorder> make_recorder(FlightRecorder::GroupInfo info);

  // Writes this rank's dump file now; returns its path ("" if it could not be written, which is
  // logged, or when no group of the world is left to dump).
  std::string dump(const std::string& reason);
  // The dump's JSON text (docs/flight-recorder.md).
  std::string dump_json(const std::string& reason);

  // A group of this world saw its first Timeout, PeerLost or Desync: dump now, on the calling
  // thread (before the caller learns of the failure and perhaps exits); after a Timeout or a
  // Desync also ask every rank of the job to dump (done by the thread: the store may be slow or
  // gone). The first such request of a job is the only one: later failures are its echoes.
  void on_failure(ErrorCode code, const std::string& message);

  int rank() const { return rank_; }

 private:
  TraceWorld(std::shared_ptr<Store> store, int rank, int size);
  void loop();
  // Agrees on the job id (first call), posts this rank's job-wide request if one is pending, and
  // answers the requests posted since the last call. Throws what the store throws.
  void serve_store(Store& store, bool& ready);
  void watchdog();
  // Whether any group of this world still lives.
  bool has_groups();
  // Asks every rank of the job to dump (mode "file"), unless another rank already did.
  void post_request(Store& store, const std::string& request);

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const uint64_t signals_at_start_;  // SIGUSR1s before this world: not for it

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::weak_ptr<FlightRecorder>> recorders_;  // guarded by mutex_
  std::string job_;                                       // guarded by mutex_
  std::vector<std::string> reasons_;   // guarded by mutex_; earlier dumps' reasons, oldest first
  std::string pending_request_;        // guarded by mutex_; a job-wide request to post
  std::shared_ptr<Store> poll_store_;  // guarded by mutex_; the thread's store, once it has it
  std::vector<int64_t> own_requests_;  // guarded by mutex_; requests this rank posted
  bool stopping_ = false;              // guarded by mutex_
  int64_t seen_ = 0;                   // the thread's only: the last request answered

  std::thread thread_;  // last: uses everything above
};

// Dumps every world of the process (SIGUSR1, weft::dump_trace()); returns the files written.
std::vector<std::string> dump_all(const std::string& reason);

}  // namespace weft::trace
