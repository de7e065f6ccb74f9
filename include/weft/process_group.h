// weft/process_group.h: process groups, weft's user-facing object, and init_process_group().
//
//   auto world = weft::init_process_group();          // under weftrun, torchrun, srun or mpirun
//   std::vector<float> grad(n);
//   auto work = world->all_reduce(weft::Tensor::of(grad.data(), n), weft::ReduceOp::Avg);
//   compute_something_else();                         // overlaps with the all_reduce
//   work->wait();                                     // throws weft::Error if it failed
//
// A ProcessGroup is a set of ranks that run collectives together: its rank and size, a sequence
// counter, argument checks, optional debug checks (WEFT_DEBUG=detail) and one backend per device
// kind (cpu -> tcp by default; "cpu:tcp,cuda:nccl" as c10d writes it). Every collective checks its
// arguments on the calling thread (Error(InvalidArgument) naming the argument), then returns a
// Work at once; the backend runs the group's collectives one at a time, in issue order, on its own
// thread. Every rank of the group must issue the same collectives in the same order, with
// matching arguments (what "matching" means is said per collective below); a rank that does not
// makes the others fail with Timeout, or with Desync under WEFT_DEBUG=detail, never hang.
//
// Buffers: a collective borrows its tensors until its Work completes; the caller must not touch an
// output (or change an input) before then. Out-of-place collectives never modify their input.
// In-place use is spelled by passing the same memory, as each collective says. An input that
// overlaps its output any other way is copied first (at the call), so that the same call gives
// the same answer on every rank: all_gather(buf, buf) is in place on rank 0 only.
//
// Failure: a Work fails with Error(PeerLost) naming the rank when a peer dies or disconnects
// (within about a second, not at the timeout), Error(Timeout) naming the op, the sequence number
// and the peer not heard from past the group's timeout, Error(Aborted) after abort(). After a
// PeerLost or Timeout the group is unusable (its peers' state is unknown): later collectives fail
// at once with the same error. Make a new group to go on.
//
// Thread safety: collectives may be issued from any thread, but the order in which they are issued
// is the order in which they run, and it must be the same on every rank: issue a group's
// collectives from one thread, or order them yourself. abort() may be called from any thread at
// any time. Ownership: groups are shared; a group keeps its world's store (and the store server,
// on the rank that hosts it) alive. A group belongs to the process that made it: a fork() child
// can neither use nor destroy it (its threads stayed in the parent); both are refused with
// Error(InvalidArgument), and the child's copy is left as it is.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weft/backend.h"
#include "weft/device.h"
#include "weft/reduce_op.h"
#include "weft/store.h"
#include "weft/symmetric_buffer.h"
#include "weft/tensor.h"
#include "weft/work.h"

namespace weft {

struct ProcessGroupOptions {
  // Where the ranks meet, as rendezvous() reads it: env:// (the launcher's environment),
  // tcp://HOST:PORT, file:///PATH. Ignored when `store` is set.
  std::string url = "env://";
  // Override the URL's or environment's values (required with `store`).
  std::optional<int> rank = std::nullopt;
  std::optional<int> world_size = std::nullopt;
  // An existing store to meet through instead of the URL.
  std::shared_ptr<Store> store = nullptr;
  // Backends per device kind: "" (defaults), "tcp", "cpu:tcp,cuda:nccl".
  std::string backend = "";
  // Bounds rendezvous and every collective of the group. 0: WEFT_TIMEOUT (default 300 s).
  std::chrono::milliseconds timeout{0};
  // The world group's name in messages.
  std::string name = "world";
  // Backend settings (BackendOptions::settings), e.g. {{"algo", "ring"}, {"shm", "0"}} for tcp.
  std::map<std::string, std::string> backend_settings = {};
};

struct NewGroupOptions {
  // Names the group in messages and the store. Empty: "<parent>.<n>", n counting the groups made
  // from the parent.
  std::string name = "";
  // Backend map for the new group. Empty: the parent's.
  std::string backend = "";
  // 0: the parent's timeout.
  std::chrono::milliseconds timeout{0};
  // Backend settings for the new group. Empty: the parent's.
  std::map<std::string, std::string> backend_settings = {};
};

// One send or receive of batch_isend_irecv(), as c10d's P2POp: {P2POp::Send, tensor, peer}.
struct P2POp {
  enum Kind : uint8_t { Send, Recv };
  Kind kind = Send;
  Tensor tensor;
  int peer = 0;  // the destination of a Send, the source of a Recv (group ranks)
  uint64_t tag = 0;
};

class ProcessGroup {
 public:
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  const std::string& name() const;
  std::chrono::milliseconds timeout() const;
  // Collectives issued on this group so far (send and recv excluded).
  uint64_t sequence_number() const;
  // World rank of each rank of this group, by group rank.
  const std::vector<int>& global_ranks() const;
  // Calls of new_group() and split() made on this group so far, on this rank (whether or not
  // they returned a group here): tells tests and diagnostics how many groups a layer made.
  uint64_t child_groups() const;
  // The backend serving `kind`, by name ("tcp"); Error(InvalidArgument) when none is mapped.
  std::string backend_name(DeviceKind kind = DeviceKind::Cpu) const;

  // ---- Collectives. Every rank passes the same dtype, op, root and sizes unless said otherwise.

  // Reduces `tensor` over all ranks, in place. Avg divides by size(); PremulSum scales each input.
  std::shared_ptr<Work> all_reduce(Tensor tensor, ReduceOp op = ReduceOp::Sum);
  // Out of place: output (same count and dtype as input) receives the reduction.
  std::shared_ptr<Work> all_reduce(Tensor input, Tensor output, ReduceOp op = ReduceOp::Sum);

  // Reduces every rank's `tensor` into root's `tensor`, in place; other ranks' tensors unchanged.
  std::shared_ptr<Work> reduce(Tensor tensor, int root, ReduceOp op = ReduceOp::Sum);
  // Out of place: root's output receives the reduction; output is ignored on other ranks.
  std::shared_ptr<Work> reduce(Tensor input, Tensor output, int root, ReduceOp op = ReduceOp::Sum);

  // Copies root's `tensor` into every rank's `tensor`.
  std::shared_ptr<Work> broadcast(Tensor tensor, int root);

  // Gathers every rank's input into outputs[r] (one tensor per rank, outputs[r].count elements:
  // sizes may differ per rank, and every rank passes the same list of sizes; input.count must be
  // outputs[rank()].count). The list may be one contiguous buffer or scattered tensors.
  std::shared_ptr<Work> all_gather(std::vector<Tensor> outputs, Tensor input);
  // Into one tensor, rank-major: output holds size() * input.count elements. In place when input
  // is this rank's block of output.
  std::shared_ptr<Work> all_gather_into_tensor(Tensor output, Tensor input);
  // Into one tensor with per-rank sizes: rank r contributes counts[r] elements (input.count ==
  // counts[rank()]); output holds sum(counts), rank-major.
  std::shared_ptr<Work> all_gather_uneven(Tensor output, Tensor input, std::vector<size_t> counts);

  // Reduces inputs[r] over all ranks into rank r's output (inputs: one tensor per rank, each of
  // output.count elements).
  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs,
                                       ReduceOp op = ReduceOp::Sum);
  // From one tensor: input holds size() * output.count elements, rank-major; rank r's output gets
  // block r reduced. In place when output is this rank's block of input.
  std::shared_ptr<Work> reduce_scatter_tensor(Tensor output, Tensor input,
                                              ReduceOp op = ReduceOp::Sum);
  // With per-rank sizes: input holds sum(counts), rank r's output counts[r] elements.
  std::shared_ptr<Work> reduce_scatter_uneven(Tensor output, Tensor input,
                                              std::vector<size_t> counts,
                                              ReduceOp op = ReduceOp::Sum);

  // Gathers every rank's input into root's outputs (one tensor per rank, each input.count
  // elements). Other ranks pass an empty list.
  std::shared_ptr<Work> gather(std::vector<Tensor> outputs, Tensor input, int root);
  // Into one tensor on root: size() * input.count elements, rank-major; ignored on other ranks.
  std::shared_ptr<Work> gather_into_tensor(Tensor output, Tensor input, int root);

  // Scatters root's inputs (one tensor per rank, each output.count elements) so that rank r's
  // output receives inputs[r]. Other ranks pass an empty list.
  std::shared_ptr<Work> scatter(Tensor output, std::vector<Tensor> inputs, int root);
  // From one tensor on root: size() * output.count elements, rank-major; ignored elsewhere.
  std::shared_ptr<Work> scatter_from_tensor(Tensor output, Tensor input, int root);

  // Even all-to-all: input and output hold size() * n elements; block j of input goes to rank j,
  // block j of output comes from rank j. In place when output and input are the same tensor.
  std::shared_ptr<Work> all_to_all(Tensor output, Tensor input);
  // With split sizes in elements, one per rank (torch.distributed.all_to_all_single's order):
  // rank r's input_splits[j] must equal rank j's output_splits[r]. Empty splits mean even blocks.
  std::shared_ptr<Work> all_to_all(Tensor output, Tensor input, std::vector<size_t> output_splits,
                                   std::vector<size_t> input_splits);

  // all_to_all with splits under c10d's name (torch.distributed.all_to_all_single): the same call.
  std::shared_ptr<Work> all_to_all_single(Tensor output, Tensor input,
                                          std::vector<size_t> output_splits = {},
                                          std::vector<size_t> input_splits = {});

  // Completes when every rank has entered it.
  std::shared_ptr<Work> barrier();

  // c10d's monitored_barrier: blocks until every rank has entered it, through the group's store
  // (not the backend, so it works when the backend is the thing in doubt). Rank 0 waits for the
  // others up to `timeout` (0: the group's) and then throws Error(Timeout) naming the ranks that
  // had not arrived: the first one, or every one with wait_all_ranks; the other ranks then
  // throw the same list (or, if rank 0 itself never arrives, Timeout naming rank 0). Numbered
  // apart from collectives ("monitored_barrier #3"). Every rank calls it, in the same order.
  void monitored_barrier(std::chrono::milliseconds timeout = std::chrono::milliseconds(0),
                         bool wait_all_ranks = false);

  // ---- Object collectives (c10d's *_object), on byte strings whose sizes may differ per rank.
  // Each is blocking (as in c10d), runs two or three of the collectives above (the sizes first,
  // as int64, then the bytes as uint8), and throws their Error. Serialising is the caller's.

  // Every rank's `object`, by rank.
  std::vector<Bytes> all_gather_object(const Bytes& object);
  // Root's `objects` into every rank's `objects` (resized to root's count; c10d requires the
  // same length on every rank, weft takes root's).
  void broadcast_object_list(std::vector<Bytes>& objects, int root);
  // Every rank's `object` on root, by rank; an empty list on the other ranks. Blocks are padded
  // to the largest object on the wire.
  std::vector<Bytes> gather_object(const Bytes& object, int root);
  // Root's objects[r] to rank r (root passes one per rank; the others pass an empty list).
  Bytes scatter_object_list(const std::vector<Bytes>& objects, int root);

  // Point to point, matched by (peer, tag) in posting order: rank a's send(t, b, tag) pairs with
  // rank b's recv(u, a, tag); u.count must equal t.count. They run in issue order with the group's
  // collectives, on the same thread. Tags go up to 2^62 - 1 (the backends keep the bits above for
  // themselves); a larger one is InvalidArgument. Inside a coalesced unit, sends and receives are
  // posted together, so each rank may order them as it likes (both receiving first is fine).
  //
  // To oneself (dst or src == rank()): matched on this rank by tag in posting order, without the
  // backend; the copy happens, and both Works complete, when the second of the pair is posted,
  // whatever else the group is running (so a rank may send to itself and receive in either
  // order, even outside a coalesced unit). A count or dtype mismatch fails both Works with
  // InvalidArgument; abort() fails the unmatched ones with Aborted.
  std::shared_ptr<Work> send(Tensor tensor, int dst, uint64_t tag = 0);
  std::shared_ptr<Work> recv(Tensor tensor, int src, uint64_t tag = 0);
  // c10d's recv with src=None: receives the first send with `tag` that reaches this rank from
  // any other rank (not from itself); the Work's source_rank() names the sender once it has
  // succeeded. Against receives from a given rank, a message goes to the earliest posted that
  // could take it. A rank lost while it waits fails it (PeerLost): that rank may have been the
  // sender. Backends that cannot refuse it, Unsupported (Backend::supports_recv_any(): tcp does,
  // except in a group that mixes shared memory and TCP, ucx does, plugins do not), and so does a
  // coalesced unit (InvalidArgument).
  std::shared_ptr<Work> recv_any(Tensor tensor, uint64_t tag = 0);

  // c10d's batch_isend_irecv: the sends and receives posted as one coalesced unit (every rank's
  // pairs match, in any order inside the unit); one Work per op, each completing with the unit.
  // REQUIRES: not inside start_coalescing() (a unit does not nest: InvalidArgument).
  std::vector<std::shared_ptr<Work>> batch_isend_irecv(std::vector<P2POp> ops);

  // Coalescing: between start_coalescing() and end_coalescing() collectives are recorded, not
  // run (each returns a Work that completes with the group); end_coalescing() posts them as one
  // unit and returns its Work. Every rank coalesces the same calls. All must use one device kind.
  void start_coalescing();
  std::shared_ptr<Work> end_coalescing();

  // ---- Symmetric memory (weft/symmetric_buffer.h, docs/symmetric-memory.md).

  // Allocates `bytes` on every rank, in one shared mapping per host, and returns this rank's
  // handle: all_reduce, reduce_scatter, all_gather and broadcast on tensors inside such buffers
  // (at the same offset on every rank) run zero-copy. Collective over the group: every rank calls
  // it with the same `bytes`, in the same order as the group's other allocations; it is not
  // numbered as a collective and may overlap the group's running collectives. Blocks up to the
  // group's timeout. In a group that spans hosts, each host maps its own ranks' blocks and those
  // four collectives run hierarchically (zero-copy inside each host; hosts of equal size only).
  // Error(Unsupported) naming the reason when the group's cpu backend has no shared memory
  // (WEFT_SHM=0, a plugin backend); Error(Io) when the memory cannot be made on some host (a full
  // /dev/shm). REQUIRES: not concurrent with destroy().
  std::shared_ptr<SymmetricBuffer> allocate_symmetric(size_t bytes);

  // ---- Sub-groups. Collective over this group: every rank calls them, in the same order.

  // A group of the given ranks of this group (in that order: the group's rank i is ranks[i]).
  // Returns nullptr on ranks not listed. One store round trip for the members.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, NewGroupOptions options = {});
  // Groups by color: ranks passing the same color >= 0 form a group, ordered by (key, rank).
  // A negative color joins no group (nullptr). Colors are exchanged over this group itself (one
  // all_gather), then each new group connects with one store round trip.
  std::shared_ptr<ProcessGroup> split(int color, int key, NewGroupOptions options = {});

  // ---- Teardown.

  // Fails every pending and later operation with Error(Aborted) carrying `reason`, unblocking the
  // running one, in bounded time. From any thread; the first call wins. A new_group() or split()
  // of this group that is waiting for its members returns Error(Aborted) too (within ~100 ms),
  // and later ones refuse at once.
  void abort(const std::string& reason = "abort() called");
  bool is_aborted() const;
  // Waits (up to the timeout) for what was issued, then releases the backends and their
  // connections. Later calls fail with Error(InvalidArgument). Idempotent; the destructor does it.
  void destroy();

  struct State;  // implementation (runtime/process_group.cc)
  explicit ProcessGroup(std::unique_ptr<State> state);

 private:
  std::unique_ptr<State> state_;
};

// Meets the other ranks (rendezvous() with options.url, or options.store) and returns the world
// group with its backends connected. With no arguments, from the launcher's environment. The
// group returned becomes the default group (below) when there is none.
std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});

// ---- The default group: c10d's module-level helpers.
//
// The default group is the first group init_process_group() returned that is still alive and
// not destroyed. Unlike c10d, weft does not keep it alive: it is the caller's shared_ptr, and
// goes when the caller drops it (or destroy_process_group() destroys it). Thread-safe.

// Whether there is a default group.
bool is_initialized();
// The default group; Error(InvalidArgument) saying to call init_process_group() when none.
std::shared_ptr<ProcessGroup> default_group();
// `group`'s rank and size; with no group, the default group's (Error as above when none).
int get_rank(const std::shared_ptr<ProcessGroup>& group = nullptr);
int get_world_size(const std::shared_ptr<ProcessGroup>& group = nullptr);
// Destroys `group` (ProcessGroup::destroy()); with no group, the default group, which is then
// no longer the default (is_initialized() turns false, and the next init_process_group() makes
// a new one). Error(InvalidArgument) when there is no group to destroy.
void destroy_process_group(const std::shared_ptr<ProcessGroup>& group = nullptr);

// ---- The flight recorder (docs/flight-recorder.md).
//
// Writes the flight recorder of every group of this process, one JSON file per world rank in
// WEFT_TRACE_DIR (default: the working directory), with `reason` in it; returns the files
// written (none when WEFT_TRACE_BUFFER=0 or no group exists). weft dumps by itself on a Timeout,
// a PeerLost, an abort and SIGUSR1; this is for a program that wants a snapshot of its own.
std::vector<std::string> dump_trace(const std::string& reason = "requested by the program");

}  // namespace weft
