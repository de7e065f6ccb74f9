#include "collectives/local_transport.h"

#include <cstring>

#include <fmt/format.h>

#include "collectives/context.h"
#include "runtime/reduce.h"

namespace weft::collectives {
namespace {

std::string where(int rank) { return fmt::format("local transport rank {}", rank); }

}  // namespace

int LocalTransport::size() const { return fabric_.size(); }

Link LocalTransport::link(int peer) const {
  if (peer < 0 || peer >= fabric_.size()) {
    throw_error(ErrorCode::InvalidArgument, where(rank_),
                fmt::format("link to rank {} of a group of {}", peer, fabric_.size()));
  }
  // Threads of one process share memory: the closest real counterpart is shared memory.
  return peer == rank_ ? Link::Self : Link::SharedMemory;
}

Request LocalTransport::send(int peer, const void* data, size_t bytes, Tag tag) {
  fabric_.check_peer(rank_, peer, "send to");
  detail::check_buffer(where(rank_), data, bytes, "send buffer");
  return fabric_.post(rank_, peer, tag,
                      {.send_data = data, .bytes = bytes, .kind = LocalFabric::Kind::Send});
}

Request LocalTransport::recv(int peer, void* data, size_t bytes, Tag tag) {
  fabric_.check_peer(rank_, peer, "receive from");
  detail::check_buffer(where(rank_), data, bytes, "receive buffer");
  return fabric_.post(rank_, peer, tag,
                      {.recv_data = data, .bytes = bytes, .kind = LocalFabric::Kind::Recv});
}

Request LocalTransport::recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op,
                                    Tag tag) {
  fabric_.check_peer(rank_, peer, "receive from");
  const size_t bytes = detail::checked_bytes(where(rank_), count, dtype);
  detail::check_buffer(where(rank_), dst, bytes, "reduce destination");
  reduce::check_supported(dtype, op);
  return fabric_.post(rank_, peer, tag,
                      {.recv_data = dst,
                       .bytes = bytes,
                       .kind = LocalFabric::Kind::RecvReduce,
                       .count = count,
                       .dtype = dtype,
                       .op = op});
}

void LocalTransport::wait(Request request, Clock::time_point deadline) {
  fabric_.wait(rank_, request, deadline);
}

bool LocalTransport::test(Request request) { return fabric_.test(rank_, request); }

void LocalTransport::abort(const std::string& reason) { fabric_.abort(rank_, reason); }

LocalFabric::LocalFabric(int size, size_t eager_limit_bytes)
    : size_(size), eager_limit_bytes_(eager_limit_bytes) {
  if (size < 1) {
    throw_error(ErrorCode::InvalidArgument, "local fabric",
                fmt::format("a group needs at least one rank, not {}", size));
  }
  for (int r = 0; r < size; ++r) {
    transports_.push_back(std::unique_ptr<LocalTransport>(new LocalTransport(*this, r)));
  }
  states_.resize(size);
  next_id_.assign(size, 0);
  aborted_.resize(size);
  wakeups_ = std::make_unique<std::condition_variable[]>(size);
}

LocalFabric::~LocalFabric() = default;

LocalTransport& LocalFabric::transport(int rank) {
  if (rank < 0 || rank >= size_) {
    throw_error(ErrorCode::InvalidArgument, "local fabric",
                fmt::format("no rank {} in a group of {}", rank, size_));
  }
  return *transports_[rank];
}

void LocalFabric::abort_all(const std::string& reason) {
  for (int r = 0; r < size_; ++r) abort(r, reason);
}

void LocalFabric::check_peer(int rank, int peer, const char* what) const {
  if (peer < 0 || peer >= size_ || peer == rank) {
    throw_error(ErrorCode::InvalidArgument, where(rank),
                fmt::format("cannot {} rank {} (group of {})", what, peer, size_));
  }
}

Request LocalFabric::post(int rank, int peer, Tag tag, Posted posted) {
  std::lock_guard lock(mu_);
  const uint64_t id = ++next_id_[rank];
  posted.id = id;
  State& state = states_[rank][id];  // element references survive rehashing
  state.kind = posted.kind;
  state.peer = peer;
  state.tag = tag;
  state.bytes = posted.bytes;
  if (aborted_[rank]) {
    state.done = true;
    state.error = ErrorCode::Aborted;
    state.message = *aborted_[rank];
    return Request{id};
  }
  const bool is_send = posted.kind == Kind::Send;
  const ChannelKey key = is_send ? ChannelKey{rank, peer, tag} : ChannelKey{peer, rank, tag};
  if (auto it = channels_.find(key); it != channels_.end()) {
    std::deque<Posted>& other = is_send ? it->second.recvs : it->second.sends;
    if (!other.empty()) {
      Posted match = std::move(other.front());
      other.pop_front();
      if (it->second.sends.empty() && it->second.recvs.empty()) channels_.erase(it);
      if (is_send) {
        deliver(rank, peer, tag, posted, match);
      } else {
        deliver(peer, rank, tag, match, posted);
      }
      return Request{id};
    }
  }
  // Unmatched. A message from a peer that aborted may never come; its earlier ones came above.
  if (aborted_[peer]) {
    state.done = true;
    state.error = ErrorCode::PeerLost;
    state.message = fmt::format("rank {} aborted: {}", peer, *aborted_[peer]);
    return Request{id};
  }
  if (is_send && posted.bytes <= eager_limit_bytes_) {
    const auto* bytes = static_cast<const std::byte*>(posted.send_data);
    posted.eager.assign(bytes, bytes + posted.bytes);
    posted.is_eager = true;
    posted.send_data = nullptr;
    state.done = true;
  }
  Channel& channel = channels_[key];
  (is_send ? channel.sends : channel.recvs).push_back(std::move(posted));
  return Request{id};
}

void LocalFabric::deliver(int source, int destination, Tag tag, Posted& send, Posted& recv) {
  std::optional<ErrorCode> error;
  std::string message;
  if (send.bytes != recv.bytes) {
    error = ErrorCode::Protocol;
    message = fmt::format("rank {} sent {} bytes with {} but rank {} posted a receive of {}: {}",
                          source, send.bytes, tag_text(tag), destination, recv.bytes, kDesyncHint);
  } else {
    const void* data = send.is_eager ? send.eager.data() : send.send_data;
    try {
      if (recv.kind == Kind::Recv) {
        if (recv.bytes > 0) std::memcpy(recv.recv_data, data, recv.bytes);
      } else {
        reduce::accumulate(recv.recv_data, data, recv.count, recv.dtype, recv.op);
      }
    } catch (const Error& e) {
      error = e.code();
      message = e.what();
    }
  }
  complete(destination, recv.id, error, message);
  if (!send.is_eager) complete(source, send.id, error, message);
}

void LocalFabric::complete(int rank, uint64_t id, std::optional<ErrorCode> error,
                           std::string message) {
  auto it = states_[rank].find(id);
  if (it == states_[rank].end()) return;
  it->second.done = true;
  it->second.error = error;
  it->second.message = std::move(message);
  wakeups_[rank].notify_all();
}

void LocalFabric::cancel(int rank, uint64_t id, const State& state) {
  if (state.done) return;  // delivered, or an eager send whose copy must stay receivable
  const bool is_send = state.kind == Kind::Send;
  const ChannelKey key =
      is_send ? ChannelKey{rank, state.peer, state.tag} : ChannelKey{state.peer, rank, state.tag};
  auto it = channels_.find(key);
  if (it == channels_.end()) return;
  std::deque<Posted>& queue = is_send ? it->second.sends : it->second.recvs;
  for (auto p = queue.begin(); p != queue.end(); ++p) {
    if (p->id == id) {
      queue.erase(p);
      break;
    }
  }
  if (it->second.sends.empty() && it->second.recvs.empty()) channels_.erase(it);
}

void LocalFabric::wait(int rank, Request request, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  auto& states = states_[rank];
  if (states.find(request.id) == states.end()) {
    throw_error(
        ErrorCode::InvalidArgument, where(rank),
        fmt::format("request {} is not pending (never posted, or waited for already)", request.id));
  }
  // Only this rank's thread adds to states_[rank], and it is here: finding again is cheap and
  // never sees a stale iterator.
  auto ready = [&] { return states.find(request.id)->second.done || aborted_[rank]; };
  if (deadline == Clock::time_point::max()) {
    wakeups_[rank].wait(lock, ready);  // wait_until(max) overflows in some libstdc++ versions
  } else {
    wakeups_[rank].wait_until(lock, deadline, ready);
  }
  auto it = states.find(request.id);
  const State state = std::move(it->second);
  states.erase(it);
  const char* what = state.kind == Kind::Send ? "send to" : "receive from";
  if (aborted_[rank]) {
    cancel(rank, request.id, state);
    throw_error(ErrorCode::Aborted, where(rank),
                fmt::format("{} (while waiting for a {} rank {}, {})", *aborted_[rank], what,
                            state.peer, tag_text(state.tag)));
  }
  if (!state.done) {
    cancel(rank, request.id, state);
    throw_error(ErrorCode::Timeout, where(rank),
                fmt::format("{} rank {} with {} did not complete: {} bytes outstanding", what,
                            state.peer, tag_text(state.tag), state.bytes));
  }
  if (state.error) throw_error(*state.error, where(rank), state.message);
}

bool LocalFabric::test(int rank, Request request) {
  std::lock_guard lock(mu_);
  auto it = states_[rank].find(request.id);
  if (it == states_[rank].end()) {
    throw_error(ErrorCode::InvalidArgument, where(rank),
                fmt::format("request {} is not pending", request.id));
  }
  return it->second.done || aborted_[rank];
}

void LocalFabric::abort(int rank, const std::string& reason) {
  std::lock_guard lock(mu_);
  if (aborted_[rank]) return;
  aborted_[rank] = reason.empty() ? std::string("aborted") : reason;
  const std::string lost = fmt::format("rank {} aborted: {}", rank, *aborted_[rank]);
  for (auto it = channels_.begin(); it != channels_.end();) {
    const auto [source, destination, tag] = it->first;
    Channel& channel = it->second;
    if (source == rank) {
      // Peers waiting for the aborted rank's messages lose it; its own unfinished sends end.
      for (Posted& recv : channel.recvs) complete(destination, recv.id, ErrorCode::PeerLost, lost);
      channel.recvs.clear();
      std::erase_if(channel.sends, [&](const Posted& send) {
        if (send.is_eager) return false;  // already sent: still receivable
        complete(rank, send.id, ErrorCode::Aborted, *aborted_[rank]);
        return true;
      });
    } else if (destination == rank) {
      for (Posted& send : channel.sends) {
        if (!send.is_eager) complete(source, send.id, ErrorCode::PeerLost, lost);
      }
      channel.sends.clear();
      for (Posted& recv : channel.recvs) complete(rank, recv.id, ErrorCode::Aborted, lost);
      channel.recvs.clear();
    }
    it = channel.sends.empty() && channel.recvs.empty() ? channels_.erase(it) : std::next(it);
  }
  for (int r = 0; r < size_; ++r) wakeups_[r].notify_all();
}

}  // namespace weft::collectives
