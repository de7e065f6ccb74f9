#include "collectives/symmetric.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/error.h"

#include "collectives/binomial_tree.h"
#include "collectives/halving_doubling.h"
#include "collectives/planner.h"
#include "collectives/recursive_doubling.h"
#include "collectives/ring.h"
#include "collectives/sub_transport.h"
#include "runtime/copy.h"
#include "runtime/reduce.h"

namespace weft::collectives {

namespace {

// A rank reduces its slice through a scratch chunk of this size: every input's piece is read once
// into the accumulator, which stays in L2 (1-2 MiB here) while the P copies out are written.
constexpr size_t kChunkBytes = 128 * 1024;
// Slices start on cache-line boundaries (relative to the tensor), so that two ranks never write
// the same line of an output.
constexpr size_t kLineBytes = 64;
// The bounce all_gather stages its input in chunks of this size, so that what a rank copies in
// is still in cache when its peers copy it out (2 ranks, 16-64 MiB: 6.7-6.9 GB/s busbw against
// 3.9-4.4 with chunks of the whole 2 MiB half, 7.0-5.1 with 512 KiB).
constexpr size_t kGatherChunkBytes = 256 * 1024;

std::string describe_call(const SymmetricCall& call) {
  return fmt::format(
      "#{} (shape {:#x}, {} elements, input at buffer #{} + {}, output at buffer #{} + {})",
      call.seq, call.shape, call.count, call.in_region, call.in_offset, call.out_region,
      call.out_offset);
}

// Elements [begin, end) of `count` that rank `rank` of `ranks` owns.
std::pair<size_t, size_t> slice_of(size_t count, size_t element, int rank, int ranks) {
  const size_t unit = std::max<size_t>(1, kLineBytes / element);
  const size_t units = (count + unit - 1) / unit;
  const size_t begin = std::min(count, unit * (units * rank / ranks));
  const size_t end = std::min(count, unit * (units * (rank + 1) / ranks));
  return {begin, end};
}

// Reduces `n` elements at byte `at` of every rank's input, in rank order, into `acc`, and
// finalises them unless `finalise` is false (the hierarchical ones finalise once, at the end).
// `spare` (n elements) holds a premultiplied input.
void reduce_piece(const SymmetricOperand& input, size_t at, size_t n, int ranks, DType dtype,
                  ReduceOp op, std::byte* acc, std::byte* spare, bool finalise = true) {
  const size_t bytes = n * dtype_size(dtype);
  const bool premultiply = reduce::needs_premultiply(op);
  for (int p = 0; p < ranks; ++p) {
    const std::byte* src = input.at(p) + at;
    if (p == 0) {
      if (premultiply) {
        reduce::premultiply(acc, src, n, dtype, op.factor);
      } else {
        std::memcpy(acc, src, bytes);
      }
    } else if (premultiply) {
      reduce::premultiply(spare, src, n, dtype, op.factor);
      reduce::accumulate(acc, spare, n, dtype, op);
    } else {
      reduce::accumulate(acc, src, n, dtype, op);
    }
  }
  if (finalise) reduce::finalize(acc, n, dtype, op, ranks);
}

using detail::run_phase;

std::string describe(std::string_view op, const NodeLayout& layout) {
  return fmt::format("symmetric hierarchical {} ({} hosts x {} ranks)", op, layout.node_count(),
                     layout.ranks_per_node());
}

// The op that the inter-host phase combines with: the premultiply and Avg's division happen once,
// outside it.
ReduceOp summing(ReduceOp op) {
  return op.kind == ReduceOp::Avg || op.kind == ReduceOp::PremulSum ? ReduceOp(ReduceOp::Sum) : op;
}

// In-place all_reduce of `count` elements at `data` among the ranks of this rank's rail (the same
// local index on every host), by the planner's choice for its size. Every algorithm the planner
// picks leaves the same bits on every rank of the rail.
void rail_all_reduce(const Context& ctx, const NodeLayout& layout, void* data, size_t count,
                     DType dtype, ReduceOp op) {
  SubTransport rail(ctx.transport, layout.rail(layout.local), 0);
  const Context inner{rail, ctx.seq, ctx.deadline, ctx.scratch};
  const Algorithm algorithm = choose(Op::AllReduce, count * dtype_size(dtype), rail.size(),
                                     rail.link((rail.rank() + 1) % rail.size()));
  if (algorithm == Algorithm::RecursiveDoubling) {
    recursive_doubling_all_reduce(inner, data, data, count, dtype, op);
  } else if (algorithm == Algorithm::HalvingDoubling) {
    halving_doubling_all_reduce(inner, data, data, count, dtype, op);
  } else {
    ring_all_reduce(inner, data, data, count, dtype, op);
  }
}

// How barrier messages name a region: "buffer #3", or the group's bounce buffer.
std::string region_name(const SymmetricRegion& region) {
  return region.id() == SymmetricMemory::kBounceId ? std::string("the group's bounce buffer")
                                                   : fmt::format("buffer #{}", region.id());
}

}  // namespace

void symmetric_barrier(const SymmetricContext& c, bool check_call, const char* phase) {
  SymmetricRegion& region = c.anchor;
  const int ranks = region.ranks();
  const int rank = region.rank();
  SymmetricSlot& mine = region.slot(rank);
  if (check_call) mine.call = c.call;  // before the release below (invariant 2)
  const uint64_t epoch = ++region.epoch();
  mine.arrived.store(epoch, std::memory_order_release);
  if (ranks == 1) return;
  auto all_arrived = [&] {
    for (int p = 0; p < ranks; ++p) {
      if (region.slot(p).arrived.load(std::memory_order_acquire) < epoch) return false;
    }
    return true;
  };
  // Only an arrival that completes the barrier wakes the others: waking each waiter at every
  // arrival woke it P-1 times per barrier to find its peers still missing (at 8 ranks on 2 cores,
  // most of the time went to those wake-ups). No wake-up is lost: of the last two ranks to
  // arrive, each stores its count, then (fence) reads the others', so at least one of them sees
  // every count and rings; a waiter that sleeps is woken by that ring (the doorbell's protocol).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (all_arrived()) c.memory.wake_peers();
  const auto started = Clock::now();
  bool arrived = false;
  try {
    arrived = c.memory.wait_until(all_arrived, c.ctx.deadline);
  } catch (const Error& e) {
    // PeerLost or Aborted from the transport's liveness check: say where, as the message path's
    // "ring all_reduce reduce-scatter step 3/6: ..." does.
    throw Error(e.code(), fmt::format("symmetric barrier ({}) on {}: {}", phase,
                                      region_name(region), e.what()));
  }
  if (!arrived) {
    std::vector<int> absent;
    for (int p = 0; p < ranks; ++p) {
      if (region.slot(p).arrived.load(std::memory_order_acquire) < epoch) {
        absent.push_back(region.member(p));
      }
    }
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    throw Error(ErrorCode::Timeout,
                fmt::format("symmetric barrier ({}) on {}: Timeout after {} ms: rank(s) "
                            "{} had not arrived (stopped, hung, or running another collective: "
                            "every rank must pass tensors in this buffer, or none)",
                            phase, region_name(region), waited.count(), fmt::join(absent, ", ")));
  }
  if (!check_call) return;
  for (int p = 0; p < ranks; ++p) {
    const SymmetricCall& theirs = region.slot(p).call;
    if (theirs == c.call) continue;
    if (c.root_output) {
      SymmetricCall a = theirs, b = c.call;
      a.out_region = a.out_offset = b.out_region = b.out_offset = 0;
      if (a == b) continue;
    }
    if (c.negotiate && theirs.seq == c.call.seq && theirs.shape == c.call.shape) continue;
    throw Error(ErrorCode::Desync,
                fmt::format("symmetric barrier ({}) on {}: Desync: rank {} runs {}; this "
                            "rank runs {} (every rank must pass the same call, with its tensors "
                            "at the same offsets of the same buffers)",
                            phase, region_name(region), region.member(p), describe_call(theirs),
                            describe_call(c.call)));
  }
}

void symmetric_all_reduce(const SymmetricContext& c, SymmetricOperand input,
                          SymmetricOperand output, size_t count, DType dtype, ReduceOp op) {
  reduce::check_supported(dtype, op);
  const size_t element = dtype_size(dtype);
  const int ranks = c.anchor.ranks();
  const auto [begin, end] = slice_of(count, element, c.anchor.rank(), ranks);
  const size_t chunk = std::max<size_t>(1, kChunkBytes / element);
  const size_t piece = std::min(chunk, end - begin);
  // Rank 0's output is where the sum goes first, straight from the inputs (one pass over them,
  // none over a scratch chunk), and the other outputs are copied from it while it is in cache.
  // In place that is still safe: this rank alone reads and writes its slice of every buffer, and
  // input p's piece is read before output p's is written. The premultiplied ops, and an output
  // that overlaps its input without being it, go through the scratch chunk.
  const size_t total = count * element;
  const std::byte* in0 = input.at(0);
  const std::byte* out0 = output.at(0);
  const bool direct = ranks >= 2 && !reduce::needs_premultiply(op) &&
                      (out0 == in0 || out0 + total <= in0 || in0 + total <= out0);
  detail::Scratch scratch(c.ctx,
                          direct ? 0 : piece * element * (reduce::needs_premultiply(op) ? 2 : 1));
  symmetric_barrier(c, true, "enter");
  for (size_t first = begin; first < end; first += chunk) {
    const size_t n = std::min(chunk, end - first);
    const size_t at = first * element;
    if (direct) {
      std::byte* sum = output.at(0) + at;
      reduce::combine(sum, input.at(0) + at, input.at(1) + at, n, dtype, op);
      for (int p = 2; p < ranks; ++p) reduce::accumulate(sum, input.at(p) + at, n, dtype, op);
      reduce::finalize(sum, n, dtype, op, ranks);
      for (int p = 1; p < ranks; ++p) std::memcpy(output.at(p) + at, sum, n * element);
      continue;
    }
    std::byte* acc = scratch.data();
    reduce_piece(input, at, n, ranks, dtype, op, acc, acc + piece * element);
    // memcpy, not the streaming copy: in place, these lines were just read by reduce_piece and
    // are in cache (streamed, 16 MiB on 2 ranks went from 10.8 to 8.1 GB/s busbw).
    for (int p = 0; p < ranks; ++p) std::memcpy(output.at(p) + at, acc, n * element);
  }
  symmetric_barrier(c, false, "leave");
}

namespace {

// The half of every block of the bounce region that the next chunk uses (an offset in bytes),
// and the chunk counted (symmetric.h, "bounce").
size_t next_bounce_half(SymmetricRegion& bounce) {
  const size_t half = bounce.size() / 2 / kLineBytes * kLineBytes;
  return (bounce.chunks()++ % 2) * half;
}

// sum = source(0) op source(1) op ... source(P-1), n elements, in rank order, finalised (Avg's
// division). `sum` may be source 0 or 1 exactly (combine reads both before it writes), never a
// later one (it would be overwritten before its turn).
template <typename Source>
void sum_in_rank_order(std::byte* sum, const Source& source, int ranks, size_t n, DType dtype,
                       ReduceOp op) {
  reduce::combine(sum, source(0), source(1), n, dtype, op);
  for (int p = 2; p < ranks; ++p) reduce::accumulate(sum, source(p), n, dtype, op);
  reduce::finalize(sum, n, dtype, op, ranks);
}

}  // namespace

void bounce_all_reduce(const SymmetricContext& c, const void* input, void* output, size_t count,
                       DType dtype, ReduceOp op) {
  reduce::check_supported(dtype, op);
  SymmetricRegion& bounce = c.anchor;
  const size_t element = dtype_size(dtype);
  const int ranks = bounce.ranks();
  const int rank = bounce.rank();
  // Each half of a block: an inputs area, then a results area, a chunk each.
  const size_t area = bounce.size() / 4 / kLineBytes * kLineBytes;
  const size_t chunk = std::max<size_t>(1, area / element);
  const bool premultiply = reduce::needs_premultiply(op);
  const auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  // This rank's own slice is read from its private input, unless it must be premultiplied, or
  // the sum (written straight into the output) would overwrite it before its turn in the rank
  // order (in place, from rank 2 on): then it goes through the inputs area too.
  const bool own_staged = premultiply || (in == out && rank >= 2);
  for (size_t first = 0; first < count; first += chunk) {
    const size_t n = std::min(chunk, count - first);
    const std::byte* my_in = in + first * element;
    std::byte* my_out = out + first * element;
    const size_t inputs = next_bounce_half(bounce);
    const size_t results = inputs + area;
    // 1. The slices the peers sum go into this rank's inputs area (its own too when
    //    own_staged; premultiplied for PremulSum).
    for (int q = 0; q < ranks; ++q) {
      if (q == rank && !own_staged) continue;
      const auto [b, e] = slice_of(n, element, q, ranks);
      std::byte* to = bounce.block(rank) + inputs + b * element;
      if (premultiply) {
        reduce::premultiply(to, my_in + b * element, e - b, dtype, op.factor);
      } else {
        std::memcpy(to, my_in + b * element, (e - b) * element);
      }
    }
    symmetric_barrier(c, first == 0, "bounce all_reduce: inputs in");
    // 2. This rank's slice, summed in rank order straight into its output, and copied into its
    //    results area for the peers.
    const auto [begin, end] = slice_of(n, element, rank, ranks);
    if (end > begin) {
      const size_t at = begin * element;
      const size_t m = end - begin;
      auto source = [&](int p) -> const std::byte* {
        return p == rank && !own_staged ? my_in + at : bounce.block(p) + inputs + at;
      };
      std::byte* sum = my_out + at;
      sum_in_rank_order(sum, source, ranks, m, dtype, op);
      std::memcpy(bounce.block(rank) + results + at, sum, m * element);
    }
    symmetric_barrier(c, false, "bounce all_reduce: sums out");
    // 3. The peers' slices from their results areas.
    for (int q = 0; q < ranks; ++q) {
      if (q == rank) continue;
      const auto [b, e] = slice_of(n, element, q, ranks);
      std::memcpy(my_out + b * element, bounce.block(q) + results + b * element, (e - b) * element);
    }
  }
}

void bounce_reduce_scatter(const SymmetricContext& c, const void* input, void* output, size_t count,
                           DType dtype, ReduceOp op) {
  reduce::check_supported(dtype, op);
  SymmetricRegion& bounce = c.anchor;
  const size_t element = dtype_size(dtype);
  const int ranks = bounce.ranks();
  const int rank = bounce.rank();
  // A chunk is one piece of every rank's block of the input, on 64-byte lines, half a half in
  // all (1 MiB: measured 1.3-2.3x faster from 4 MiB up than pieces that fill the half, 2 ranks).
  const size_t half = bounce.size() / 2 / kLineBytes * kLineBytes;
  const size_t piece_bytes = std::max(kLineBytes, half / 2 / ranks / kLineBytes * kLineBytes);
  const size_t piece = std::max<size_t>(1, piece_bytes / element);
  const bool premultiply = reduce::needs_premultiply(op);
  const auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  const std::byte* own = in + static_cast<size_t>(rank) * count * element;
  // As all_reduce's: in place (the output is this rank's block of the input) the sum would
  // overwrite the own piece before its turn from rank 2 on.
  const bool own_staged = premultiply || (own == out && rank >= 2);
  for (size_t first = 0; first < count; first += piece) {
    const size_t n = std::min(piece, count - first);
    const size_t at = next_bounce_half(bounce);
    // 1. Piece `first` of every block a peer sums goes into slot q of this rank's half.
    for (int q = 0; q < ranks; ++q) {
      if (q == rank && !own_staged) continue;
      const std::byte* from = in + (static_cast<size_t>(q) * count + first) * element;
      std::byte* to = bounce.block(rank) + at + static_cast<size_t>(q) * piece_bytes;
      if (premultiply) {
        reduce::premultiply(to, from, n, dtype, op.factor);
      } else {
        std::memcpy(to, from, n * element);
      }
    }
    symmetric_barrier(c, first == 0, "bounce reduce_scatter: inputs in");
    // 2. Piece `first` of this rank's block, summed in rank order straight into its output. No
    //    second barrier: the next chunk writes the other half, and the one after waits for the
    //    next chunk's first barrier, which every peer enters after its reads of this one.
    auto source = [&](int p) -> const std::byte* {
      if (p == rank && !own_staged) return own + first * element;
      return bounce.block(p) + at + static_cast<size_t>(rank) * piece_bytes;
    };
    sum_in_rank_order(out + first * element, source, ranks, n, dtype, op);
  }
  // A call of one chunk has had one barrier: a peer that left it could enter its next call's
  // first barrier and rewrite its call words while this rank still compares them (symmetric
  // memory's invariant 2). A second barrier keeps them put until every rank has compared.
  if (count <= piece) symmetric_barrier(c, false, "bounce reduce_scatter: calls compared");
}

void bounce_all_gather(const SymmetricContext& c, const void* input, void* output, size_t count,
                       DType dtype) {
  SymmetricRegion& bounce = c.anchor;
  const size_t element = dtype_size(dtype);
  const int ranks = bounce.ranks();
  const int rank = bounce.rank();
  const size_t half = bounce.size() / 2 / kLineBytes * kLineBytes;
  const size_t chunk_bytes =
      std::max(kLineBytes, std::min(half, kGatherChunkBytes) / kLineBytes * kLineBytes);
  const size_t chunk = std::max<size_t>(1, chunk_bytes / element);
  const auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  const size_t block_bytes = count * element;
  std::byte* own = out + static_cast<size_t>(rank) * block_bytes;
  const bool try_direct = c.memory.ranks_fit_cores();
  if (try_direct) {
    // Direct: every rank publishes its input's address, and whether it can read every peer's
    // memory, in the first line of its half; barrier; when all can, each reads the peers' inputs
    // straight into its output (one copy, as Open MPI's vader); barrier, so that no rank returns
    // (and lets its input change) while a peer still reads it. Otherwise staged, below.
    const size_t at = next_bounce_half(bounce);
    auto* line = reinterpret_cast<uint64_t*>(bounce.block(rank) + at);
    line[0] = reinterpret_cast<uintptr_t>(input);
    line[1] = c.memory.reads_peers() ? 1 : 0;
    symmetric_barrier(c, true, "bounce all_gather: addresses in");
    bool direct = true;
    for (int q = 0; q < ranks; ++q) {
      direct = direct && reinterpret_cast<const uint64_t*>(bounce.block(q) + at)[1] == 1;
    }
    if (direct) {
      if (own != in) copy_bytes(own, in, block_bytes, ranks * block_bytes);
      for (int q = 0; q < ranks; ++q) {
        if (q == rank) continue;
        const auto address = reinterpret_cast<const void*>(
            static_cast<uintptr_t>(reinterpret_cast<const uint64_t*>(bounce.block(q) + at)[0]));
        c.memory.read_peer(bounce.member(q), out + static_cast<size_t>(q) * block_bytes, address,
                           block_bytes);
      }
      symmetric_barrier(c, false, "bounce all_gather: peers read");
      return;
    }
  }
  for (size_t first = 0; first < count; first += chunk) {
    const size_t n = std::min(chunk, count - first);
    const size_t at = next_bounce_half(bounce);
    // 1. This rank's chunk into its half.
    std::memcpy(bounce.block(rank) + at, in + first * element, n * element);
    symmetric_barrier(c, first == 0 && !try_direct, "bounce all_gather: inputs in");
    // 2. Every rank's chunk out of its half into the output (this rank's own from the copy just
    //    made, in cache, unless in place). No second barrier, as reduce_scatter's.
    for (int q = 0; q < ranks; ++q) {
      if (q == rank && own == in) continue;
      std::memcpy(out + (static_cast<size_t>(q) * count + first) * element, bounce.block(q) + at,
                  n * element);
    }
  }
  if (count <= chunk) symmetric_barrier(c, false, "bounce all_gather: calls compared");
}

void symmetric_reduce(const SymmetricContext& c, SymmetricOperand input, void* output, size_t count,
                      DType dtype, ReduceOp op, int root) {
  reduce::check_supported(dtype, op);
  const size_t element = dtype_size(dtype);
  SymmetricRegion& region = c.anchor;
  const int ranks = region.ranks();
  const int rank = region.rank();
  const size_t chunk = std::max<size_t>(1, kChunkBytes / element);
  // Sized for the larger share (the root alone reduces everything) before the barrier, as the
  // others do: allocation may fail, and must not fail after peers counted on this rank.
  const size_t piece = std::min(chunk, count);
  detail::Scratch scratch(c.ctx, piece * element * (reduce::needs_premultiply(op) ? 2 : 1));
  symmetric_barrier(c, true, "enter");
  // The root's call, published before its arrival (invariant 2), names its output when it lies
  // in the inputs' region.
  const SymmetricCall& roots = region.slot(root).call;
  const bool shared = roots.out_region != 0 && roots.out_region == roots.in_region;
  std::byte* out = shared ? region.block(root) + roots.out_offset : static_cast<std::byte*>(output);
  size_t begin = 0, end = 0;
  if (shared) {
    std::tie(begin, end) = slice_of(count, element, rank, ranks);
  } else if (rank == root) {
    end = count;
  }
  for (size_t first = begin; first < end; first += chunk) {
    const size_t n = std::min(chunk, end - first);
    const size_t at = first * element;
    std::byte* acc = scratch.data();
    reduce_piece(input, at, n, ranks, dtype, op, acc, acc + piece * element);
    std::memcpy(out + at, acc, n * element);
  }
  symmetric_barrier(c, false, "leave");
}

void symmetric_reduce_scatter(const SymmetricContext& c, SymmetricOperand input,
                              SymmetricOperand output, size_t count, DType dtype, ReduceOp op) {
  reduce::check_supported(dtype, op);
  const size_t element = dtype_size(dtype);
  const int ranks = c.anchor.ranks();
  const int rank = c.anchor.rank();
  const size_t chunk = std::max<size_t>(1, kChunkBytes / element);
  const size_t piece = std::min(chunk, count);
  detail::Scratch scratch(c.ctx, piece * element * (reduce::needs_premultiply(op) ? 2 : 1));
  symmetric_barrier(c, true, "enter");
  const size_t block = static_cast<size_t>(rank) * count * element;
  std::byte* out = output.at(rank);
  // The output is this rank's alone: sum straight into it (one pass over the inputs), unless the
  // inputs need premultiplying, or it is this rank's own input block (in place) and would be
  // overwritten before its turn in the rank order.
  const bool direct =
      ranks >= 2 && !reduce::needs_premultiply(op) && (out != input.at(rank) + block || rank < 2);
  for (size_t first = 0; first < count; first += chunk) {
    const size_t n = std::min(chunk, count - first);
    const size_t at = block + first * element;
    std::byte* dst = out + first * element;
    if (direct) {
      reduce::combine(dst, input.at(0) + at, input.at(1) + at, n, dtype, op);
      for (int p = 2; p < ranks; ++p) reduce::accumulate(dst, input.at(p) + at, n, dtype, op);
      reduce::finalize(dst, n, dtype, op, ranks);
      continue;
    }
    std::byte* acc = scratch.data();
    reduce_piece(input, at, n, ranks, dtype, op, acc, acc + piece * element);
    std::memcpy(dst, acc, n * element);
  }
  symmetric_barrier(c, false, "leave");
}

void symmetric_all_gather(const SymmetricContext& c, SymmetricOperand input,
                          SymmetricOperand output, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  const int ranks = c.anchor.ranks();
  const int rank = c.anchor.rank();
  symmetric_barrier(c, true, "enter");
  std::byte* out = output.at(rank);
  // Starting at this rank's own block spreads the P readers over the P blocks at any moment.
  for (int i = 0; i < ranks; ++i) {
    const int p = (rank + i) % ranks;
    const std::byte* src =
        input.region != nullptr ? input.at(p) : output.at(p) + static_cast<size_t>(p) * bytes;
    std::byte* dst = out + static_cast<size_t>(p) * bytes;
    if (src != dst && bytes > 0) copy_bytes(dst, src, bytes, bytes * ranks);
  }
  symmetric_barrier(c, false, "leave");
}

void symmetric_broadcast(const SymmetricContext& c, const void* input, SymmetricOperand output,
                         size_t count, DType dtype, int root) {
  const size_t bytes = count * dtype_size(dtype);
  const int rank = c.anchor.rank();
  if (rank == root && input != output.at(rank) && bytes > 0) {
    std::memcpy(output.at(rank), input, bytes);  // before peers may read it (enter)
  }
  symmetric_barrier(c, true, "enter");
  if (rank != root && bytes > 0) copy_bytes(output.at(rank), output.at(root), bytes);
  symmetric_barrier(c, false, "leave");
}

bool symmetric_all_to_all(const SymmetricContext& c, SymmetricOperand input,
                          SymmetricOperand output, size_t count, DType dtype) {
  SymmetricRegion& region = c.anchor;
  const int ranks = region.ranks();
  const int rank = region.rank();
  symmetric_barrier(c, true, "enter");
  bool agree = c.call.factor != 0;
  for (int p = 0; p < ranks && agree; ++p) {
    const SymmetricCall& theirs = region.slot(p).call;
    agree = theirs.factor == c.call.factor && theirs.in_region == c.call.in_region &&
            theirs.in_offset == c.call.in_offset && theirs.out_region == c.call.out_region &&
            theirs.out_offset == c.call.out_offset;
  }
  const size_t bytes = count * dtype_size(dtype);
  const bool in_place = input.region == output.region && input.offset == output.offset;
  if (agree && bytes > 0 && !in_place) {
    // Pull: block p of this rank's output is block `rank` of rank p's input. Starting at this
    // rank's own spreads the P readers over the P inputs at any moment.
    for (int i = 0; i < ranks; ++i) {
      const int p = (rank + i) % ranks;
      std::memcpy(output.at(rank) + static_cast<size_t>(p) * bytes,
                  input.at(p) + static_cast<size_t>(rank) * bytes, bytes);
    }
  } else if (agree && bytes > 0) {
    // In place a pull would overwrite a block a peer has yet to read: instead block p of rank
    // r's tensor and block r of rank p's trade places, swapped by one rank of the pair only (the
    // lower when r + p is even, the higher otherwise, to share the work), so no block is touched
    // by two ranks.
    for (int p = 0; p < ranks; ++p) {
      const int owner = (rank + p) % 2 == 0 ? std::min(rank, p) : std::max(rank, p);
      if (p == rank || owner != rank) continue;
      std::byte* mine = output.at(rank) + static_cast<size_t>(p) * bytes;
      std::byte* theirs = output.at(p) + static_cast<size_t>(rank) * bytes;
      std::swap_ranges(mine, mine + bytes, theirs);
    }
  }
  // Also when declining: no rank may publish its next call while another still reads this one's.
  symmetric_barrier(c, false, "leave");
  return agree;
}

void symmetric_hierarchical_all_reduce(const SymmetricContext& c, const NodeLayout& layout,
                                       SymmetricOperand input, SymmetricOperand output,
                                       size_t count, DType dtype, ReduceOp op) {
  reduce::check_supported(dtype, op);
  const std::string where = describe("all_reduce", layout);
  const size_t element = dtype_size(dtype);
  const int locals = c.anchor.ranks();
  const int local = c.anchor.rank();
  const auto [begin, end] = slice_of(count, element, local, locals);
  const size_t chunk = std::max<size_t>(1, kChunkBytes / element);
  const size_t piece = std::min(chunk, end - begin);
  detail::Scratch scratch(c.ctx, piece * element * (reduce::needs_premultiply(op) ? 2 : 1));
  symmetric_barrier(c, true, "enter");
  // 1. This host's sum of slice `local`, into this rank's own output: in place, that is slice
  //    `local` of its own input, which only this rank reads, and has read by then.
  std::byte* shard = output.at(local) + begin * element;
  for (size_t first = begin; first < end; first += chunk) {
    const size_t n = std::min(chunk, end - first);
    std::byte* acc = scratch.data();
    reduce_piece(input, first * element, n, locals, dtype, op, acc, acc + piece * element,
                 /*finalise=*/false);
    std::memcpy(output.at(local) + first * element, acc, n * element);
  }
  // 2. The hosts' sums of the slice, along the rail; the same slice on every host (the same
  //    number of ranks on each), so a rail whose slice is empty skips alike.
  const size_t shard_count = end - begin;
  if (shard_count > 0) {
    run_phase(where, "inter-host all_reduce",
              [&] { rail_all_reduce(c.ctx, layout, shard, shard_count, dtype, summing(op)); });
    reduce::finalize(shard, shard_count, dtype, op, c.ctx.transport.size());
  }
  // 3. The slice into every local peer's output: slice `local` of any output is this rank's alone
  //    (in place, it was read by this rank only, in step 1).
  for (int p = 0; p < locals; ++p) {
    if (p != local && shard_count > 0) {
      std::memcpy(output.at(p) + begin * element, shard, shard_count * element);
    }
  }
  symmetric_barrier(c, false, "leave");
}

void symmetric_hierarchical_reduce_scatter(const SymmetricContext& c, const NodeLayout& layout,
                                           SymmetricOperand input, SymmetricOperand output,
                                           size_t count, DType dtype, ReduceOp op) {
  reduce::check_supported(dtype, op);
  const std::string where = describe("reduce_scatter", layout);
  const size_t element = dtype_size(dtype);
  const int locals = c.anchor.ranks();
  const int local = c.anchor.rank();
  const int hosts = layout.node_count();
  const size_t chunk = std::max<size_t>(1, kChunkBytes / element);
  const bool premultiply = reduce::needs_premultiply(op);
  // Both before the barrier, as every algorithm here: allocation may fail, and must not fail
  // after peers counted on this rank.
  const detail::Scratch spare(c.ctx, premultiply ? std::min(chunk, count) * element : 0);
  const detail::Scratch rail_sum(c.ctx, static_cast<size_t>(hosts) * count * element);
  symmetric_barrier(c, true, "enter");
  // 1. This host's sum of the blocks of this rank's rail (host h's rank of the rail, for every h),
  //    in local rank order, straight into the rail's buffer.
  for (int h = 0; h < hosts; ++h) {
    const size_t block =
        static_cast<size_t>(layout.nodes[static_cast<size_t>(h)][static_cast<size_t>(local)]) *
        count * element;
    std::byte* sum = rail_sum.data() + static_cast<size_t>(h) * count * element;
    for (size_t first = 0; first < count; first += chunk) {
      const size_t n = std::min(chunk, count - first);
      reduce_piece(input, block + first * element, n, locals, dtype, op, sum + first * element,
                   spare.data(), /*finalise=*/false);
    }
  }
  // 2. A reduce-scatter along the rail leaves this rank its block, summed over every host. In
  //    place, the output is this rank's block of its own input, which only this rank reads
  //    (its rail), and has read by then.
  if (count > 0) {
    run_phase(where, "inter-host reduce-scatter", [&] {
      SubTransport rail(c.ctx.transport, layout.rail(local), 0);
      const Context inner{rail, c.ctx.seq, c.ctx.deadline, c.ctx.scratch};
      ring_reduce_scatter(inner, rail_sum.data(), output.at(local), count, dtype, summing(op));
    });
    reduce::finalize(output.at(local), count, dtype, op, c.ctx.transport.size());
  }
  // Peers read this rank's input until they leave.
  symmetric_barrier(c, false, "leave");
}

void symmetric_hierarchical_all_gather(const SymmetricContext& c, const NodeLayout& layout,
                                       SymmetricOperand input, SymmetricOperand output,
                                       size_t count, DType dtype) {
  const std::string where = describe("all_gather", layout);
  const size_t bytes = count * dtype_size(dtype);
  const int locals = c.anchor.ranks();
  const int local = c.anchor.rank();
  const int hosts = layout.node_count();
  auto rank_at = [&](int h, int l) {
    return static_cast<size_t>(layout.nodes[static_cast<size_t>(h)][static_cast<size_t>(l)]);
  };
  symmetric_barrier(c, true, "enter");
  std::byte* out = output.at(local);
  std::byte* mine = out + rank_at(layout.node, local) * bytes;
  if (input.region != nullptr && bytes > 0) std::memcpy(mine, input.at(local), bytes);
  if (bytes > 0) {
    // 1. Along the rail: this rank's block to the same local index on every other host, theirs
    //    straight into their places in this rank's output.
    run_phase(where, "inter-host all-gather", [&] {
      SubTransport rail(c.ctx.transport, layout.rail(local), 0);
      const Context inner{rail, c.ctx.seq, c.ctx.deadline, c.ctx.scratch};
      detail::Inflight inflight(inner, "direct all-gather");
      for (int k = 1; k < hosts; ++k) {
        const int peer = (layout.node + k) % hosts;
        inflight.recv(peer, out + rank_at(peer, local) * bytes, bytes, 0);
      }
      for (int k = 1; k < hosts; ++k) {
        inflight.send((layout.node - k + hosts) % hosts, mine, bytes, 0);
      }
      inflight.wait_all("", 0, 1);
    });
    // 2. The rail's blocks into every local peer's output: no other rank writes those places,
    //    and none reads them (in place, a peer's input is its own rail's block).
    for (int i = 1; i < locals; ++i) {
      const int p = (local + i) % locals;
      for (int h = 0; h < hosts; ++h) {
        std::memcpy(output.at(p) + rank_at(h, local) * bytes, out + rank_at(h, local) * bytes,
                    bytes);
      }
    }
  }
  symmetric_barrier(c, false, "leave");
}

void symmetric_hierarchical_broadcast(const SymmetricContext& c, const NodeLayout& layout,
                                      const void* input, SymmetricOperand output, size_t count,
                                      DType dtype, int root) {
  const std::string where = describe("broadcast", layout);
  const size_t element = dtype_size(dtype);
  const int locals = c.anchor.ranks();
  const int local = c.anchor.rank();
  const int root_host = layout.node_of_rank(root);
  const auto& root_ranks = layout.nodes[static_cast<size_t>(root_host)];
  const int root_local =
      static_cast<int>(std::find(root_ranks.begin(), root_ranks.end(), root) - root_ranks.begin());
  const bool root_side = layout.node == root_host;
  if (root_side && local == root_local && input != output.at(local) && count > 0) {
    std::memcpy(output.at(local), input, count * element);  // before peers may read it (enter)
  }
  symmetric_barrier(c, true, "enter");
  // Slice `local` of the data travels along rail `local`, then from its rank to the host's others.
  const auto [begin, end] = slice_of(count, element, local, locals);
  const size_t at = begin * element;
  const size_t n = (end - begin) * element;
  std::byte* slice = output.at(local) + at;
  if (root_side && local != root_local && n > 0) {
    std::memcpy(slice, output.at(root_local) + at, n);
  }
  if (n > 0) {
    run_phase(where, "inter-host broadcast", [&] {
      SubTransport rail(c.ctx.transport, layout.rail(local), 0);
      const Context inner{rail, c.ctx.seq, c.ctx.deadline, c.ctx.scratch};
      binomial_broadcast(inner, slice, n, root_host);
    });
    for (int p = 0; p < locals; ++p) {
      if (p == local || (root_side && p == root_local)) continue;
      std::memcpy(output.at(p) + at, slice, n);
    }
  }
  symmetric_barrier(c, false, "leave");
}

}  // namespace weft::collectives
