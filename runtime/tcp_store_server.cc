// TcpStoreServer: the event loop (accept, read, write, close) around StoreState (the data) and
// StoreRequestParser (the decoding). docs/store-protocol.md documents the bytes and semantics.
#include "weft/tcp_store_server.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <thread>
#include <unordered_map>
#include <vector>

#include "weft/config.h"
#include "weft/error.h"

#include "runtime/fd_limit.h"
#include "runtime/log.h"
#include "runtime/socket.h"
#include "runtime/store_query.h"
#include "runtime/store_server_connection.h"
#include "runtime/store_state.h"

namespace weft {
namespace {

using store_protocol::QueryType;
using Connection = StoreServerConnection;

// epoll user data for the two fds that are not connections; connection ids start above them.
constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstConnectionId = 2;

// One read takes at most this much; a connection gets at most kReadsPerEvent reads per loop turn
// so that one fast sender cannot starve the others (level-triggered epoll brings it back).
constexpr size_t kReadChunk = 64 * 1024;
constexpr int kReadsPerEvent = 4;
constexpr int kMaxEvents = 256;

std::string errno_text() { return std::strerror(errno); }

}  // namespace

class TcpStoreServer::Impl {
 public:
  explicit Impl(TcpStoreServerOptions options);
  ~Impl();

  void stop();
  Stats stats() const;

  uint16_t port() const { return port_; }
  const std::string& host() const { return options_.host; }

 private:
  void run();
  void run_once(epoll_event* events, int count);
  void publish_stats();
  void accept_all();
  // Accepts one pending connection and closes it at once; false when even that is impossible.
  bool refuse_one(int err);  // err: accept's errno, EMFILE or ENFILE
  void on_readable(Connection& c);
  void on_writable(Connection& c);
  // Handles the complete queries in data[0, size); returns the bytes used, which is less than
  // size when a parked WAIT holds the rest back or the connection was closed.
  size_t consume(Connection& c, const uint8_t* data, size_t size);
  // Handles one query; false when it closed the connection.
  bool handle(Connection& c, StoreRequest& request);
  bool handle_store_query(Connection& c, StoreRequest& request);
  // Queues STOP_WAITING for every connection whose WAIT the last query completed. Called after
  // each query, so that a CANCEL_WAIT handled later in the same turn is answered after it.
  void answer_woken();
  // Runs the queries that arrived behind a WAIT now answered (which may complete more waits).
  void resume_held_queries();
  // Checks the connection's reply bound before a reply of `bytes` is queued.
  bool reserve_reply(Connection& c, size_t bytes);
  void mark_dirty(Connection& c);
  void flush(Connection& c);
  void update_accounting(Connection& c);
  void set_want_write(Connection& c, bool want);
  // Closes with a warning naming the peer: a broken limit or protocol rule.
  void close_for_violation(Connection& c, const std::string& reason);
  void close_connection(Connection& c);
  Connection* find(uint64_t id);

  TcpStoreServerOptions options_;
  std::string token_;
  std::string where_;  // "store server 127.0.0.1:29500", starts every log line
  uint16_t port_ = 0;
  net::Socket listener_;
  net::Socket epoll_;
  net::Socket wake_;   // eventfd written by stop()
  net::Socket spare_;  // a reserved fd, freed to accept-and-close when the process is out of fds
  std::thread thread_;
  std::atomic<bool> stopped_{false};

  // Loop-thread state.
  StoreState state_;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::vector<uint64_t> dirty_;   // connections with replies queued this turn
  std::vector<uint64_t> closed_;  // closed this turn, erased at its end
  std::vector<uint64_t> resume_;  // answered WAITs with queries held behind them
  uint64_t next_id_ = kFirstConnectionId;
  size_t total_buffered_ = 0;
  std::vector<uint8_t> read_buffer_;

  // Published for stats() by the loop thread only, at the end of each turn; a violation publishes
  // the buffered bytes (without its connection's) before it counts, so a reader that sees the
  // count also sees those bytes (stats() reads in the reverse order of the writes).
  std::atomic<size_t> stat_connections_{0};
  std::atomic<size_t> stat_keys_{0};
  std::atomic<size_t> stat_parked_{0};
  std::atomic<size_t> stat_violations_{0};
  std::atomic<size_t> stat_buffered_{0};
};

TcpStoreServer::Impl::Impl(TcpStoreServerOptions options)
    : options_(std::move(options)), read_buffer_(kReadChunk) {
  token_ = options_.token.value_or(config().store_token);
  listener_ = net::listen_on(options_.host, options_.port, &port_);
  net::set_nonblocking(listener_.fd());
  where_ = fmt::format("store server {}:{}", options_.host, port_);
  // Anyone who reaches an open store can read and overwrite the job's rendezvous keys. Said once
  // per process: a job's groups do not start servers of their own, but tests start many.
  static std::atomic<bool> warned{false};
  if (token_.empty() && !net::is_loopback(options_.host) && !warned.exchange(true)) {
    WEFT_LOG_WARN(
        "{}: listening on a non-loopback address without authentication: anyone who reaches "
        "port {} can read and overwrite this job's rendezvous keys; set WEFT_STORE_TOKEN to the "
        "same secret on every rank (and launcher) to refuse clients without it",
        where_, port_);
  }

  epoll_ = net::Socket(::epoll_create1(EPOLL_CLOEXEC));
  wake_ = net::Socket(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  spare_ = net::Socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!epoll_.valid() || !wake_.valid()) {
    throw_error(ErrorCode::Io, where_, fmt::format("epoll/eventfd: {}", fd_error_text(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, listener_.fd(), &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, wake_.fd(), &ev);

  WEFT_LOG_INFO("{}: listening{}", where_, token_.empty() ? "" : " (authentication required)");
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::Impl::~Impl() { stop(); }

void TcpStoreServer::Impl::stop() {
  if (stopped_.exchange(true)) return;
  uint64_t one = 1;
  // An eventfd write fails only when its counter would overflow: it is readable then anyway.
  (void)::write(wake_.fd(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  connections_.clear();
  stat_connections_ = 0;
  stat_buffered_ = 0;
}

TcpStoreServer::Stats TcpStoreServer::Impl::stats() const {
  Stats s;
  s.connections = stat_connections_.load();
  s.keys = stat_keys_.load();
  s.parked_waits = stat_parked_.load();
  s.closed_for_violation = stat_violations_.load();
  s.buffered_bytes = stat_buffered_.load();  // after: at least as new as the count
  return s;
}

void TcpStoreServer::Impl::run() {
  epoll_event events[kMaxEvents];
  for (;;) {
    int count = ::epoll_wait(epoll_.fd(), events, kMaxEvents, -1);
    if (count < 0) {
      if (errno == EINTR) continue;
      WEFT_LOG_ERROR("{}: epoll_wait failed, server stops: {}", where_, errno_text());
      return;
    }
    for (int i = 0; i < count; ++i) {
      if (events[i].data.u64 == kWakeId) return;
    }
    try {
      run_once(events, count);
    } catch (const std::exception& e) {
      // Only allocation failure gets here (each query's errors close its own connection).
      WEFT_LOG_ERROR("{}: {}", where_, e.what());
    }
  }
}

void TcpStoreServer::Impl::run_once(epoll_event* events, int count) {
  for (int i = 0; i < count; ++i) {
    uint64_t id = events[i].data.u64;
    if (id == kListenerId) {
      accept_all();
      continue;
    }
    Connection* c = find(id);
    if (c == nullptr) continue;
    uint32_t what = events[i].events;
    if (what & EPOLLOUT) on_writable(*c);
    if (!c->closed() && (what & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) on_readable(*c);
  }
  resume_held_queries();
  // Published before the replies go out, so that a client that has read a reply sees stats at
  // least as new as the query it answers.
  publish_stats();
  for (uint64_t id : dirty_) {
    if (Connection* c = find(id)) flush(*c);
  }
  dirty_.clear();
  publish_stats();
}

void TcpStoreServer::Impl::publish_stats() {
  for (uint64_t id : closed_) connections_.erase(id);
  closed_.clear();
  stat_connections_ = connections_.size();
  stat_keys_ = static_cast<size_t>(state_.num_keys());
  stat_parked_ = state_.parked_count();
  stat_buffered_ = total_buffered_;
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listener_.fd(), reinterpret_cast<sockaddr*>(&addr), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (out_of_descriptors(errno)) {
        const int err = errno;
        if (refuse_one(err)) continue;
        WEFT_LOG_ERROR("{}: cannot refuse connections: {}", where_, fd_error_text(err));
        return;
      }
      WEFT_LOG_WARN("{}: accept failed: {}", where_, errno_text());
      return;
    }
    net::Socket socket(fd);
    std::string peer = net::peer_address(fd);
    if (connections_.size() >= options_.max_connections) {
      WEFT_LOG_WARN("{}: refused connection from {}: {} connections open (max_connections)", where_,
                    peer, connections_.size());
      continue;
    }
    net::set_nodelay(fd);
    uint64_t id = next_id_++;
    StoreRequestLimits limits{
        .max_key_bytes = options_.max_key_bytes,
        .max_value_bytes = options_.max_value_bytes,
        .max_keys_per_query = options_.max_keys_per_query,
        .max_request_bytes = options_.max_buffered_bytes_per_connection,
    };
    auto conn = std::make_unique<Connection>(id, std::move(socket), std::move(peer), limits);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = id;
    if (epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      WEFT_LOG_WARN("{}: cannot watch connection from {}: {}", where_, conn->peer(), errno_text());
      continue;
    }
    connections_.emplace(id, std::move(conn));
  }
}

bool TcpStoreServer::Impl::refuse_one(int err) {
  // Out of file descriptors: the pending connection would keep the listener readable and spin
  // the loop. Free the spare fd, accept the connection and close it at once, then re-reserve.
  spare_.close();
  int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) {
    WEFT_LOG_WARN("{}: refused connection from {}: {}", where_, net::peer_address(fd),
                  fd_error_text(err));
    ::close(fd);
  }
  spare_ = net::Socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  return fd >= 0;
}

void TcpStoreServer::Impl::on_readable(Connection& c) {
  for (int i = 0; i < kReadsPerEvent && !c.closed(); ++i) {
    ssize_t n = ::recv(c.fd(), read_buffer_.data(), read_buffer_.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      WEFT_LOG_DEBUG("{}: connection from {} failed: {}", where_, c.peer(), errno_text());
      close_connection(c);
      return;
    }
    if (n == 0) {
      // The peer is done sending; what it asked for before is answered if the socket takes it.
      if (c.parser().mid_request()) {
        WEFT_LOG_DEBUG("{}: {} closed in the middle of a query", where_, c.peer());
      }
      flush(c);
      close_connection(c);
      return;
    }
    auto size = static_cast<size_t>(n);
    if (c.inbox.empty()) {
      size_t used = consume(c, read_buffer_.data(), size);
      if (c.closed()) return;
      c.inbox.append(reinterpret_cast<const char*>(read_buffer_.data()) + used, size - used);
    } else {
      c.inbox.append(reinterpret_cast<const char*>(read_buffer_.data()), size);
      size_t used = consume(c, reinterpret_cast<const uint8_t*>(c.inbox.data()), c.inbox.size());
      if (c.closed()) return;
      c.inbox.erase(0, used);
    }
    if (c.inbox.size() > options_.max_buffered_bytes_per_connection) {
      close_for_violation(
          c, fmt::format("sent {} bytes of queries behind a parked WAIT (limit {})", c.inbox.size(),
                         options_.max_buffered_bytes_per_connection));
      return;
    }
    update_accounting(c);
    if (c.closed()) return;
    // A short read drained the socket: skip the recv that would only say EAGAIN (one syscall per
    // query saved). Safe because the epoll registration is level-triggered.
    if (size < read_buffer_.size()) break;
  }
}

void TcpStoreServer::Impl::on_writable(Connection& c) { flush(c); }

size_t TcpStoreServer::Impl::consume(Connection& c, const uint8_t* data, size_t size) {
  size_t pos = 0;
  while (pos < size && !c.closed()) {
    if (state_.parked(c.id())) {
      // One query in flight per connection, except CANCEL_WAIT after WAIT: anything else waits
      // until the WAIT is answered, so replies stay in query order.
      if (data[pos] != static_cast<uint8_t>(QueryType::CancelWait)) break;
      ++pos;
      state_.unpark(c.id());
      if (!reserve_reply(c, 1)) break;
      c.put_u8(static_cast<uint8_t>(store_protocol::WaitResponse::WaitCanceled));
      mark_dirty(c);
      continue;
    }
    // Handshake queries are refused on their type byte once the handshake is over (a server
    // without a token knows no AUTH_* queries), without waiting for their arguments.
    if (c.phase == Connection::Phase::Ready && !c.parser().mid_request()) {
      auto type = static_cast<QueryType>(data[pos]);
      if (type == QueryType::Validate || type == QueryType::AuthChallenge ||
          type == QueryType::AuthProof) {
        close_for_violation(c, fmt::format("unexpected query type {} ({}) after the handshake",
                                           data[pos], query_name(type)));
        break;
      }
    }
    // Before authentication only the expected query is read at all, so an unauthenticated
    // client cannot make the server buffer a large value.
    if (c.phase != Connection::Phase::Ready && !c.parser().mid_request()) {
      uint8_t expected = static_cast<uint8_t>(
          c.phase == Connection::Phase::Validate        ? QueryType::Validate
          : c.phase == Connection::Phase::AuthChallenge ? QueryType::AuthChallenge
                                                        : QueryType::AuthProof);
      if (data[pos] != expected) {
        const char* reason = c.phase == Connection::Phase::Validate
                                 ? "first query is not VALIDATE"
                                 : "query before authentication (the server requires "
                                   "WEFT_STORE_TOKEN)";
        close_for_violation(c, fmt::format("{} (type {})", reason, data[pos]));
        break;
      }
    }
    size_t used = 0;
    auto status = c.parser().feed(data + pos, size - pos, &used);
    pos += used;
    if (status == StoreRequestParser::Status::Violation) {
      close_for_violation(c, c.parser().error());
      break;
    }
    if (status == StoreRequestParser::Status::NeedMore) break;
    StoreRequest request = c.parser().take_request();
    bool open = handle(c, request);
    answer_woken();
    if (!open) break;
  }
  return pos;
}

bool TcpStoreServer::Impl::handle(Connection& c, StoreRequest& request) {
  switch (c.phase) {
    case Connection::Phase::Validate:
      if (request.number != store_protocol::kValidationMagic) {
        close_for_violation(c, fmt::format("VALIDATE with magic {:#x}, not {:#x}", request.number,
                                           store_protocol::kValidationMagic));
        return false;
      }
      c.phase = token_.empty() ? Connection::Phase::Ready : Connection::Phase::AuthChallenge;
      return true;
    case Connection::Phase::AuthChallenge:
      c.nonce = store_auth::make_nonce();
      c.put_raw(std::string_view(reinterpret_cast<const char*>(c.nonce.data()), c.nonce.size()));
      mark_dirty(c);
      c.phase = Connection::Phase::AuthProof;
      return true;
    case Connection::Phase::AuthProof: {
      store_auth::Mac mac{};
      std::memcpy(mac.data(), request.mac.data(), mac.size());
      if (store_auth::verify(token_, c.nonce, mac)) {
        c.put_u8(1);
        mark_dirty(c);
        c.phase = Connection::Phase::Ready;
        return true;
      }
      c.put_u8(0);
      flush(c);
      close_for_violation(c, "authentication failed: wrong token");
      return false;
    }
    case Connection::Phase::Ready:
      return handle_store_query(c, request);
  }
  return false;
}

bool TcpStoreServer::Impl::handle_store_query(Connection& c, StoreRequest& request) {
  StoreQueryResult result =
      execute_store_query(state_, c, request, options_.max_pending_reply_bytes_per_connection);
  switch (result.outcome) {
    case StoreQueryResult::Outcome::Replied:
      // Small fixed-size replies are checked once queued; value replies were sized before.
      if (!reserve_reply(c, 0)) return false;
      mark_dirty(c);
      return true;
    case StoreQueryResult::Outcome::NoReply:
      return true;
    case StoreQueryResult::Outcome::Violation:
      close_for_violation(c, result.reason);
      return false;
  }
  return false;
}

void TcpStoreServer::Impl::answer_woken() {
  for (uint64_t id : state_.take_woken()) {
    Connection* c = find(id);
    if (c == nullptr || !reserve_reply(*c, 1)) continue;
    c->put_u8(static_cast<uint8_t>(store_protocol::WaitResponse::StopWaiting));
    mark_dirty(*c);
    if (!c->inbox.empty()) resume_.push_back(id);
  }
}

void TcpStoreServer::Impl::resume_held_queries() {
  while (!resume_.empty()) {
    uint64_t id = resume_.back();
    resume_.pop_back();
    Connection* c = find(id);
    if (c == nullptr || state_.parked(id) || c->inbox.empty()) continue;
    size_t used = consume(*c, reinterpret_cast<const uint8_t*>(c->inbox.data()), c->inbox.size());
    if (c->closed()) continue;
    c->inbox.erase(0, used);
    if (c->inbox.empty()) std::string().swap(c->inbox);
    update_accounting(*c);
  }
}

bool TcpStoreServer::Impl::reserve_reply(Connection& c, size_t bytes) {
  if (c.pending_reply_bytes() + bytes <= options_.max_pending_reply_bytes_per_connection) {
    return true;
  }
  close_for_violation(c, fmt::format("{} bytes of replies would be queued (limit {}): the client "
                                     "does not read them",
                                     c.pending_reply_bytes() + bytes,
                                     options_.max_pending_reply_bytes_per_connection));
  return false;
}

void TcpStoreServer::Impl::mark_dirty(Connection& c) {
  if (c.pending_reply_bytes() > 0) dirty_.push_back(c.id());
}

void TcpStoreServer::Impl::flush(Connection& c) {
  if (c.closed()) return;
  switch (c.flush()) {
    case Connection::FlushResult::Done:
      set_want_write(c, false);
      break;
    case Connection::FlushResult::WouldBlock:
      set_want_write(c, true);
      break;
    case Connection::FlushResult::Failed:
      WEFT_LOG_DEBUG("{}: cannot send to {}: {}", where_, c.peer(), errno_text());
      close_connection(c);
      return;
  }
  update_accounting(c);
}

void TcpStoreServer::Impl::update_accounting(Connection& c) {
  size_t now = c.closed() ? 0 : c.buffered_bytes();
  total_buffered_ = total_buffered_ - c.accounted_bytes + now;
  c.accounted_bytes = now;
  if (total_buffered_ > options_.max_total_buffered_bytes && now > 0) {
    close_for_violation(c, fmt::format("server holds {} buffered bytes for all connections "
                                       "(limit {})",
                                       total_buffered_, options_.max_total_buffered_bytes));
  }
}

void TcpStoreServer::Impl::set_want_write(Connection& c, bool want) {
  if (c.want_write == want) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want ? uint32_t{EPOLLOUT} : uint32_t{0});
  ev.data.u64 = c.id();
  epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, c.fd(), &ev);
  c.want_write = want;
}

void TcpStoreServer::Impl::close_for_violation(Connection& c, const std::string& reason) {
  if (c.closed()) return;
  WEFT_LOG_WARN("{}: closing connection from {}: {}", where_, c.peer(), reason);
  // Published before the descriptor closes (a client may ask for stats as soon as it sees the
  // close), bytes first, already without this connection's.
  stat_buffered_ = total_buffered_ - c.accounted_bytes;
  ++stat_violations_;
  close_connection(c);
}

void TcpStoreServer::Impl::close_connection(Connection& c) {
  if (c.closed()) return;
  state_.unpark(c.id());
  c.close();  // closing the fd also removes it from the epoll set
  total_buffered_ -= c.accounted_bytes;
  c.accounted_bytes = 0;
  closed_.push_back(c.id());
}

StoreServerConnection* TcpStoreServer::Impl::find(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end() || it->second->closed()) return nullptr;
  return it->second.get();
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
TcpStoreServer::~TcpStoreServer() = default;
uint16_t TcpStoreServer::port() const { return impl_->port(); }
const std::string& TcpStoreServer::host() const { return impl_->host(); }
void TcpStoreServer::stop() { impl_->stop(); }
TcpStoreServer::Stats TcpStoreServer::stats() const { return impl_->stats(); }

}  // namespace weft
