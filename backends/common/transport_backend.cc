#include "backends/common/transport_backend.h"

#include <algorithm>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"

#include "collectives/context.h"
#include "runtime/log.h"

namespace weft::backends {

using collectives::Clock;

namespace {

// Collectives moving at most this many bytes per rank start deferred (ProgressThread): a caller
// that waits for one runs it without waking the progress thread, whose two wake-ups would
// otherwise double its latency. Above it, the transfer dwarfs a wake-up, and starting at once on
// the progress thread gives the caller the most overlap.
constexpr size_t kDeferBytes = 64 * 1024;

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
  auto algo = options_.settings.find("algo");
  plan_.algo = algo != options_.settings.end() ? algo->second : config().algo;
  // An unknown name fails here, at setup, rather than at the first collective.
  collectives::choose(collectives::Op::AllReduce, 0, options_.size, plan_.slowest_link, plan_.algo);
  // Caller runs: every collective honours its deadline (the group's timeout), so a caller waiting
  // for one may run it on its own thread, saving two thread wake-ups per small collective.
  // A Work's default wait() gives the collective's own deadline (the group timeout, counted from
  // its start) a margin to fire first: its Timeout names the rank not heard from; wait()'s
  // generic one cannot.
  const auto margin =
      std::max<std::chrono::milliseconds>(std::chrono::seconds(1), options_.timeout / 10);
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
  auto task = [this, collective = std::move(collective), context] { run(collective, context); };
  return thread_->submit(std::move(context), std::move(task), defer);
}

std::shared_ptr<Work> TransportBackend::post_coalesced(std::vector<Collective> collectives,
                                                       ErrorContext context) {
  size_t bytes = 0;
  for (const Collective& collective : collectives) bytes += bytes_moved(collective);
  const bool defer = bytes <= kDeferBytes;
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
      guarded(batch, [&](Clock::time_point deadline) {
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
  return thread_->submit(std::move(context), std::move(task), defer);
}

void TransportBackend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  thread_->abort(reason);
}

void TransportBackend::guarded(const ErrorContext& context,
                               const std::function<void(Clock::time_point)>& body) {
  if (broken_) std::rethrow_exception(broken_);
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  try {
    body(deadline);
  } catch (const Error& error) {
    // Every error leaves with the collective's context in front: rank, group, op, #seq.
    std::string detail = error.what();
    if (error.code() == ErrorCode::Aborted) {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (!abort_reason_.empty()) detail = abort_reason_ + " (" + detail + ")";
    }
    if (error.code() == ErrorCode::PeerLost) {
      // A peer that hung up may have done so because it broke first: the record in the store
      // names the rank really lost, so it leads the message.
      std::string record = failure_.first();
      if (!record.empty()) {
        detail = fmt::format("first failure in the group: {}; seen here as: {}", record, detail);
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
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  }
  WEFT_LOG_WARN("{}: the group is broken; later collectives fail at once: {}", context.describe(),
                what);
  // Say what happened first, then hang up, so that a peer which learns of it from the hang-up can
  // name the rank really lost.
  failure_.record(context, what);
  transport_->abort("the group broke: " + what);
}

void TransportBackend::run(const Collective& collective, const ErrorContext& context) {
  guarded(context, [&](Clock::time_point deadline) {
    collectives::Context ctx{*transport_, collective.seq, deadline};
    ctx.scratch = &scratch_;
    run_collective(collective, ctx, plan_);
  });
}

}  // namespace weft::backends
