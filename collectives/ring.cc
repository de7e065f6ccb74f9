#include "collectives/ring.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/copy.h"
#include "runtime/reduce.h"

namespace weft::collectives {
namespace {

// Tag steps: reduce-scatter uses 0..P-2, all-gather kAllGatherStep + (0..P-2), so a rank that
// runs ahead into the all-gather never matches a message of the other phase.
constexpr uint32_t kAllGatherStep = phase_step(1);

// A local copy that overlaps transfers goes in pieces of this size, the transport progressed
// between them: small enough that a peer's stream does not stall, large enough that the copy
// runs at memcpy's speed.
constexpr size_t kOverlappedCopyBytes = 256 * 1024;

int mod(int a, int p) { return ((a % p) + p) % p; }

// One ring phase over `work`, whose chunks are laid out by offsets (P+1 prefix sums, elements).
// Reduces with recv_reduce when `reduce` is set, copies otherwise.
//
// Two options spare the reduce phase whole-buffer copies (at 16 MiB a cold copy costs about as
// much as the transfer here):
// - initial(): where each chunk's starting contents are, when the work buffer does not hold them
//   yet (an out-of-place collective's input). The first send reads its chunk from there, and each
//   received segment is copied from there into work just before it is reduced, while it is hot in
//   cache, instead of copying the whole input up front.
// - redirect(): chunk c lives at `at` instead of in work (reduce_scatter's own chunk, reduced
//   straight into the caller's output).
class RingPhase {
 public:
  RingPhase(detail::Inflight& inflight, std::byte* work, const std::vector<size_t>& offsets,
            DType dtype, size_t segment_bytes, int rank, int size)
      : inflight_(inflight),
        work_(work),
        offsets_(offsets),
        dtype_(dtype),
        element_(dtype_size(dtype)),
        segment_elements_(std::max<size_t>(1, segment_bytes / dtype_size(dtype))),
        rank_(rank),
        size_(size) {}

  // REQUIRES: initial.size() == P; an entry may be null (the chunk is in work already).
  void initial(std::vector<const std::byte*> initial) { initial_ = std::move(initial); }
  void redirect(int chunk, std::byte* at) {
    redirect_chunk_ = chunk;
    redirect_to_ = at;
  }

  // Runs P-1 steps: step s sends chunk first_send - s and receives chunk first_send - s - 1.
  // `after_posting`, when set, runs once the first sends and the first receive are posted: work
  // that overlaps the transfer (all_gather's copy of this rank's own block).
  void run(int first_send, bool reduce, ReduceOp op, uint32_t tag_base, const char* phase,
           const std::function<void()>& after_posting = nullptr) {
    first_send = mod(first_send, size_);
    const int steps = size_ - 1;
    const int right = mod(rank_ + 1, size_);
    const int left = mod(rank_ - 1, size_);
    for (size_t segment = 0; segment < segments(first_send); ++segment) {
      const std::byte* from = initial_of(first_send);
      if (from == nullptr) from = base(first_send);
      send_segment(right, from, first_send, segment, tag_base);
    }
    for (int step = 0; step < steps; ++step) {
      const int chunk = mod(first_send - step - 1, size_);
      const size_t n = segments(chunk);
      std::vector<Request> recvs(n);  // n is small: chunk bytes / segment bytes
      auto post_recv = [&](size_t segment) {
        const size_t at = segment * segment_elements_;
        const size_t count = segment_count(chunk, segment);
        const uint32_t tag = tag_base + static_cast<uint32_t>(step);
        std::byte* into = base(chunk) + at * element_;
        if (reduce) {
          if (const std::byte* from = initial_of(chunk)) {
            detail::copy_unless_same(into, from + at * element_, count * element_);
          }
          recvs[segment] = inflight_.recv_reduce(left, into, count, dtype_, op, tag);
        } else {
          recvs[segment] = inflight_.recv(left, into, count * element_, tag);
        }
      };
      // A copy phase posts every segment's receive at once (each lands in its final place, and a
      // transport that pulls the data, as UCX's rendezvous does, then has them all in flight); a
      // reduce phase keeps one ahead, so that what is reduced is still in cache.
      const size_t ahead = reduce ? 1 : n;
      size_t posted = 0;
      while (posted < std::min(n, ahead)) post_recv(posted++);
      if (step == 0 && after_posting) after_posting();
      for (size_t segment = 0; segment < n; ++segment) {
        if (posted < n && posted <= segment + ahead) post_recv(posted++);  // in flight meanwhile
        inflight_.wait(recvs[segment], phase, step, steps);
        // Chunk `chunk` is the one step+1 sends: forward this segment now.
        if (step + 1 < steps) {
          send_segment(right, base(chunk), chunk, segment, tag_base + step + 1);
        }
      }
    }
    // Later phases overwrite the chunks these sends read; and nothing stays borrowed on return.
    inflight_.wait_all(phase, steps - 1, steps);
  }

 private:
  size_t segments(int chunk) const {
    const size_t count = offsets_[chunk + 1] - offsets_[chunk];
    return (count + segment_elements_ - 1) / segment_elements_;
  }
  size_t segment_count(int chunk, size_t segment) const {
    const size_t count = offsets_[chunk + 1] - offsets_[chunk];
    return std::min(segment_elements_, count - segment * segment_elements_);
  }
  std::byte* base(int chunk) const {
    return chunk == redirect_chunk_ ? redirect_to_ : work_ + offsets_[chunk] * element_;
  }
  const std::byte* initial_of(int chunk) const {
    return initial_.empty() ? nullptr : initial_[chunk];
  }
  void send_segment(int right, const std::byte* chunk_base, int chunk, size_t segment,
                    uint32_t tag) {
    inflight_.send(right, chunk_base + segment * segment_elements_ * element_,
                   segment_count(chunk, segment) * element_, tag);
  }

  detail::Inflight& inflight_;
  std::byte* const work_;
  const std::vector<size_t>& offsets_;
  const DType dtype_;
  const size_t element_;
  const size_t segment_elements_;
  const int rank_;
  const int size_;
  std::vector<const std::byte*> initial_;
  int redirect_chunk_ = -1;
  std::byte* redirect_to_ = nullptr;
};

void check_segment(std::string_view where, size_t segment_bytes) {
  if (segment_bytes == 0) {
    throw_error(ErrorCode::InvalidArgument, where, "segment_bytes must be positive");
  }
}

}  // namespace

void ring_all_reduce(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                     ReduceOp op, size_t segment_bytes) {
  constexpr std::string_view kWhere = "ring all_reduce";
  const size_t bytes = detail::checked_bytes(kWhere, count, dtype);
  reduce::check_supported(dtype, op);
  check_segment(kWhere, segment_bytes);
  detail::check_buffer(kWhere, input, bytes, "input");
  detail::check_buffer(kWhere, output, bytes, "output");
  if (input != output && detail::overlaps(input, bytes, output, bytes)) {
    throw_error(ErrorCode::InvalidArgument, kWhere, "input and output overlap but differ");
  }
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  if (count == 0) return;

  // Chunks as even as elements allow: the first count % P chunks get one element more.
  std::vector<size_t> offsets(size + 1, 0);
  for (int c = 0; c < size; ++c) {
    offsets[c + 1] = offsets[c] + count / size + (static_cast<size_t>(c) < count % size ? 1 : 0);
  }
  // The output is the working buffer. Out of place, the reduce-scatter reads the input chunk by
  // chunk as it goes (RingPhase::initial); premultiplied ops copy it all first.
  const bool lazy = size > 1 && input != output && !reduce::needs_premultiply(op);
  if (reduce::needs_premultiply(op)) {
    reduce::premultiply(output, input, count, dtype, op.factor);
  } else if (!lazy) {
    detail::copy_unless_same(output, input, bytes);
  }
  if (size > 1) {
    detail::Inflight inflight(ctx, kWhere);
    RingPhase ring(inflight, static_cast<std::byte*>(output), offsets, dtype, segment_bytes, rank,
                   size);
    if (lazy) {
      const auto* in = static_cast<const std::byte*>(input);
      std::vector<const std::byte*> initial(size);
      for (int c = 0; c < size; ++c) initial[c] = in + offsets[c] * dtype_size(dtype);
      ring.initial(std::move(initial));
    }
    ring.run(rank - 1, /*reduce=*/true, op, 0, "reduce-scatter");
    // The all-gather sends reduced chunks, which are in the output, not the input.
    if (lazy) ring.initial({});
    ring.run(rank, /*reduce=*/false, op, kAllGatherStep, "all-gather");
  }
  reduce::finalize(output, count, dtype, op, size);
}

namespace {

// Reduce-scatter whose P input blocks lie anywhere: blocks[j] holds counts[j] elements.
void reduce_scatter_blocks(std::string_view where, const Context& ctx,
                           std::span<const void* const> blocks, void* output,
                           std::span<const size_t> counts, DType dtype, ReduceOp op,
                           size_t segment_bytes) {
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const std::vector<size_t> offsets = detail::offsets_of(where, counts, size);
  const size_t total = detail::checked_bytes(where, offsets.back(), dtype);
  const size_t element = dtype_size(dtype);
  reduce::check_supported(dtype, op);
  check_segment(where, segment_bytes);
  if (blocks.size() != static_cast<size_t>(size)) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{} input blocks given for a group of {}", blocks.size(), size));
  }
  for (int j = 0; j < size; ++j) {
    detail::check_buffer(where, blocks[j], counts[j] * element, "an input block");
  }
  detail::check_buffer(where, output, counts[rank] * element, "output");
  if (total == 0) return;

  // The inputs stay untouched. The fast way reads each input block where it is (the first send
  // straight from it, received segments copied into scratch as they come) and reduces this rank's
  // block, the last, straight into output: no whole-buffer copy. It needs output to overlap no
  // input block but this rank's own (the in-place form) and no premultiply; else the reduction
  // runs in a copy of every block, from which output is filled at the end.
  auto* out = static_cast<std::byte*>(output);
  const size_t mine_bytes = counts[rank] * element;
  bool direct = size > 1 && !reduce::needs_premultiply(op);
  for (int j = 0; j < size && direct; ++j) {
    const bool overlap = detail::overlaps(out, mine_bytes, blocks[j], counts[j] * element);
    if (overlap && (j != rank || blocks[j] != out)) direct = false;
  }
  // Direct, scratch holds only the chunks passed on after their reduce: none at P = 2.
  const detail::Scratch work(ctx, direct && size == 2 ? 0 : total);
  if (!direct) {
    for (int j = 0; j < size; ++j) {
      std::byte* block = work.data() + offsets[j] * element;
      if (reduce::needs_premultiply(op)) {
        reduce::premultiply(block, blocks[j], counts[j], dtype, op.factor);
      } else if (counts[j] > 0) {
        std::memcpy(block, blocks[j], counts[j] * element);
      }
    }
  }
  if (size > 1) {
    detail::Inflight inflight(ctx, where);
    RingPhase ring(inflight, work.data(), offsets, dtype, segment_bytes, rank, size);
    if (direct) {
      std::vector<const std::byte*> initial(size);
      for (int j = 0; j < size; ++j) initial[j] = static_cast<const std::byte*>(blocks[j]);
      ring.initial(std::move(initial));
      ring.redirect(rank, out);
    }
    ring.run(rank - 1, /*reduce=*/true, op, 0, "");
  }
  if (direct) {
    reduce::finalize(out, counts[rank], dtype, op, size);
    return;
  }
  std::byte* mine = work.data() + offsets[rank] * element;
  reduce::finalize(mine, counts[rank], dtype, op, size);
  if (mine_bytes > 0) std::memcpy(output, mine, mine_bytes);
}

}  // namespace

void ring_reduce_scatter(const Context& ctx, const void* input, void* output,
                         std::span<const size_t> counts, DType dtype, ReduceOp op,
                         size_t segment_bytes) {
  constexpr std::string_view kWhere = "ring reduce_scatter";
  const int size = ctx.transport.size();
  const std::vector<size_t> offsets = detail::offsets_of(kWhere, counts, size);
  detail::check_buffer(kWhere, input, detail::checked_bytes(kWhere, offsets.back(), dtype),
                       "input");
  std::vector<const void*> blocks(size);
  for (int j = 0; j < size; ++j) {
    blocks[j] = static_cast<const std::byte*>(input) + offsets[j] * dtype_size(dtype);
  }
  reduce_scatter_blocks(kWhere, ctx, blocks, output, counts, dtype, op, segment_bytes);
}

void ring_reduce_scatter(const Context& ctx, const void* input, void* output, size_t count,
                         DType dtype, ReduceOp op, size_t segment_bytes) {
  const std::vector<size_t> counts(std::max(ctx.transport.size(), 0), count);
  ring_reduce_scatter(ctx, input, output, counts, dtype, op, segment_bytes);
}

void ring_reduce_scatter(const Context& ctx, std::span<const void* const> inputs, void* output,
                         size_t count, DType dtype, ReduceOp op, size_t segment_bytes) {
  const std::vector<size_t> counts(std::max(ctx.transport.size(), 0), count);
  reduce_scatter_blocks("ring reduce_scatter", ctx, inputs, output, counts, dtype, op,
                        segment_bytes);
}

void ring_all_gather(const Context& ctx, const void* input, void* output,
                     std::span<const size_t> counts, DType dtype, size_t segment_bytes) {
  constexpr std::string_view kWhere = "ring all_gather";
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const std::vector<size_t> offsets = detail::offsets_of(kWhere, counts, size);
  const size_t total = detail::checked_bytes(kWhere, offsets.back(), dtype);
  const size_t element = dtype_size(dtype);
  const size_t mine = counts[rank] * element;
  check_segment(kWhere, segment_bytes);
  detail::check_buffer(kWhere, input, mine, "input");
  detail::check_buffer(kWhere, output, total, "output");
  auto* out = static_cast<std::byte*>(output);
  std::byte* my_block = out + offsets[rank] * element;
  if (input != my_block && detail::overlaps(input, mine, output, total)) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                "input overlaps output without being this rank's block of it");
  }
  if (total == 0) return;
  if (size == 1) {
    detail::copy_unless_same(my_block, input, mine);
    return;
  }
  detail::Inflight inflight(ctx, kWhere);
  RingPhase ring(inflight, out, offsets, dtype, segment_bytes, rank, size);
  // This rank's block goes out straight from the input, and is copied into the output while the
  // first transfers are in flight rather than before them.
  std::vector<const std::byte*> initial(size, nullptr);
  initial[rank] = static_cast<const std::byte*>(input);
  ring.initial(std::move(initial));
  // The copy goes in pieces with the transport progressed between them: one long memcpy would
  // hold up the transfers that need this rank's CPU meanwhile (a peer's ring or FIFO fills).
  ring.run(rank, /*reduce=*/false, ReduceOp::Sum, kAllGatherStep, "", [&] {
    if (input == my_block) return;
    const auto* from = static_cast<const std::byte*>(input);
    for (size_t at = 0; at < mine; at += kOverlappedCopyBytes) {
      if (at > 0) inflight.progress();
      copy_bytes(my_block + at, from + at, std::min(kOverlappedCopyBytes, mine - at), mine);
    }
  });
}

void ring_all_gather(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                     size_t segment_bytes) {
  const std::vector<size_t> counts(std::max(ctx.transport.size(), 0), count);
  ring_all_gather(ctx, input, output, counts, dtype, segment_bytes);
}

}  // namespace weft::collectives
