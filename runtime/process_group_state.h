// runtime/process_group_state.h: what a ProcessGroup is made of, shared by the files that
// implement it: process_group.cc (the submit path, coalescing, teardown), process_group_calls.cc
// (each collective's checks and staging), group_creation.cc (init_process_group, new_group,
// split). Private to the runtime.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "weft/backend.h"
#include "weft/process_group.h"
#include "weft/store.h"
#include "weft/tcp_store_server.h"

#include "collectives/tag.h"
#include "runtime/abortable_store.h"
#include "runtime/buffer_pool.h"
#include "runtime/flight_recorder.h"
#include "runtime/trace_dump.h"

namespace weft {

// Internal collectives (debug fingerprints, split's color exchange) set kInternalSeqBit in
// their sequence numbers; user tags of send/recv stay at or below kMaxUserTag (tag.h has both).
using collectives::kInternalSeqBit;
inline constexpr uint64_t kMaxTag = collectives::kMaxUserTag;

// What every group of one world shares: the store (and its server, on the rank that hosts it).
struct World {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> store;
  // The flight recorders' dumps and request thread (null when WEFT_TRACE_BUFFER is 0). Declared
  // last: it goes first, while the store it polls still exists.
  std::shared_ptr<trace::TraceWorld> trace;
};

// Runs after a collective's backend Work succeeds, on the thread that completed it, before the
// user's Work completes (copies out of staging buffers).
using Epilogue = std::function<void()>;

// How many fork()s lie between the process that first loaded weft and this one: a child of
// fork() sees one more than its parent did when it made its groups. A group's progress threads
// (and its store server's) are not in the child, so the child may neither use nor tear down the
// parent's groups (it would wait forever for threads that do not exist). Counted by an atfork
// handler: cheaper than getpid() per call.
uint64_t fork_count();

// The calls recorded between start_coalescing() and end_coalescing(): each with its Work and
// epilogue, all on one device kind.
struct CoalescedCalls {
  std::vector<Collective> calls;
  std::vector<std::shared_ptr<Work>> works;
  std::vector<Epilogue> epilogues;
  std::optional<DeviceKind> device;
};

// A send or receive to or from this rank itself, waiting for its other half (send/recv).
struct SelfMessage {
  Tensor tensor;
  std::shared_ptr<Work> work;
};

struct ProcessGroup::State {
  std::shared_ptr<World> world;
  std::shared_ptr<Store> store;  // the group's namespace in the world store
  std::string store_path;        // "weft/pg/<path>/": unique per group of a world
  int rank = 0;
  int size = 1;
  std::string name;
  std::chrono::milliseconds timeout{0};
  std::vector<int> global_ranks;
  std::string backend_text;
  std::map<std::string, std::string> backend_settings;
  std::vector<std::pair<DeviceKind, std::string>> backend_map;
  bool debug_detail = false;
  std::shared_ptr<BufferPool> staging = BufferPool::create();
  // What the parent's backends returned from Backend::split() for this group, by device kind:
  // handed to the backend of that kind when it is made (BackendOptions::from_parent).
  std::map<DeviceKind, std::shared_ptr<void>> from_parent;  // guarded by mutex
  std::shared_ptr<FlightRecorder> recorder;                 // null when recording is off
  // Raised by abort(); the group's store (and its children's while they form) stop waiting on it.
  std::shared_ptr<AbortSignal> abort_signal;
  std::vector<std::shared_ptr<const AbortSignal>> abort_chain;  // this group's and its ancestors'
  const pid_t creator_pid = getpid();
  const uint64_t creator_forks = fork_count();

  mutable std::mutex mutex;
  std::map<DeviceKind, std::unique_ptr<Backend>> backends;  // guarded by mutex
  uint64_t seq = 0;                                         // guarded by mutex
  uint64_t children = 0;                                    // guarded by mutex
  bool aborted = false;                                     // guarded by mutex
  std::string abort_reason;                                 // guarded by mutex
  bool destroyed = false;                                   // guarded by mutex
  bool coalescing = false;                                  // guarded by mutex
  CoalescedCalls coalesced;                                 // guarded by mutex
  // Sends and receives to and from this rank, unmatched, by tag in posting order.
  std::map<uint64_t, std::deque<SelfMessage>> self_sends;  // guarded by mutex
  std::map<uint64_t, std::deque<SelfMessage>> self_recvs;  // guarded by mutex
  uint64_t monitored_barriers = 0;                         // guarded by mutex

  ErrorContext context(std::string_view op, uint64_t op_seq, std::string detail = {}) const {
    return ErrorContext{rank, size, name, std::string(op), op_seq, std::move(detail)};
  }

  // Whether this process is a fork() child of the one that made the group.
  bool in_forked_child() const { return fork_count() != creator_forks; }

  [[noreturn]] void fail_forked(std::string_view op) const {
    throw Error(
        ErrorCode::InvalidArgument, context(op, seq + 1),
        fmt::format("this process (pid {}) is a fork() child of the one that made the group "
                    "(pid {}): a group cannot be used or destroyed across fork() (its "
                    "threads stayed in the parent); make a new group in the child",
                    getpid(), creator_pid));
  }

  // Refuses any use of a destroyed group, or of a group from a fork() child.
  // REQUIRES: mutex held.
  void check_usable(std::string_view op) const {
    if (in_forked_child()) fail_forked(op);
    if (destroyed) {
      throw Error(ErrorCode::InvalidArgument, context(op, seq + 1), "the group has been destroyed");
    }
  }

  // The backend serving `kind`, made on first use (collective: every rank uses the same kinds in
  // the same order). REQUIRES: mutex held.
  Backend& backend_for(DeviceKind kind, const ErrorContext& where);

  // new_group()/split(): asks every backend this group has made to prepare the sub-group this
  // rank joins (`color`, or Backend::kNoColor) and returns what each gave, by device kind.
  // Called on every rank of this group, in issue order.
  std::map<DeviceKind, std::shared_ptr<void>> split_backends(int color, int key,
                                                             const ErrorContext& where);
};

// send/recv to this rank itself: matches `message` against the other side's queue by `tag`, or
// queues it. `sending` says which side `message` is. Returns its Work (process_group_habits.cc).
std::shared_ptr<Work> post_to_self(ProcessGroup::State& s, bool sending, Tensor tensor,
                                   uint64_t tag);
// Fails every unmatched send/recv to self with `error` (abort, destroy).
void fail_self_messages(ProcessGroup::State& s, std::exception_ptr error);

// Makes `group` the default group if there is none (init_process_group); forgets it as the
// default if it is (ProcessGroup::destroy()).
void offer_default_group(const std::shared_ptr<ProcessGroup>& group);
void forget_default_group(const ProcessGroup* group);

// Numbers `c` and posts it to the group's backend (or records it while coalescing); `epilogue`
// runs after the backend's Work succeeds. Every check that can refuse the call runs before the
// sequence number is taken, so that a refused call leaves the group's numbering as it was.
std::shared_ptr<Work> submit(ProcessGroup::State& s, Collective c, Epilogue epilogue = nullptr);

// A Work that completes when `inner` does, after `epilogue` ran (on inner's completing thread).
std::shared_ptr<Work> chain(const std::shared_ptr<Work>& inner, const ErrorContext& context,
                            std::chrono::milliseconds timeout, Epilogue epilogue);

}  // namespace weft
