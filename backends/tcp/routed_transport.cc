#include "backends/tcp/routed_transport.h"

#include <algorithm>
#include <atomic>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/config.h"
#include "weft/error.h"

#include "backends/tcp/tcp_mesh.h"
#include "runtime/log.h"

namespace weft::tcp {

using collectives::Clock;
using collectives::Request;
using collectives::Tag;

std::unique_ptr<RoutedTransport> RoutedTransport::connect(Store& store, int rank, int size,
                                                          Options options) {
  TcpMeshOptions mesh_options;
  mesh_options.key_prefix = options.key_prefix;
  mesh_options.timeout = options.timeout;
  mesh_options.group_name = options.group_name;
  const bool shm_on = options.shm.value_or(config().shm);
  mesh_options.shm = shm_on;
  mesh_options.local_only = options.local_only;
  TcpMesh mesh = TcpMesh::connect(store, rank, size, mesh_options);
  std::vector<bool> use_shm(size, false);
  std::vector<int> shm_apart;  // peers on this machine whose /dev/shm is not this rank's
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    use_shm[peer] =
        options.shm_between ? options.shm_between(rank, peer) : shm_on && mesh.shares_shm(peer);
    if (shm_on && !options.shm_between && mesh.same_host(peer) && !mesh.shares_shm(peer)) {
      shm_apart.push_back(peer);
    }
  }
  // Said once per process: every group of the job would repeat it.
  static std::atomic<bool> said_apart{false};
  if (!shm_apart.empty() && !said_apart.exchange(true)) {
    WEFT_LOG_WARN(
        "rank {}/{} group \"{}\": rank(s) {} run on this machine but see another /dev/shm (a "
        "separate mount namespace or container): TCP is used between them, not shared memory",
        rank, size, options.group_name, fmt::join(shm_apart, ", "));
  }
  // Nodes: the classes of ranks that shared memory joins, numbered by their lowest rank.
  std::vector<int> nodes(size);
  for (int a = 0; a < size; ++a) {
    nodes[a] = a;
    for (int b = 0; b < a; ++b) {
      const bool joined =
          options.shm_between ? options.shm_between(a, b) : shm_on && mesh.share_shm(a, b);
      if (joined) {
        nodes[a] = nodes[b];
        break;
      }
    }
  }
  const uint64_t group_id = mesh.group_id();
  std::vector<net::Socket> sockets = mesh.take_sockets();
  std::vector<net::Socket> control(size);
  std::vector<int> shm_peers, tcp_peers;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    if (use_shm[peer]) {
      control[peer] = std::move(sockets[peer]);
      shm_peers.push_back(peer);
    } else {
      tcp_peers.push_back(peer);
    }
  }
  // spans: some rank is on another host (or behind another /dev/shm).
  const bool any_shm = !shm_peers.empty(), spans = !tcp_peers.empty();
  const bool any_tcp = spans && !options.local_only;
  // Once per group and rank: the line that shows whether a launch across hosts was seen as such
  // (shared memory inside a host, TCP between), as NCCL's INFO lines name each peer's transport.
  auto ranks_text = [](const std::vector<int>& ranks) {
    return ranks.empty() ? std::string("none") : fmt::format("{}", fmt::join(ranks, ", "));
  };
  if (options.local_only) {
    WEFT_LOG_DEBUG("rank {}/{} group \"{}\": host memory with rank(s) {}", rank, size,
                   options.group_name, ranks_text(shm_peers));
  } else {
    WEFT_LOG_INFO("rank {}/{} group \"{}\": shared memory with rank(s) {}; TCP with rank(s) {}",
                  rank, size, options.group_name, ranks_text(shm_peers), ranks_text(tcp_peers));
  }
  std::unique_ptr<ShmTransport> shm;
  if (any_shm) {
    ShmTransport::Options shm_options = options.shm_options;
    shm_options.group_name = options.group_name;
    shm_options.key_prefix = options.key_prefix + "/shm";
    shm_options.group_id = group_id;
    shm_options.timeout = options.timeout;
    shm_options.slot_bytes = config().shm_slot_bytes;
    shm = std::make_unique<ShmTransport>(store, rank, size, std::move(control), shm_options);
  }
  std::unique_ptr<TcpTransport> tcp;
  if (any_tcp) {
    TcpTransport::Options tcp_options = options.tcp;
    tcp_options.group_name = options.group_name;
    tcp = std::make_unique<TcpTransport>(rank, size, std::move(sockets), tcp_options);
  }
  ShmTransport* shm_transport = shm.get();
  auto routed =
      std::make_unique<RoutedTransport>(rank, size, std::move(shm), std::move(tcp), nodes);
  if (!shm_on) {
    routed->no_symmetric_ =
        "shared memory is off for this group (WEFT_SHM=0 or the backend setting shm=0)";
  } else {
    // One mapping per host (per class of ranks sharing /dev/shm), of that host's ranks; a rank
    // alone on its host gets a mapping of one block. Across hosts the zero-copy collectives run
    // their inter-host phase over TCP (collectives/symmetric.h).
    ShmSymmetricMemory::Options sym_options;
    sym_options.group_name = options.group_name;
    sym_options.key_prefix = options.key_prefix + "/sym";
    sym_options.group_id = group_id;
    if (spans) sym_options.nodes = std::move(nodes);
    routed->symmetric_ = std::make_unique<ShmSymmetricMemory>(store, rank, size, shm_transport,
                                                              std::move(sym_options));
  }
  return routed;
}

RoutedTransport::RoutedTransport(int rank, int size, std::unique_ptr<ShmTransport> shm,
                                 std::unique_ptr<TcpTransport> tcp, std::vector<int> nodes)
    : rank_(rank),
      size_(size),
      shm_(std::move(shm)),
      tcp_(std::move(tcp)),
      nodes_(std::move(nodes)) {
  WEFT_CHECK(nodes_.empty() || nodes_.size() == static_cast<size_t>(size_));
}

int RoutedTransport::node_of(int r) const {
  return nodes_.empty() ? r : nodes_.at(static_cast<size_t>(r));
}

RoutedTransport::~RoutedTransport() = default;

collectives::Link RoutedTransport::link(int peer) const {
  if (peer == rank_) return collectives::Link::Self;
  if (shm_ && shm_->serves(peer)) return collectives::Link::SharedMemory;
  if (tcp_) return tcp_->link(peer);  // checks the peer
  throw_error(ErrorCode::InvalidArgument, "routed transport",
              fmt::format("rank {} is not a peer of rank {} in a group of {}", peer, rank_, size_));
}

collectives::Transport& RoutedTransport::route(int peer, const char* what) {
  if (shm_ && shm_->serves(peer)) return *shm_;
  if (tcp_) return *tcp_;
  throw_error(ErrorCode::InvalidArgument, "routed transport",
              fmt::format("cannot {} rank {}: no transport serves it", what, peer));
}

Request RoutedTransport::wrap(Side side, Request inner) {
  pending_[side].push_back(inner.id);
  return Request{inner.id << 1 | side};
}

void RoutedTransport::forget(Side side, uint64_t inner) {
  auto& pending = pending_[side];
  auto it = std::find(pending.begin(), pending.end(), inner);
  if (it != pending.end()) pending.erase(it);
}

Request RoutedTransport::send(int peer, const void* data, size_t bytes, Tag tag) {
  Transport& t = route(peer, "send to");
  return wrap(&t == shm_.get() ? kShm : kTcp, t.send(peer, data, bytes, tag));
}

Request RoutedTransport::recv(int peer, void* data, size_t bytes, Tag tag) {
  Transport& t = route(peer, "receive from");
  return wrap(&t == shm_.get() ? kShm : kTcp, t.recv(peer, data, bytes, tag));
}

Request RoutedTransport::recv_any(void* data, size_t bytes, Tag tag, int* source) {
  if (shm_ && tcp_) {
    throw_error(ErrorCode::Unsupported, "routed transport recv from any source",
                "this group reaches some peers through shared memory and others over TCP (ranks "
                "on several hosts); a receive from any source needs one transport: set WEFT_SHM=0 "
                "to use TCP for every peer");
  }
  if (shm_) return wrap(kShm, shm_->recv_any(data, bytes, tag, source));
  if (tcp_) return wrap(kTcp, tcp_->recv_any(data, bytes, tag, source));
  throw_error(ErrorCode::InvalidArgument, "routed transport recv from any source",
              "this rank has no peers");
}

Request RoutedTransport::recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                                     Tag tag) {
  Transport& t = route(peer, "receive from");
  return wrap(&t == shm_.get() ? kShm : kTcp, t.recv_reduce(peer, dst, count, dtype, op, tag));
}

void RoutedTransport::wait(Request request, Clock::time_point deadline) {
  const Side side = static_cast<Side>(request.id & 1);
  const Request inner{request.id >> 1};
  Transport* owner = side == kShm ? static_cast<Transport*>(shm_.get()) : tcp_.get();
  if (owner == nullptr) {
    throw_error(ErrorCode::InvalidArgument, "routed transport wait",
                fmt::format("request {} was not posted here", request.id));
  }
  struct Forget {
    RoutedTransport* self;
    Side side;
    uint64_t inner;
    ~Forget() { self->forget(side, inner); }
  } forget_on_exit{this, side, inner.id};
  // Drives the other side while waiting, as long as it has requests of its own.
  auto other_busy = [&] { return !pending_[side == kShm ? kTcp : kShm].empty(); };
  while (other_busy()) {
    if (owner->test(inner)) break;  // for a TCP request this is also the TCP pass
    // Every TCP connection, not just the front request's: that one may have finished, while a
    // peer's large send waits for this rank to read it (and that peer's progress for ours).
    if (side == kShm) tcp_->poll();
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;  // the owner's wait() reports the timeout and withdraws
    shm_->idle(std::min<Clock::time_point>(deadline, now + kMixedSlice));
  }
  owner->wait(inner, deadline);
}

bool RoutedTransport::test(Request request) {
  const Side side = static_cast<Side>(request.id & 1);
  Transport* owner = side == kShm ? static_cast<Transport*>(shm_.get()) : tcp_.get();
  if (owner == nullptr) {
    throw_error(ErrorCode::InvalidArgument, "routed transport test",
                fmt::format("request {} was not posted here", request.id));
  }
  Transport* other = side == kShm ? static_cast<Transport*>(tcp_.get()) : shm_.get();
  const auto& other_pending = pending_[side == kShm ? kTcp : kShm];
  if (other != nullptr && !other_pending.empty()) {
    if (other == tcp_.get()) {
      tcp_->poll();
    } else {
      shm_->idle(Clock::now());  // moves what can move; never sleeps past now
    }
  }
  return owner->test(Request{request.id >> 1});
}

void RoutedTransport::abort(const std::string& reason) {
  if (shm_) shm_->abort(reason);
  if (tcp_) tcp_->abort(reason);
}

}  // namespace weft::tcp
