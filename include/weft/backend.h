// weft/backend.h: what a process group asks of a backend, and the registry that makes backends by
// name.
//
// A ProcessGroup (process_group.h) checks a collective's arguments, numbers it, and hands it to the
// backend that serves its tensors' device as one `Collective`: a plain description with every
// buffer already validated and every list already in one canonical form. The backend runs it
// later, in issue order, on its own thread, and completes the Work it returned. Backends never see
// user errors (a wrong size, a root out of range): those are the group's to report.
//
// A backend is made per group by a factory registered under a name ("tcp"); the group passes it
// the group's store (namespaced for the group), rank, size and timeout. Built-in backends register
// themselves when libweft loads; plugins (plugin.h) register through the same registry.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "weft/cuda.h"
#include "weft/device.h"
#include "weft/error.h"
#include "weft/reduce_op.h"
#include "weft/store.h"
#include "weft/symmetric_buffer.h"
#include "weft/tensor.h"
#include "weft/work.h"

namespace weft {

// Every operation a process group posts. Values are never reused (the plugin ABI mirrors them).
enum class CollectiveKind : uint8_t {
  AllReduce = 0,
  Reduce = 1,
  Broadcast = 2,
  AllGather = 3,
  ReduceScatter = 4,
  Gather = 5,
  Scatter = 6,
  AllToAll = 7,
  Barrier = 8,
  Send = 9,
  Recv = 10,
};

// "all_reduce", "reduce", ..., the names used in error messages and by weft-perf.
std::string_view collective_name(CollectiveKind kind);

// One operation as a backend receives it. The group has checked everything below; the table says
// which fields each kind uses (all tensors of one call share dtype and device):
//
//   kind          | inputs                          | outputs                         | also
//   --------------+---------------------------------+---------------------------------+-----------
//   AllReduce     | [x]                             | [y], y.count == x.count         | op
//   Reduce        | [x]                             | root: [y] as x; others: []      | op, root
//   Broadcast     | root: [x]; others: []           | [y]; root: y.count == x.count   | root
//   AllGather     | [x], x.count == counts[rank]    | [y] with sum(counts), rank-major| counts
//   ReduceScatter | [x] with sum(counts), rank-major| [y], y.count == counts[rank]    | op, counts
//   Gather        | [x]                             | root: [y] P*x.count; others: [] | root
//   Scatter       | root: [x] P*y.count; others: [] | [y]                             | root
//   AllToAll      | [x] sum(send_counts)            | [y] sum(recv_counts)            | *_counts
//   Barrier       | []                              | []                              |
//   Send          | [x]                             | []                              | peer, tag
//   Recv          | []                              | [y]                             | peer, tag
//
// Equal data pointers mean in place: y == x for AllReduce/Reduce/Broadcast, x at rank's block of y
// for AllGather/Gather, y at rank's block of x for ReduceScatter/Scatter, y == x for AllToAll.
// Buffers otherwise do not overlap. (List forms in the group's API are turned into these: the group
// stages through its own buffers when a list is not already one contiguous tensor.)
// Collective::peer of a Recv that takes the first message with its tag from any rank.
inline constexpr int kAnySource = -1;

struct Collective {
  CollectiveKind kind = CollectiveKind::Barrier;
  // The group's sequence number of this collective: the same on every rank, so backends key
  // their messages with it. 0 for Send and Recv, which are matched by (peer, tag) instead.
  uint64_t seq = 0;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  int peer = 0;  // Send/Recv: the other rank; Recv: kAnySource for a receive from any source
  uint64_t tag = 0;
  // Recv from kAnySource: where the backend writes the rank it received from, before the Work
  // completes (Backend::supports_recv_any() says whether it can).
  std::shared_ptr<int> source;
  // AllGather/ReduceScatter: elements per rank (equal blocks are P equal entries).
  std::vector<size_t> counts;
  // AllToAll: elements sent to / received from each rank.
  std::vector<size_t> send_counts;
  std::vector<size_t> recv_counts;
  // CUDA tensors: the caller's current stream when it posted the call (weft/cuda.h): the
  // operation must run after what that stream had queued. nullptr (the legacy default stream)
  // for host tensors.
  CudaStream stream = nullptr;
  // Set by the group: where its flight recorder keeps this call. A backend passes it to the Work
  // it returns (Work::set_trace); one that does not loses only the start time of its operations.
  TraceRef trace;
};

// What a factory gets to build one group's backend.
struct BackendOptions {
  // The group's store: keys written here are private to the group (a PrefixStore).
  std::shared_ptr<Store> store;
  int rank = 0;
  int size = 1;
  std::string group_name = "world";
  // The group's collective timeout (never 0: resolved from WEFT_TIMEOUT by the group).
  std::chrono::milliseconds timeout{300'000};
  // The ranks of this group in the world group, by group rank (for error messages).
  std::vector<int> global_ranks;
  // Backend-specific settings, passed through from the group's options as given. The tcp backend
  // reads "algo" (as WEFT_ALGO) and "shm" ("0"/"1", as WEFT_SHM); a backend ignores keys it does
  // not know.
  std::map<std::string, std::string> settings;
  // For a group made by new_group()/split(): what the parent group's backend of the same device
  // kind returned from Backend::split() on this rank (nullptr when it returned nothing, or the
  // parent had no such backend yet). The nccl backend passes the communicator that
  // ncclCommSplit made.
  std::shared_ptr<void> from_parent;
  // True once the group's abort() has begun. The group holds its lock while post() runs, and
  // reaches Backend::abort() only after taking it; a backend that may block inside post() for long
  // (the nccl backend creating its communicator at its first collective) polls this to stay
  // abortable in bounded time. Empty when the backend is made outside a group.
  std::function<bool()> abort_requested;
  // The device kind this backend serves for the group (a host backend may serve CUDA tensors by
  // staging them: docs/cuda.md).
  DeviceKind device = DeviceKind::Cpu;
};

// A backend runs one group's operations. Implementations: backends/tcp (cpu), plugins.
//
// Ordering: operations run in the order they were posted, one at a time, so every rank runs the
// same sequence. Thread safety: post() and abort() may be called from any thread; the group
// serialises posts, so a backend sees them in issue order. Lifetime: the group owns its backend
// and destroys it after the last Work it returned has completed or been aborted.
class Backend {
 public:
  virtual ~Backend() = default;

  // "tcp", "ucx", "mpi", ...
  virtual std::string_view name() const = 0;

  // Queues `collective` and returns its Work at once; the Work completes when this rank's part is
  // done (its outputs final). `context` is what errors start with. Never throws for a failure of
  // the operation itself: that fails the Work.
  virtual std::shared_ptr<Work> post(Collective collective, ErrorContext context) = 0;

  // Queues several operations to run as one unit, in order, with one Work for all of them.
  // The default posts each and completes the returned Work when the last one has (failing it with
  // the first error); backends that can fuse or overlap them override it.
  virtual std::shared_ptr<Work> post_coalesced(std::vector<Collective> collectives,
                                               ErrorContext context);

  // Allocates a symmetric buffer of `bytes` per rank (weft/symmetric_buffer.h): collective over
  // the group, blocking at most the group's timeout; collectives on tensors inside it may run
  // zero-copy. `context` is what errors start with. The default refuses: Error(Unsupported)
  // naming the backend.
  virtual std::shared_ptr<SymmetricBuffer> allocate_symmetric(size_t bytes,
                                                              const ErrorContext& context);

  // Called on every rank of the group when new_group() or split() forms sub-groups, in the
  // group's issue order: `color` is the sub-group this rank joins (kNoColor: none; for
  // new_group, 0 for members), `key` orders the sub-group's ranks. What it returns reaches the
  // sub-group's backend of the same device kind as BackendOptions::from_parent. The default
  // returns nullptr (the sub-group's backend connects through its own store). Throws weft::Error.
  static constexpr int kNoColor = -1;
  virtual std::shared_ptr<void> split(int color, int key, const ErrorContext& context);

  // Whether a Recv from kAnySource works here. The group refuses it, Unsupported, where not.
  virtual bool supports_recv_any() const { return false; }

  // Fails every pending and later operation with Error(Aborted) carrying `reason` and unblocks
  // the one running, in bounded time. Safe from any thread; only the first call has an effect.
  virtual void abort(const std::string& reason) = 0;
};

using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendOptions& options)>;

// Name -> factory, with the device kinds each backend serves.
//
// Thread safety: every function may be called from any thread.
class Registry {
 public:
  struct Entry {
    std::string name;
    std::vector<DeviceKind> devices;
    BackendFactory factory;
  };

  // The process-wide registry, with the built-in backends registered.
  static Registry& global();

  // An empty registry (tests; global() is what groups use).
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds `name`. Throws Error(InvalidArgument) when the name is taken or empty, or no device
  // kind is given.
  void add(Entry entry);
  // The entry for `name`, or Error(InvalidArgument) listing the names known.
  Entry find(std::string_view name) const;
  // find(), and when `name` is not registered, loads the plugin libweft-backend-NAME.so from
  // WEFT_PLUGIN_PATH's directories, then the install's plugin directory (plugin.h), and registers
  // it. A name holding '/' is a plugin's path. Error(InvalidArgument) when none loads, listing
  // the known names and every file tried with why it was refused (dlopen's message, a missing
  // or mismatched weftBackendPlugin_vN).
  Entry resolve(std::string_view name);
  // Loads the plugin at `path` and registers it (once; loading it again is a no-op). Returns its
  // name. Error(InvalidArgument) saying why it was refused.
  std::string load_plugin(const std::string& path);
  bool contains(std::string_view name) const;
  std::vector<std::string> names() const;
  // The default backend for a device kind: the first registered that serves it.
  std::string default_for(DeviceKind kind) const;

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;  // guarded by mutex_; in registration order
};

// Registers a built-in at load time: `static weft::BackendRegistration reg{{"tcp", {...}, f}};`
struct BackendRegistration {
  explicit BackendRegistration(Registry::Entry entry);
};

// A backend map as c10d writes it: "tcp" (one backend for every device kind it serves) or
// "cpu:tcp,cuda:nccl". Empty: each device kind's default. Names are resolved (plugins loaded) as
// Registry::resolve() does. Returns kind -> backend name; throws Error(InvalidArgument) for
// malformed text, an unknown device kind or an unknown backend, or a backend named for a device
// it does not serve.
std::vector<std::pair<DeviceKind, std::string>> parse_backend_map(std::string_view text,
                                                                  Registry& registry);

}  // namespace weft
