#include "backends/common/transport_backend.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"

#include "backends/common/transport_util.h"
#include "collectives/context.h"
#include "runtime/desync_check.h"
#include "runtime/flight_recorder.h"
#include "runtime/log.h"

namespace weft::backends {

using collectives::Clock;

namespace {

// Collectives moving at most this many bytes per rank start deferred (ProgressThread): a caller
// that waits for one runs it without waking the progress thread, whose two wake-ups would
// otherwise double its latency. Above it, the transfer dwarfs a wake-up, and starting at once on
// the progress thread gives the caller the most overlap.
constexpr size_t kDeferBytes = 64 * 1024;

// all_reduce, reduce_scatter and all_gather whose input is this size or more, on a group of one
// host, run bounced (runs_bounced()) through a bounce region of four kBounceChunk per rank: two
// halves (symmetric.h).
constexpr size_t kBounceBytes = 64 * 1024;
// ... except a 2-rank all_gather, from this size of block: below it, the ring's one single-copy
// message each way is as fast as the bounce's direct reads (128 KiB blocks: 15-18 us against
// 16-21), and faster than its staged copies.
constexpr size_t kBounceGatherPair = 256 * 1024;
constexpr size_t kBounceChunk = 1 << 20;

// `inner` is an error raised below the collective (by its transport, its algorithm), which
// already names this rank, its group and the code: "recursive_doubling all_reduce step 1/1:
// rank 1/2 group "world" shm recv: Desync: rank 0 sent ...". The collective's own context goes
// in front of it, so those repeats are dropped: "... shm recv: rank 0 sent ...".
std::string without_repeats(std::string inner, const ErrorContext& context, ErrorCode code) {
  ErrorContext who;
  who.rank = context.rank;
  who.size = context.size;
  who.group = context.group;
  const std::string prefix = who.describe() + " ";
  if (prefix.size() > 1) {
    for (size_t at; (at = inner.find(prefix)) != std::string::npos;) inner.erase(at, prefix.size());
  }
  const std::string lead = fmt::format("{}: ", error_code_name(code));
  if (inner.starts_with(lead)) {
    inner.erase(0, lead.size());
  } else if (size_t at = inner.find(": " + lead); at != std::string::npos) {
    inner.erase(at + 2, lead.size());
  }
  return inner;
}

size_t bytes_moved(const Collective& collective) {
  size_t in = 0;
  size_t out = 0;
  for (const Tensor& t : collective.inputs) in += t.nbytes();
  for (const Tensor& t : collective.outputs) out += t.nbytes();
  return std::max(in, out);
}

}  // namespace

TransportBackend::TransportBackend(std::string name, const BackendOptions& options,
                                   std::unique_ptr<collectives::Transport> transport)
    : name_(std::move(name)),
      options_(options),
      transport_(std::move(transport)),
      failure_(options_.store, options_.rank) {
  plan_.slowest_link = slowest_link_of(*transport_);
  plan_.nodes = collectives::node_layout(*transport_);
  auto algo = options_.settings.find("algo");
  plan_.algo = algo != options_.settings.end() ? algo->second : config().algo;
  // An unknown name fails here, at setup, rather than at the first collective.
  collectives::choose(collectives::Op::AllReduce, 0, options_.size, plan_.slowest_link, plan_.algo);
  // Caller runs: every collective honours its deadline (the group's timeout), so a caller waiting
  // for one may run it on its own thread, saving two thread wake-ups per small collective.
  // A Work's default wait() gives the collective's own deadline a margin to fire first
  // (runtime/progress_thread.h, wait_margin): its Timeout names the rank not heard from; wait()'s
  // generic one cannot.
  const auto margin =
      std::chrono::duration_cast<std::chrono::milliseconds>(wait_margin(options_.timeout));
  thread_ = std::make_unique<ProgressThread>("weft-" + options_.group_name, options_.timeout,
                                             options_.timeout + margin, /*caller_runs=*/true);
  thread_->set_abort_hook([this] {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      reason = abort_reason_;
    }
    transport_->abort(reason.empty() ? "the group was aborted" : reason);
  });
}

TransportBackend::~TransportBackend() {
  // Drain and join before the transport goes: queued collectives still use it.
  thread_.reset();
}

std::shared_ptr<Work> TransportBackend::post(Collective collective, ErrorContext context) {
  const bool defer = bytes_moved(collective) <= kDeferBytes;
  TraceRef trace = collective.trace;
  std::shared_ptr<SymmetricPlan> symmetric;
  try {
    if (auto plan =
            plan_symmetric(transport_->symmetric_memory(), collective, context, plan_.nodes)) {
      symmetric = std::make_shared<SymmetricPlan>(std::move(*plan));
    }
  } catch (const Error&) {
    // A tensor straddling a symmetric buffer's end: the call's own fault, on this rank.
    auto work = std::make_shared<Work>(context, options_.timeout);
    work->set_trace(std::move(trace));
    work->fail(std::current_exception());
    return work;
  }
  auto task = [this, collective = std::move(collective), context, symmetric]() mutable {
    // The buffers' uses end with the task's run, before its Work completes: a release() right
    // after wait() must not find them still held.
    std::shared_ptr<SymmetricPlan> plan = std::move(symmetric);
    run(collective, context, plan.get());
  };
  return thread_->submit(std::move(context), std::move(task), defer, std::move(trace));
}

std::shared_ptr<SymmetricBuffer> TransportBackend::allocate_symmetric(size_t bytes,
                                                                      const ErrorContext& context) {
  collectives::SymmetricMemory* memory = transport_->symmetric_memory();
  if (memory == nullptr) {
    throw Error(ErrorCode::Unsupported, context,
                fmt::format("backend \"{}\" cannot allocate symmetric memory in this group: {}",
                            name_, transport_->why_no_symmetric_memory()));
  }
  return memory->allocate(bytes, Clock::now() + options_.timeout);
}

std::shared_ptr<Work> TransportBackend::post_coalesced(std::vector<Collective> collectives,
                                                       ErrorContext context) {
  size_t bytes = 0;
  for (const Collective& collective : collectives) bytes += bytes_moved(collective);
  const bool defer = bytes <= kDeferBytes;
  TraceRef trace = unit_trace(collectives);
  auto task = [this, collectives = std::move(collectives), context] {
    auto is_p2p = [](const Collective& c) {
      return c.kind == CollectiveKind::Send || c.kind == CollectiveKind::Recv;
    };
    for (size_t i = 0; i < collectives.size();) {
      if (!is_p2p(collectives[i])) {
        ErrorContext one = context;
        one.op = std::string(collective_name(collectives[i].kind));
        one.seq = collectives[i].seq;
        run(collectives[i], one);
        ++i;
        continue;
      }
      // A run of sends and receives is posted all at once, then waited for: each rank may
      // order them as it likes (both receiving first is the usual exchange), as in NCCL's groups.
      size_t end = i;
      while (end < collectives.size() && is_p2p(collectives[end])) ++end;
      ErrorContext batch = context;
      batch.op = end - i == 1 ? std::string(collective_name(collectives[i].kind)) : "send/recv";
      guarded(batch, /*symmetric=*/false, [&](Clock::time_point deadline) {
        std::vector<collectives::Request> requests;
        requests.reserve(end - i);
        for (size_t k = i; k < end; ++k) {
          requests.push_back(post_point_to_point(*transport_, collectives[k]));
        }
        for (collectives::Request request : requests) transport_->wait(request, deadline);
      });
      i = end;
    }
  };
  return thread_->submit(std::move(context), std::move(task), defer, std::move(trace));
}

void TransportBackend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  thread_->abort(reason);
}

void TransportBackend::guarded(const ErrorContext& context, bool symmetric,
                               const std::function<void(Clock::time_point)>& body) {
  if (broken_) std::rethrow_exception(broken_);
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  try {
    body(deadline);
  } catch (const Error& error) {
    // Every error leaves with the collective's context in front: rank, group, op, #seq (once).
    std::string detail = without_repeats(error.what(), context, error.code());
    if (error.code() == ErrorCode::Aborted) {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (!abort_reason_.empty()) detail = abort_reason_ + " (" + detail + ")";
    }
    if (error.code() == ErrorCode::PeerLost) {
      // A peer that hung up may have done so because it broke first: the record in the store
      // names the rank really lost, so it leads the message.
      GroupFailure::Lookup found = failure_.look_up();
      if (!found.first.empty()) {
        detail =
            fmt::format("first failure in the group: {}; seen here as: {}", found.first, detail);
      }
      if (!found.store_error.empty()) {
        detail += fmt::format(
            "; the store is unreachable too ({}): the process that hosts it (rank 0, or the "
            "launcher) has exited or its host is down, and the job cannot go on without it",
            found.store_error);
      }
    }
    if (error.code() == ErrorCode::Timeout && symmetric && context.seq != 0 && context.size > 1) {
      // Before hanging up (which would turn the others' Timeouts into PeerLost): who else timed
      // out in this collective? At most 1 s, and at most half the margin that a Work's wait()
      // gives the collective's own deadline (the constructor), so that this Timeout still
      // reaches the caller first.
      const auto grace = std::min<std::chrono::milliseconds>(
          std::chrono::seconds(1),
          std::max<std::chrono::milliseconds>(std::chrono::seconds(1), options_.timeout / 10) / 2);
      std::vector<int> silent = failure_.silent_members(context.seq, context.size, grace);
      if (!silent.empty()) {
        detail += fmt::format(
            "; {} with this one (within {} ms): the likely cause, stopped, hung or busy outside "
            "weft",
            ranks_that(silent, fmt::format("did not time out in #{}", context.seq),
                       fmt::format("did not time out in #{}", context.seq)),
            grace.count());
      }
    }
    auto failure = std::make_exception_ptr(Error(error.code(), context, detail));
    switch (error.code()) {
      case ErrorCode::PeerLost:
      case ErrorCode::Timeout:
      case ErrorCode::Protocol:
        break_group(context, failure);
        break;
      default:
        break;
    }
    std::rethrow_exception(failure);
  }
}

void TransportBackend::break_group(const ErrorContext& context, std::exception_ptr error) {
  broken_ = error;
  std::string what;
  ErrorCode code = ErrorCode::PeerLost;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    what = e.what();
    code = e.code();
  } catch (const std::exception& e) {
    what = e.what();
  }
  // The error itself reaches the caller through this collective: logged in full only at debug,
  // so that it is not printed twice (once here, once by the program that catches it).
  WEFT_LOG_WARN("{}: the group is broken ({}); later collectives on it fail at once",
                context.describe(), error_code_name(code));
  WEFT_LOG_DEBUG("{}: broken by: {}", context.describe(), what);
  // Say what happened first, then hang up, so that a peer which learns of it from the hang-up can
  // name the rank really lost.
  failure_.record(context, what);
  transport_->abort("the group broke: " + what);
}

void TransportBackend::run(const Collective& collective, const ErrorContext& context,
                           const SymmetricPlan* zero_copy) {
  const CollectiveKind kind = collective.kind;
  const bool symmetric = kind == CollectiveKind::AllReduce || kind == CollectiveKind::AllGather ||
                         kind == CollectiveKind::ReduceScatter ||
                         kind == CollectiveKind::AllToAll || kind == CollectiveKind::Barrier;
  guarded(context, symmetric, [&](Clock::time_point deadline) {
    // Every message of the collective carries its call's fingerprint (collectives/tag.h).
    const DType dtype = !collective.inputs.empty()    ? collective.inputs[0].dtype
                        : !collective.outputs.empty() ? collective.outputs[0].dtype
                                                      : DType::Float32;
    const uint64_t seq =
        collectives::fingerprinted_seq(collective.seq, call_fingerprint(collective, dtype));
    collectives::Context ctx{*transport_, seq, deadline};
    ctx.scratch = &scratch_;
    if (zero_copy == nullptr && runs_bounced(collective)) {
      run_bounced(collective, ctx, context);
      return;
    }
    // run_symmetric() declines (every rank alike) an all_to_all whose ranks' splits differ.
    if (zero_copy == nullptr ||
        !run_symmetric(collective, ctx, *transport_->symmetric_memory(), *zero_copy)) {
      run_collective(collective, ctx, plan_);
    }
  });
}

bool TransportBackend::runs_bounced(const Collective& c) const {
  const bool equal_blocks =
      !c.counts.empty() &&
      std::adjacent_find(c.counts.begin(), c.counts.end(), std::not_equal_to<>()) == c.counts.end();
  const bool kind = c.kind == CollectiveKind::AllReduce ||
                    (c.kind == CollectiveKind::ReduceScatter && equal_blocks) ||
                    (c.kind == CollectiveKind::AllGather && equal_blocks);
  if (!kind || c.inputs.size() != 1 || c.outputs.size() != 1) return false;
  // Two ranks' all_gather below kBounceGatherPair: one single-copy message each way is as fast.
  const size_t bound =
      c.kind == CollectiveKind::AllGather && options_.size == 2 ? kBounceGatherPair : kBounceBytes;
  return options_.size > 1 && c.inputs[0].nbytes() >= bound && plan_.nodes.node_count() == 1 &&
         (plan_.algo.empty() || plan_.algo == "auto" || plan_.algo == "bounce") &&
         transport_->symmetric_memory() != nullptr;
}

void TransportBackend::run_bounced(const Collective& c, const collectives::Context& ctx,
                                   const ErrorContext& context) {
  collectives::SymmetricMemory& memory = *transport_->symmetric_memory();
  if (!bounce_) {
    try {
      bounce_ = memory.allocate_bounce(4 * kBounceChunk, ctx.deadline);
    } catch (const Error& e) {
      // A peer that mapped it would wait in its first barrier for this rank: breaking the group
      // tells every peer at once.
      const std::string detail = without_repeats(e.what(), context, e.code());
      break_group(context, std::make_exception_ptr(Error(e.code(), context, detail)));
      throw;
    }
  }
  if (!bounce_) {
    // Every rank of the group gets the same answer from the same layout.
    throw Error(ErrorCode::Internal, "bounce: the transport made no bounce region");
  }
  const Tensor& in = c.inputs[0];
  collectives::SymmetricCall call;
  call.seq = c.seq;
  call.shape = static_cast<uint64_t>(c.kind) | static_cast<uint64_t>(in.dtype) << 8 |
               static_cast<uint64_t>(c.op.kind) << 16;
  call.factor = c.op.kind == ReduceOp::PremulSum ? std::bit_cast<uint64_t>(c.op.factor) : 0;
  call.count = in.count;
  collectives::SymmetricContext sc{.ctx = ctx, .memory = memory, .anchor = *bounce_, .call = call};
  note_algorithm(c.trace, collectives::algorithm_name(collectives::Algorithm::Bounce));
  if (c.kind == CollectiveKind::AllGather) {
    collectives::bounce_all_gather(sc, in.data, c.outputs[0].data, c.counts[0], in.dtype);
  } else if (c.kind == CollectiveKind::ReduceScatter) {
    collectives::bounce_reduce_scatter(sc, in.data, c.outputs[0].data, c.counts[0], in.dtype, c.op);
  } else {
    collectives::bounce_all_reduce(sc, in.data, c.outputs[0].data, in.count, in.dtype, c.op);
  }
}

}  // namespace weft::backends
