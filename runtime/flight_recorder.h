// runtime/flight_recorder.h: a group's flight recorder, the ring of its last operations.
//
// Every process group records each operation it issues: its arguments when the caller issues it
// (queued), when its backend starts it (started), what algorithm the backend chose, and how it
// ended (completed, or failed with its error), with a wall-clock timestamp for each transition.
// When something goes wrong, runtime/trace_dump.h writes the rings of every group of the process
// to one JSON file (docs/flight-recorder.md has the format), and weft-trace merges the files of a
// job to say which rank is behind and on what.
//
// Who writes what:
//   queued()          the group's submit path, under the group's mutex (one writer at a time)
//   started(),        the thread running the operation: the progress thread, or a caller that
//   note_algorithm()  runs it inline (one at a time per group: operations run in issue order)
//   finished()        the thread that completes the operation's Work
//   append_json(),    any thread (a dump, the watchdog), concurrently with all of the above
//   overdue()
//
// Cost: recording allocates nothing and takes no lock shared with the progress thread: each slot
// is a set of relaxed atomics written in place (a few stores per transition, on x86 plain moves),
// and the slot's id is published last with release order. A reader copies a slot and checks its
// id again afterwards; a slot overwritten meanwhile is skipped. Only a failure takes a lock, to
// keep its message (a string) beside the ring.
//
// Limits: an update of an operation whose slot was already reused (more than `capacity`
// operations issued while it was still pending) is dropped; the sequence numbers kept outside the
// ring (last queued, started, completed) stay exact.
//
// Thread safety: as above; every method may run concurrently with every other.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/backend.h"
#include "weft/error.h"

namespace weft {

class FlightRecorder {
 public:
  struct GroupInfo {
    std::string name;  // as the user named it: "world", "dp"
    std::string id;    // unique in the job, the same on every member (the group's store path)
    int rank = 0;
    int size = 1;
    std::vector<int> global_ranks;
    std::chrono::milliseconds timeout{300'000};  // the group's collective timeout
  };

  // Called (once per group) on the group's first Timeout, PeerLost or Desync, on the thread that
  // ends the operation, with the error: the process dumps its recorders then
  // (runtime/trace_dump.h).
  using FailureHook = std::function<void(ErrorCode code, const std::string& message)>;

  // REQUIRES: capacity > 0.
  FlightRecorder(GroupInfo info, size_t capacity, FailureHook on_failure = nullptr);
  ~FlightRecorder();

  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Records `c` as issued now by the calling thread and returns its id. `fingerprint`: the
  // desync check's hash of what every rank must agree on (runtime/desync_check.h).
  uint64_t queued(const Collective& c, DType dtype, uint16_t fingerprint);
  // The operations of `trace` started / ended now. `error` null: completed.
  void started(const TraceRef& trace);
  void finished(const TraceRef& trace, const std::exception_ptr& error);
  // What the backend ran for operation `id` ("ring"). `name` must outlive the recorder (a
  // string literal).
  void note_algorithm(uint64_t id, std::string_view name);

  // Appends this group as one JSON object (docs/flight-recorder.md, "Per group").
  void append_json(std::string& out) const;

  // The watchdog's question: is the oldest unfinished operation still running (or still waiting
  // to start) `grace` past the group's timeout? Returns a description of it the first time the
  // answer is yes for that operation, nullopt otherwise.
  // `now`: now_ns() (a test passes a later time rather than sleeping).
  std::optional<std::string> overdue(std::chrono::nanoseconds grace, int64_t now = now_ns());

  const GroupInfo& info() const { return info_; }
  size_t capacity() const { return capacity_; }
  // The id the next operation gets (= how many were recorded).
  uint64_t recorded() const { return next_id_.load(std::memory_order_acquire); }

  // Wall-clock nanoseconds since the epoch: the clock of every timestamp a dump shows.
  static int64_t now_ns();
  // What the slots store (see flight_recorder.cc: TSC ticks where the TSC is invariant, else
  // now_ns()), and its conversion to now_ns()'s clock (0 stays 0).
  static int64_t stamp();
  static int64_t stamp_to_ns(int64_t stamp);

 private:
  enum class State : uint8_t { Queued = 0, Started = 1, Completed = 2, Failed = 3 };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  struct Slot {
    std::atomic<uint64_t> id{kEmpty};  // published last at queued(), with release order
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> tag{0};
    std::atomic<uint64_t> count_in{0};
    std::atomic<uint64_t> count_out{0};
    std::atomic<int64_t> queued_ns{0};  // stamp()s, not yet nanoseconds
    std::atomic<int64_t> started_ns{0};
    std::atomic<int64_t> ended_ns{0};
    std::atomic<const char*> algorithm{nullptr};
    std::atomic<uint32_t> algorithm_length{0};
    std::atomic<int32_t> root{-1};
    std::atomic<int32_t> peer{-1};
    std::atomic<int32_t> thread{0};
    std::atomic<uint16_t> fingerprint{0};
    std::atomic<uint8_t> kind{0};
    std::atomic<uint8_t> dtype{0};
    std::atomic<int16_t> reduce_op{-1};  // ReduceOp::Kind, -1 for none
    std::atomic<uint8_t> state{0};
  };
  // A consistent copy of one slot, for readers.
  struct Entry;
  bool read(uint64_t id, Entry& entry) const;
  Slot* slot_of(uint64_t id) const { return &slots_[id % capacity_]; }

  struct Failure {
    uint64_t id = kEmpty;
    std::string code;
    std::string message;
  };

  const GroupInfo info_;
  const size_t capacity_;
  const FailureHook on_failure_;
  const std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_id_{0};
  std::atomic<uint64_t> last_queued_seq_{0};
  std::atomic<uint64_t> last_started_seq_{0};
  std::atomic<uint64_t> last_completed_seq_{0};
  std::atomic<int64_t> last_ended_ns_{0};  // stamp(): when the last operation ended
  // The operation (or unit) running now, kept outside the ring so that a program that issued
  // more than `capacity` operations ahead still shows what runs: its first id, its sequence
  // number, and when it started (0: none runs).
  std::atomic<uint64_t> running_first_{0};
  std::atomic<uint64_t> running_seq_{0};
  std::atomic<int64_t> running_since_ns_{0};  // a stamp()
  std::atomic<bool> failure_dumped_{false};
  std::atomic<uint64_t> watchdog_reported_{kEmpty};

  mutable std::mutex failures_mutex_;
  // guarded by failures_mutex_; by id % capacity_ like the ring (sized at the first failure)
  std::vector<Failure> failures_;
};

// Where a group's flight recorder keeps an operation: carried by the Collective a backend gets
// and by the Work it returns. Null recorder: not recorded.
inline void note_algorithm(const TraceRef& trace, std::string_view name) {
  if (trace.recorder) trace.recorder->note_algorithm(trace.first, name);
}

// Appends `text` to `out` as a JSON string (quoted, escaped): the dumps' one string writer.
void append_json_string(std::string& out, std::string_view text);

// The entries of a unit of collectives posted together (a coalesced group): the group records
// them one after another, so they are consecutive.
inline TraceRef unit_trace(const std::vector<Collective>& unit) {
  if (unit.empty() || !unit.front().trace.recorder) return {};
  TraceRef trace = unit.front().trace;
  trace.count = static_cast<uint32_t>(unit.size());
  for (const Collective& c : unit) trace.seq = std::max(trace.seq, c.trace.seq);
  return trace;
}

}  // namespace weft
