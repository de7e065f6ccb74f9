// collectives/context.h: what every algorithm in collectives/ is given, and the small helpers they
// share (argument checks, request bookkeeping, error wording).
//
// An algorithm is a free function: `ring_all_reduce(ctx, input, output, count, dtype, op)`. It
// posts sends and receives on ctx.transport, tagged with make_tag(ctx.seq, step), and waits for
// each against ctx.deadline. It returns when this rank's part is done (its output final, its
// sends complete); other ranks may still be finishing theirs.
//
// Buffers: `input` and `output` are plain host memory. Every algorithm states its in-place
// contract; where in-place use is allowed it is spelled by passing equal pointers. The caller's
// input is never modified in out-of-place use (Gloo's and NCCL's contract, which c10d relies on).
//
// Failure: a transport error (Timeout, PeerLost, Aborted, Protocol) propagates as the
// weft::Error it is, its message prefixed with the algorithm and step ("ring all_reduce
// reduce-scatter step 3/7: ..."). Before the exception leaves the algorithm, every request still
// posted is finished (waited with a deadline already past, which cancels it), so no buffer stays
// borrowed by the transport after the call returns or throws. Bad arguments throw
// Error(InvalidArgument) before anything is posted.
//
// Scratch: an algorithm that needs memory beyond input and output (noted in its header) takes it
// through detail::Scratch, which leases it from ctx.scratch, the group's ScratchPool
// (scratch_pool.h), so that large collectives pay no page faults after the group's first call.
// Without a pool (tests, one-off callers) each call allocates its own, as before the pool.
//
// Thread safety: an algorithm runs on the one thread that posts and waits on ctx.transport
// (transport.h), which is also the one thread using ctx.scratch; it keeps no state between
// calls, so different groups' collectives may run concurrently on their own transports and
// pools.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <string_view>
#include <vector>

#include "weft/dtype.h"
#include "weft/reduce_op.h"

#include "collectives/scratch_pool.h"
#include "collectives/transport.h"

namespace weft::collectives {

struct Context {
  Transport& transport;
  // The collective's sequence number in its group: the high bits of every tag, so that messages
  // of consecutive collectives never match each other. All ranks pass the same value.
  uint64_t seq = 0;
  // Every wait gives up here with Error(Timeout).
  Clock::time_point deadline = Clock::time_point::max();
  // The group's scratch memory, owned by the group and used only on this thread; null: each
  // call that needs scratch allocates its own (see detail::Scratch).
  ScratchPool* scratch = nullptr;
};

// Ring and tree algorithms cut a chunk into segments of at most this many bytes and pipeline
// them: the receive of segment k+1 is in flight while segment k is reduced and forwarded.
// Assumption, to be tuned by benchmark: 256 KiB is large enough that per-message overhead (a
// syscall, a shared-memory slot handshake) is amortised and small enough that two segments sit
// in L2 while being reduced. Tests pass a few bytes to reach the multi-segment paths cheaply.
inline constexpr size_t kDefaultSegmentBytes = 256 * 1024;

namespace detail {

// count * dtype_size(dtype), or Error(InvalidArgument) naming `where` when dtype is not a DType
// or the product overflows.
size_t checked_bytes(std::string_view where, size_t count, DType dtype);

// Throws Error(InvalidArgument) naming `where` when ptr is null but bytes > 0.
void check_buffer(std::string_view where, const void* ptr, size_t bytes, std::string_view name);

// Throws Error(InvalidArgument) when root is not a rank of a group of `size`.
void check_root(std::string_view where, int root, int size);

// Element offsets of consecutive blocks of the given sizes (prefix sums), with the total last,
// or Error(InvalidArgument) when `counts` does not have one entry per rank or the total overflows.
std::vector<size_t> offsets_of(std::string_view where, std::span<const size_t> counts, int size);

// The contiguous ranges [a, a + a_bytes) and [b, b + b_bytes) share at least one byte.
bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes);

// Copies `bytes` from src to dst unless they are the same address (in-place use).
void copy_unless_same(void* dst, const void* src, size_t bytes);

// Runs one phase of a composed algorithm (hierarchical, symmetric across hosts): an Error from
// `body` gets "<where> <name>: " in front of its message, its code kept.
void run_phase(std::string_view where, std::string_view name, const std::function<void()>& body);

// `bytes` of scratch memory for the algorithm running on ctx, 64-byte aligned or better, held
// until this object dies: a lease on ctx.scratch when the group has a pool, else an allocation
// of its own. The contents are unspecified (an earlier call's bytes). Zero bytes: data() is null
// and nothing is taken, so an algorithm that needs scratch only sometimes asks for 0 otherwise.
//
// Thread safety: none; used by the one thread running the algorithm.
class Scratch {
 public:
  Scratch(const Context& ctx, size_t bytes);
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  std::byte* data() const { return lease_.data() != nullptr ? lease_.data() : owned_.get(); }
  size_t size() const { return bytes_; }

 private:
  // The alignment of the fallback; pool memory is page-aligned.
  static constexpr std::align_val_t kAlignment{64};
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, kAlignment); }
  };

  ScratchPool::Lease lease_;
  std::unique_ptr<std::byte[], Free> owned_;
  size_t bytes_;
};

// The requests an algorithm has posted and not yet waited for. wait() waits for one against the
// deadline and rewrites a transport error's message to say which algorithm and step failed; the
// destructor finishes whatever is left (after an exception) so the transport borrows no buffer
// past the algorithm's return.
//
// Thread safety: none; used by the one thread running the algorithm.
class Inflight {
 public:
  Inflight(const Context& ctx, std::string_view algorithm) : ctx_(ctx), algorithm_(algorithm) {}
  ~Inflight();
  Inflight(const Inflight&) = delete;
  Inflight& operator=(const Inflight&) = delete;

  Request send(int peer, const void* data, size_t bytes, uint32_t step);
  Request recv(int peer, void* data, size_t bytes, uint32_t step);
  Request recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op, uint32_t step);

  // Waits for `request`. `phase` (may be empty), `step` and `steps` only go into an error's
  // message: "<algorithm> <phase> step <step+1>/<steps>: <transport's message>".
  void wait(Request request, std::string_view phase, int step, int steps);
  // Waits for every request still posted, in posting order.
  void wait_all(std::string_view phase, int step, int steps);
  // Lets the transport move what is posted, without blocking: for local work (a copy) that runs
  // while transfers are in flight and would otherwise stall a transport that moves bytes only
  // while this rank progresses it (shared-memory rings, UCX's copy-through-FIFO rendezvous).
  void progress();

 private:
  void forget(Request request);

  const Context& ctx_;
  std::string_view algorithm_;
  std::vector<uint64_t> posted_;  // ids; a handful at a time, so a vector beats a set
};

}  // namespace detail
}  // namespace weft::collectives
