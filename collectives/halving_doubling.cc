#include "collectives/halving_doubling.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "weft/error.h"

#include "runtime/reduce.h"

namespace weft::collectives {
namespace {

// Tag steps: 0 folds in, 1..log2(P') the reduce-scatter, kAllGatherStep + (0..log2(P')-1) the
// all-gather, kFoldOutStep folds out. Partners recur across phases (step k of the reduce-scatter
// and step log2(P')-1-k of the all-gather pair the same ranks), so each phase has its own tags
// and a rank that runs ahead never matches a message of the phase its partner is still in.
constexpr uint32_t kFoldInStep = 0;
constexpr uint32_t kAllGatherStep = phase_step(1);
constexpr uint32_t kFoldOutStep = phase_step(2);

// P - P': the ranks folded in, each into its odd neighbour.
int extra_ranks(int size) {
  return size - static_cast<int>(std::bit_floor(static_cast<unsigned>(size)));
}

// The fold, the renumbering and the phases over `work`, whose P blocks are laid out by offsets
// (P+1 prefix sums, elements). See the header for the terms.
class HalvingDoubling {
 public:
  HalvingDoubling(detail::Inflight& inflight, const std::vector<size_t>& offsets, DType dtype,
                  int rank, int size, bool all_gather)
      : inflight_(inflight),
        offsets_(offsets),
        dtype_(dtype),
        element_(dtype_size(dtype)),
        rank_(rank),
        extra_(extra_ranks(size)),
        power_(size - extra_),
        steps_(std::countr_zero(static_cast<unsigned>(power_))),
        total_steps_((all_gather ? 2 : 1) * steps_ + (extra_ > 0 ? 2 : 0)) {}

  // Whether this rank is an even rank folded into the odd one above it.
  bool folded_away() const { return rank_ < 2 * extra_ && rank_ % 2 == 0; }
  // Whether this rank is an odd rank standing for the even one below it as well.
  bool stands_for_two() const { return rank_ < 2 * extra_ && rank_ % 2 == 1; }
  // This rank's number among the P' ranks of the halving and doubling.
  // REQUIRES: !folded_away().
  int new_rank() const { return rank_ < 2 * extra_ ? rank_ / 2 : rank_ - extra_; }
  // First element of the range new rank v owns; v == P' gives the total.
  size_t begin_of(int v) const { return offsets_[v < extra_ ? 2 * v : v + extra_]; }

  // Sends the whole buffer to the odd rank above. REQUIRES: folded_away().
  void fold_in_send(const std::byte* data) {
    inflight_.send(rank_ + 1, data, offsets_.back() * element_, kFoldInStep);
    inflight_.wait_all("fold-in", 0, total_steps_);
  }
  // Reduces the even rank's whole buffer into work. REQUIRES: stands_for_two().
  void fold_in_reduce(std::byte* work, ReduceOp op) {
    inflight_.recv_reduce(rank_ - 1, work, offsets_.back(), dtype_, op, kFoldInStep);
    inflight_.wait_all("fold-in", 0, total_steps_);
  }

  // Recursive halving: afterwards [begin_of(v), begin_of(v+1)) of work holds new rank v's
  // blocks reduced over every rank. REQUIRES: !folded_away(), the fold-in done where extra > 0.
  void reduce_scatter(std::byte* work, ReduceOp op) {
    const int v = new_rank();
    for (int step = 0; step < steps_; ++step) {
      const int distance = power_ >> (step + 1);
      const int group = v & ~(2 * distance - 1);  // first new rank of the group of 2*distance
      const bool lower = (v & distance) == 0;
      const int keep = lower ? group : group + distance;  // first new rank of each half
      const int give = lower ? group + distance : group;
      const int partner = rank_of(v ^ distance);
      const uint32_t tag = static_cast<uint32_t>(step + 1);
      // The two halves are disjoint, so the partner's copy of ours reduces straight into work
      // while the other half is being sent from it.
      const size_t keep_begin = begin_of(keep);
      const size_t keep_count = begin_of(keep + distance) - keep_begin;
      const size_t give_begin = begin_of(give);
      const size_t give_count = begin_of(give + distance) - give_begin;
      if (keep_count > 0) {
        inflight_.recv_reduce(partner, work + keep_begin * element_, keep_count, dtype_, op, tag);
      }
      if (give_count > 0) {
        inflight_.send(partner, work + give_begin * element_, give_count * element_, tag);
      }
      inflight_.wait_all("reduce-scatter", step + shown_offset(), total_steps_);
    }
  }

  // Recursive doubling: afterwards work holds every new rank's range. REQUIRES: !folded_away(),
  // this rank's range final.
  void all_gather(std::byte* work) {
    const int v = new_rank();
    for (int step = 0; step < steps_; ++step) {
      const int distance = 1 << step;
      const int mine = v & ~(distance - 1);  // first new rank of the group whose range we hold
      const int theirs = mine ^ distance;
      const int partner = rank_of(v ^ distance);
      const uint32_t tag = kAllGatherStep + static_cast<uint32_t>(step);
      const size_t recv_begin = begin_of(theirs);
      const size_t recv_count = begin_of(theirs + distance) - recv_begin;
      const size_t send_begin = begin_of(mine);
      const size_t send_count = begin_of(mine + distance) - send_begin;
      if (recv_count > 0) {
        inflight_.recv(partner, work + recv_begin * element_, recv_count * element_, tag);
      }
      if (send_count > 0) {
        inflight_.send(partner, work + send_begin * element_, send_count * element_, tag);
      }
      inflight_.wait_all("all-gather", step + steps_ + shown_offset(), total_steps_);
    }
  }

  // Sends (stands_for_two) or receives (folded_away) `count` elements at `data`: the folded
  // rank's share of the result.
  void fold_out(std::byte* data, size_t count) {
    if (count == 0) return;
    if (folded_away()) {
      inflight_.recv(rank_ + 1, data, count * element_, kFoldOutStep);
    } else {
      inflight_.send(rank_ - 1, data, count * element_, kFoldOutStep);
    }
  }
  void finish_fold_out() { inflight_.wait_all("fold-out", total_steps_ - 1, total_steps_); }

 private:
  // The rank that new rank v stands for in the exchanges.
  int rank_of(int v) const { return v < extra_ ? 2 * v + 1 : v + extra_; }
  // Error messages count the fold-in as the first step.
  int shown_offset() const { return extra_ > 0 ? 1 : 0; }

  detail::Inflight& inflight_;
  const std::vector<size_t>& offsets_;
  const DType dtype_;
  const size_t element_;
  const int rank_;
  const int extra_;        // P - P'
  const int power_;        // P'
  const int steps_;        // log2(P')
  const int total_steps_;  // for error messages only
};

}  // namespace

void halving_doubling_all_reduce(const Context& ctx, const void* input, void* output, size_t count,
                                 DType dtype, ReduceOp op) {
  constexpr std::string_view kWhere = "halving_doubling all_reduce";
  const size_t bytes = detail::checked_bytes(kWhere, count, dtype);
  reduce::check_supported(dtype, op);
  detail::check_buffer(kWhere, input, bytes, "input");
  detail::check_buffer(kWhere, output, bytes, "output");
  if (input != output && detail::overlaps(input, bytes, output, bytes)) {
    throw_error(ErrorCode::InvalidArgument, kWhere, "input and output overlap but differ");
  }
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  if (count == 0) return;

  // The output is the working buffer: the caller's input is read once, here.
  if (reduce::needs_premultiply(op)) {
    reduce::premultiply(output, input, count, dtype, op.factor);
  } else {
    detail::copy_unless_same(output, input, bytes);
  }
  // Blocks as even as elements allow: the first count % P blocks get one element more.
  std::vector<size_t> offsets(size + 1, 0);
  for (int c = 0; c < size; ++c) {
    offsets[c + 1] = offsets[c] + count / size + (static_cast<size_t>(c) < count % size ? 1 : 0);
  }
  auto* work = static_cast<std::byte*>(output);
  detail::Inflight inflight(ctx, kWhere);
  HalvingDoubling hd(inflight, offsets, dtype, rank, size, /*all_gather=*/true);
  if (hd.folded_away()) hd.fold_in_send(work);
  if (hd.stands_for_two()) hd.fold_in_reduce(work, op);
  if (!hd.folded_away()) {
    hd.reduce_scatter(work, op);
    // Finalised once, by the rank that reduced it; the all-gather copies the final bits.
    const int v = hd.new_rank();
    const size_t mine = hd.begin_of(v);
    reduce::finalize(work + mine * dtype_size(dtype), hd.begin_of(v + 1) - mine, dtype, op, size);
    hd.all_gather(work);
  }
  if (hd.folded_away() || hd.stands_for_two()) {
    hd.fold_out(work, count);
    hd.finish_fold_out();
  }
}

void halving_doubling_reduce_scatter(const Context& ctx, const void* input, void* output,
                                     std::span<const size_t> counts, DType dtype, ReduceOp op) {
  constexpr std::string_view kWhere = "halving_doubling reduce_scatter";
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const std::vector<size_t> offsets = detail::offsets_of(kWhere, counts, size);
  const size_t total = detail::checked_bytes(kWhere, offsets.back(), dtype);
  const size_t element = dtype_size(dtype);
  reduce::check_supported(dtype, op);
  detail::check_buffer(kWhere, input, total, "input");
  detail::check_buffer(kWhere, output, counts[rank] * element, "output");
  if (total == 0) return;

  const bool premultiply = reduce::needs_premultiply(op);
  // A folded-in even rank only sends its input away, so it needs a copy only to premultiply;
  // every other rank reduces in a copy, so the input stays untouched and output may alias it.
  const bool even_folded = rank < 2 * extra_ranks(size) && rank % 2 == 0;
  const detail::Scratch scratch(ctx, even_folded && !premultiply ? 0 : total);
  std::byte* work = scratch.data();
  if (work != nullptr) {
    if (premultiply) {
      reduce::premultiply(work, input, offsets.back(), dtype, op.factor);
    } else {
      std::memcpy(work, input, total);
    }
  }
  // Declared after the scratch, so that requests it cancels after an error never outlive it.
  detail::Inflight inflight(ctx, kWhere);
  HalvingDoubling hd(inflight, offsets, dtype, rank, size, /*all_gather=*/false);
  if (hd.folded_away()) {
    // The send only reads, so without premultiplication it reads the caller's input directly.
    hd.fold_in_send(work != nullptr ? work : static_cast<const std::byte*>(input));
    // Output may lie inside input: written only now, after the fold-in's send has completed.
    hd.fold_out(static_cast<std::byte*>(output), counts[rank]);
    hd.finish_fold_out();
    return;
  }
  if (hd.stands_for_two()) hd.fold_in_reduce(work, op);
  hd.reduce_scatter(work, op);
  const int v = hd.new_rank();
  const size_t mine = hd.begin_of(v);
  reduce::finalize(work + mine * element, hd.begin_of(v + 1) - mine, dtype, op, size);
  if (hd.stands_for_two()) {
    hd.fold_out(work + offsets[rank - 1] * element, counts[rank - 1]);
  }
  if (counts[rank] > 0) std::memcpy(output, work + offsets[rank] * element, counts[rank] * element);
  if (hd.stands_for_two()) hd.finish_fold_out();
}

void halving_doubling_reduce_scatter(const Context& ctx, const void* input, void* output,
                                     size_t count, DType dtype, ReduceOp op) {
  const std::vector<size_t> counts(std::max(ctx.transport.size(), 0), count);
  halving_doubling_reduce_scatter(ctx, input, output, counts, dtype, op);
}

}  // namespace weft::collectives
