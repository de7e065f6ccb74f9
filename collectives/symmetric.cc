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

#include "runtime/reduce.h"

namespace weft::collectives {

namespace {

// A rank reduces its slice through a scratch chunk of this size: every input's piece is read once
// into the accumulator, which stays in L2 (1-2 MiB here) while the P copies out are written.
constexpr size_t kChunkBytes = 128 * 1024;
// Slices start on cache-line boundaries (relative to the tensor), so that two ranks never write
// the same line of an output.
constexpr size_t kLineBytes = 64;

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
// finalises them. `spare` (n elements) holds a premultiplied input.
void reduce_piece(const SymmetricOperand& input, size_t at, size_t n, int ranks, DType dtype,
                  ReduceOp op, std::byte* acc, std::byte* spare) {
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
  reduce::finalize(acc, n, dtype, op, ranks);
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
    throw Error(e.code(), fmt::format("symmetric barrier ({}) on buffer #{}: {}", phase,
                                      region.id(), e.what()));
  }
  if (!arrived) {
    std::vector<int> absent;
    for (int p = 0; p < ranks; ++p) {
      if (region.slot(p).arrived.load(std::memory_order_acquire) < epoch) absent.push_back(p);
    }
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    throw Error(ErrorCode::Timeout,
                fmt::format("symmetric barrier ({}) on buffer #{}: Timeout after {} ms: rank(s) "
                            "{} had not arrived (stopped, hung, or running another collective: "
                            "every rank must pass tensors in this buffer, or none)",
                            phase, region.id(), waited.count(), fmt::join(absent, ", ")));
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
                fmt::format("symmetric barrier ({}) on buffer #{}: Desync: rank {} runs {}; this "
                            "rank runs {} (every rank must pass the same call, with its tensors "
                            "at the same offsets of the same buffers)",
                            phase, region.id(), p, describe_call(theirs), describe_call(c.call)));
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
  detail::Scratch scratch(c.ctx, piece * element * (reduce::needs_premultiply(op) ? 2 : 1));
  symmetric_barrier(c, true, "enter");
  for (size_t first = begin; first < end; first += chunk) {
    const size_t n = std::min(chunk, end - first);
    const size_t at = first * element;
    std::byte* acc = scratch.data();
    reduce_piece(input, at, n, ranks, dtype, op, acc, acc + piece * element);
    for (int p = 0; p < ranks; ++p) std::memcpy(output.at(p) + at, acc, n * element);
  }
  symmetric_barrier(c, false, "leave");
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
  for (size_t first = 0; first < count; first += chunk) {
    const size_t n = std::min(chunk, count - first);
    std::byte* acc = scratch.data();
    reduce_piece(input, block + first * element, n, ranks, dtype, op, acc, acc + piece * element);
    std::memcpy(output.at(rank) + first * element, acc, n * element);
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
    if (src != dst && bytes > 0) std::memcpy(dst, src, bytes);
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
  if (rank != root && bytes > 0) std::memcpy(output.at(rank), output.at(root), bytes);
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

}  // namespace weft::collectives
