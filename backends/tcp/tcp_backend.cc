#include "backends/tcp/tcp_backend.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"

#include "collectives/binomial_tree.h"
#include "collectives/bruck.h"
#include "collectives/context.h"
#include "collectives/dissemination.h"
#include "collectives/gather_scatter.h"
#include "collectives/halving_doubling.h"
#include "collectives/pairwise.h"
#include "collectives/recursive_doubling.h"
#include "collectives/ring.h"
#include "runtime/log.h"

namespace weft::tcp {

using collectives::Algorithm;
using collectives::Clock;
using collectives::Link;
using collectives::Op;

namespace {

// Send/recv tags live above every collective's (make_tag puts the sequence number in bits 24..63,
// and a group never reaches 2^39 collectives), so a user's tag never matches a collective's.
constexpr collectives::Tag kPointToPointBit = uint64_t{1} << 63;

// The group store key where the first rank to see a failure says what it saw.
constexpr const char* kFailureKey = "tcp/failure";

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

bool all_equal(const std::vector<size_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

Link slowest_of(const RoutedTransport& transport) {
  Link slowest = Link::Self;
  for (int peer = 0; peer < transport.size(); ++peer) {
    if (peer == transport.rank()) continue;
    Link link = transport.link(peer);
    if (link == Link::Tcp || link == Link::Ucx) return link;
    slowest = link;
  }
  return slowest;
}

}  // namespace

std::unique_ptr<TcpBackend> TcpBackend::create(const BackendOptions& options) {
  RoutedTransport::Options transport_options;
  transport_options.group_name = options.group_name;
  transport_options.key_prefix = "tcp";
  transport_options.timeout = options.timeout;
  if (auto it = options.settings.find("shm"); it != options.settings.end()) {
    if (it->second != "0" && it->second != "1") {
      throw_error(ErrorCode::InvalidArgument, "tcp backend",
                  fmt::format("setting shm=\"{}\": expected 0 or 1", it->second));
    }
    transport_options.shm = it->second == "1";
  }
  auto transport =
      RoutedTransport::connect(*options.store, options.rank, options.size, transport_options);
  return std::make_unique<TcpBackend>(options, std::move(transport));
}

TcpBackend::TcpBackend(const BackendOptions& options, std::unique_ptr<RoutedTransport> transport)
    : options_(options), transport_(std::move(transport)) {
  slowest_link_ = slowest_of(*transport_);
  auto algo = options_.settings.find("algo");
  algo_ = algo != options_.settings.end() ? algo->second : config().algo;
  // An unknown name fails here, at setup, rather than at the first collective.
  collectives::choose(collectives::Op::AllReduce, 0, options_.size, slowest_link_, algo_);
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

TcpBackend::~TcpBackend() {
  // Drain and join before the transport goes: queued collectives still use it.
  thread_.reset();
}

std::shared_ptr<Work> TcpBackend::post(Collective collective, ErrorContext context) {
  const bool defer = bytes_moved(collective) <= kDeferBytes;
  auto task = [this, collective = std::move(collective), context] { run(collective, context); };
  return thread_->submit(std::move(context), std::move(task), defer);
}

std::shared_ptr<Work> TcpBackend::post_coalesced(std::vector<Collective> collectives,
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
        for (size_t k = i; k < end; ++k) requests.push_back(post_p2p(collectives[k]));
        for (collectives::Request request : requests) transport_->wait(request, deadline);
      });
      i = end;
    }
  };
  return thread_->submit(std::move(context), std::move(task), defer);
}

void TcpBackend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  thread_->abort(reason);
}

void TcpBackend::run(const Collective& collective, const ErrorContext& context) {
  guarded(context, [&](Clock::time_point deadline) { run_unchecked(collective, deadline); });
}

void TcpBackend::guarded(const ErrorContext& context,
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
      std::string record = failure_record();
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

void TcpBackend::break_group(const ErrorContext& context, std::exception_ptr error) {
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
  // name the rank really lost. Best effort: the store may be gone with the rank that hosted it.
  try {
    std::string text = fmt::format("rank {}: {}", options_.rank, what);
    options_.store->compare_set(kFailureKey, std::vector<uint8_t>{},
                                std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    WEFT_LOG_DEBUG("{}: could not record the failure in the store: {}", context.describe(),
                   e.what());
  }
  transport_->abort("the group broke: " + what);
}

std::string TcpBackend::failure_record() {
  try {
    if (!options_.store->check({kFailureKey})) return {};
    std::vector<uint8_t> value = options_.store->get(kFailureKey, std::chrono::milliseconds(1000));
    return std::string(value.begin(), value.end());
  } catch (const std::exception&) {
    return {};
  }
}

void TcpBackend::run_unchecked(const Collective& c, Clock::time_point deadline) {
  collectives::Context ctx{*transport_, c.seq, deadline};
  ctx.scratch = &scratch_;
  const int size = transport_->size();
  const int rank = transport_->rank();
  const std::string& forced = algo_;
  auto in = [&](size_t i = 0) -> const void* { return c.inputs.at(i).data; };
  auto out = [&](size_t i = 0) -> void* { return c.outputs.at(i).data; };
  const DType dtype = !c.inputs.empty()    ? c.inputs[0].dtype
                      : !c.outputs.empty() ? c.outputs[0].dtype
                                           : DType::Float32;

  switch (c.kind) {
    case CollectiveKind::AllReduce: {
      const size_t count = c.inputs[0].count;
      Algorithm algorithm =
          collectives::choose(Op::AllReduce, c.inputs[0].nbytes(), size, slowest_link_, forced);
      if (algorithm == Algorithm::RecursiveDoubling) {
        collectives::recursive_doubling_all_reduce(ctx, in(), out(), count, dtype, c.op);
      } else if (algorithm == Algorithm::HalvingDoubling) {
        collectives::halving_doubling_all_reduce(ctx, in(), out(), count, dtype, c.op);
      } else {
        collectives::ring_all_reduce(ctx, in(), out(), count, dtype, c.op);
      }
      return;
    }
    case CollectiveKind::Reduce:
      collectives::binomial_reduce(ctx, in(), rank == c.root ? out() : nullptr, c.inputs[0].count,
                                   dtype, c.op, c.root);
      return;
    case CollectiveKind::Broadcast: {
      const Tensor& data = c.outputs[0];
      if (rank == c.root && c.inputs[0].data != data.data && data.count > 0) {
        std::memcpy(data.data, c.inputs[0].data, data.nbytes());
      }
      collectives::binomial_broadcast(ctx, data.data, data.nbytes(), c.root);
      return;
    }
    case CollectiveKind::AllGather: {
      if (all_equal(c.counts)) {
        const size_t count = c.counts.empty() ? 0 : c.counts[0];
        Algorithm algorithm =
            collectives::choose(Op::AllGather, c.outputs[0].nbytes(), size, slowest_link_, forced);
        if (algorithm == Algorithm::Bruck) {
          collectives::bruck_all_gather(ctx, in(), out(), count, dtype);
        } else {
          collectives::ring_all_gather(ctx, in(), out(), count, dtype);
        }
      } else {
        collectives::ring_all_gather(ctx, in(), out(), c.counts, dtype);
      }
      return;
    }
    case CollectiveKind::ReduceScatter: {
      Algorithm algorithm =
          collectives::choose(Op::ReduceScatter, c.inputs[0].nbytes(), size, slowest_link_, forced);
      if (algorithm == Algorithm::HalvingDoubling) {
        collectives::halving_doubling_reduce_scatter(ctx, in(), out(), c.counts, dtype, c.op);
      } else {
        collectives::ring_reduce_scatter(ctx, in(), out(), c.counts, dtype, c.op);
      }
      return;
    }
    case CollectiveKind::Gather:
      collectives::linear_gather(ctx, in(), rank == c.root ? out() : nullptr, c.inputs[0].count,
                                 dtype, c.root);
      return;
    case CollectiveKind::Scatter:
      collectives::linear_scatter(ctx, rank == c.root ? in() : nullptr, out(), c.outputs[0].count,
                                  dtype, c.root);
      return;
    case CollectiveKind::AllToAll:
      if (all_equal(c.send_counts) && all_equal(c.recv_counts) && c.send_counts == c.recv_counts) {
        const size_t count = c.send_counts.empty() ? 0 : c.send_counts[0];
        collectives::pairwise_all_to_all(ctx, in(), out(), count, dtype);
      } else {
        collectives::pairwise_all_to_all(ctx, in(), out(), c.send_counts, c.recv_counts, dtype);
      }
      return;
    case CollectiveKind::Barrier:
      collectives::dissemination_barrier(ctx);
      return;
    case CollectiveKind::Send:
    case CollectiveKind::Recv:
      transport_->wait(post_p2p(c), deadline);
      return;
  }
  throw Error(ErrorCode::Unsupported,
              fmt::format("tcp backend: unknown collective kind {}", static_cast<int>(c.kind)));
}

collectives::Request TcpBackend::post_p2p(const Collective& c) {
  if (c.kind == CollectiveKind::Send) {
    return transport_->send(c.peer, c.inputs.at(0).data, c.inputs[0].nbytes(),
                            kPointToPointBit | c.tag);
  }
  return transport_->recv(c.peer, c.outputs.at(0).data, c.outputs[0].nbytes(),
                          kPointToPointBit | c.tag);
}

namespace {

const BackendRegistration kRegistration{Registry::Entry{
    "tcp",
    {DeviceKind::Cpu},
    [](const BackendOptions& options) -> std::unique_ptr<Backend> {
      return TcpBackend::create(options);
    },
}};

}  // namespace

}  // namespace weft::tcp
