#include "backends/tcp/tcp_mesh.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"

#include "backends/common/transport_util.h"
#include "runtime/error_record.h"
#include "runtime/fd_limit.h"
#include "runtime/log.h"

namespace weft::tcp {
namespace {

using backends::ranks_that;

constexpr uint32_t kHandshakeMagic = 0x4d544657;  // "WFTM" read as little-endian bytes
constexpr uint16_t kHandshakeVersion = 1;
constexpr size_t kHandshakeBytes = 32;
constexpr const char* kRecordVersion = "weft-tcp-v3";
// How long connection refusals from a published address may last before they are final: the
// peer published its address after it started listening, so a refusal means the address does
// not reach it (or it died), not that it is late. Lost SYNs are retried until the deadline.
constexpr std::chrono::milliseconds kRefusedGrace{1000};
// Written in place of a record by a rank that failed before it could publish one.
constexpr const char* kFailedRecord = "weft-tcp-failed";
// How long set-up may be quiet before a rank looks whether another has given up.
constexpr std::chrono::milliseconds kFailureCheck{250};

// Test-only (docs/configuration.md): WEFT_TEST_KILL_AT=mesh_connect[:N] makes this process
// SIGKILL itself in its Nth TCP mesh set-up (default the first, the world's), just after it
// published its address and before it connects: a moment the fault tests
// (tests/hosts/fault_kill_test.py) cannot hit from outside. The variable is read once per
// process; unset, each set-up pays one test of a static.
void kill_here_if_asked() {
  static const int target = [] {
    const char* text = std::getenv("WEFT_TEST_KILL_AT");
    if (text == nullptr) return 0;
    std::string_view value(text);
    if (value == "mesh_connect") return 1;
    if (!value.starts_with("mesh_connect:")) return 0;
    return std::max(0, std::atoi(text + std::strlen("mesh_connect:")));
  }();
  if (target == 0) return;
  static std::atomic<int> set_ups{0};
  if (++set_ups == target) ::raise(SIGKILL);
}

// Where the first rank that gives up on set-up writes "rank\ncode\nmessage".
std::string failure_key(const TcpMeshOptions& options) {
  return fmt::format("{}/failure", options.key_prefix);
}

// Throws what another rank failed with, when one has given up on set-up.
void throw_if_a_rank_failed(Store& store, const TcpMeshOptions& options, const std::string& where) {
  const std::string key = failure_key(options);
  if (!store.check({key})) return;
  std::istringstream in(to_string(store.get(key)));
  std::string rank, code;
  std::getline(in, rank);
  std::getline(in, code);
  std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  throw_error(code_from(code), where,
              fmt::format("rank {} gave up on connection set-up: {}", rank, message));
}

// The first bytes each side of a connection sends. Fixed little-endian layout:
// magic u32, version u16, reserved u16, group id u64, from u32, to u32, size u32, reserved u32.
struct Handshake {
  uint32_t magic = kHandshakeMagic;
  uint16_t version = kHandshakeVersion;
  uint64_t group_id = 0;
  uint32_t from = 0;
  uint32_t to = 0;
  uint32_t size = 0;
};

template <typename T>
void put_le(uint8_t* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

template <typename T>
T get_le(const uint8_t* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(in[i]) << (8 * i);
  return value;
}

void encode(const Handshake& h, uint8_t* out) {
  std::memset(out, 0, kHandshakeBytes);
  put_le(out, h.magic);
  put_le(out + 4, h.version);
  put_le(out + 8, h.group_id);
  put_le(out + 16, h.from);
  put_le(out + 20, h.to);
  put_le(out + 24, h.size);
}

Handshake decode(const uint8_t* in) {
  Handshake h;
  h.magic = get_le<uint32_t>(in);
  h.version = get_le<uint16_t>(in + 4);
  h.group_id = get_le<uint64_t>(in + 8);
  h.from = get_le<uint32_t>(in + 16);
  h.to = get_le<uint32_t>(in + 20);
  h.size = get_le<uint32_t>(in + 24);
  return h;
}

uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a 64-bit offset basis and prime
  for (char c : text) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string shm_text(std::optional<bool> shm) { return shm ? (*shm ? "1" : "0") : "-"; }

// The local address the kernel would use to reach `remote`: connect() on a UDP socket picks the
// route and source address without sending anything.
std::string local_address_towards(const std::string& remote) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* list = nullptr;
  if (getaddrinfo(remote.c_str(), "9", &hints, &list) != 0 || list == nullptr) return "";
  std::string result;
  for (addrinfo* a = list; a && result.empty(); a = a->ai_next) {
    net::Socket s(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!s.valid() || ::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[NI_MAXHOST] = {};
    if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text, sizeof(text), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      result = text;
    }
  }
  freeaddrinfo(list);
  return result;
}

// The address to listen on and publish, and where it came from (for messages), in this order:
// the caller's, WEFT_HOST_ADDR, WEFT_SOCKET_IFNAME's address, the local address that routes to
// options.route_to, the local end of the store's connection, and 127.0.0.1 last (a store on
// loopback, or no network store: every rank is on this host).
struct ChosenHost {
  std::string host;
  std::string source;
};

ChosenHost choose_host(const TcpMeshOptions& options, const Store& store,
                       const std::string& where) {
  if (!options.host.empty()) return {options.host, "the backend's host option"};
  const Config& c = config();
  if (!c.host_addr.empty()) return {c.host_addr, "WEFT_HOST_ADDR"};
  if (!c.socket_ifname.empty()) {
    std::string available;
    std::string address = net::interface_address(c.socket_ifname, &available);
    if (address.empty()) {
      throw_error(ErrorCode::InvalidArgument, where,
                  fmt::format("WEFT_SOCKET_IFNAME=\"{}\": this host has no interface of that "
                              "name with an address (interfaces: {})",
                              c.socket_ifname, available.empty() ? "none" : available));
    }
    return {address, fmt::format("WEFT_SOCKET_IFNAME={}", c.socket_ifname)};
  }
  if (!options.route_to.empty() && !net::is_loopback(options.route_to)) {
    std::string local = local_address_towards(options.route_to);
    if (!local.empty()) return {local, fmt::format("the route to {}", options.route_to)};
  }
  std::string via_store = store.local_address();
  if (!via_store.empty() && !net::is_loopback(via_store)) {
    return {via_store, "the interface that reaches the store"};
  }
  return {"127.0.0.1", "loopback (the store is on this host)"};
}

PeerRecord decode_record(const Bytes& bytes, int peer, uint64_t* nonce, const std::string& where) {
  std::istringstream in(to_string(bytes));
  std::string version, host, port, fingerprint, domain, nonce_text, shm;
  std::getline(in, version);
  std::getline(in, host);
  std::getline(in, port);
  std::getline(in, fingerprint);
  std::getline(in, domain);
  std::getline(in, nonce_text);
  std::getline(in, shm);
  if (version == kFailedRecord) {
    // host holds the error code, the rest its message (written by a rank that gave up).
    std::string rest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string message = port + (rest.empty() ? "" : "\n" + rest);
    throw_error(code_from(host), where,
                fmt::format("rank {} gave up before it published its address: {}", peer, message));
  }
  char* end = nullptr;
  unsigned long port_value = std::strtoul(port.c_str(), &end, 10);
  bool port_ok = !port.empty() && end && *end == '\0' && port_value > 0 && port_value < 65536;
  const bool shm_ok = shm == "shm=0" || shm == "shm=1" || shm == "shm=-";
  if (version != kRecordVersion || host.empty() || !port_ok || nonce_text.size() != 16 || !shm_ok) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("rank {}'s record in the store is not a {} record: \"{}\"", peer,
                            kRecordVersion, to_string(bytes)));
  }
  *nonce = std::strtoull(nonce_text.c_str(), nullptr, 16);
  std::optional<bool> peer_shm;
  if (shm != "shm=-") peer_shm = shm == "shm=1";
  return PeerRecord{host, static_cast<uint16_t>(port_value), fingerprint, domain, peer_shm};
}

void set_blocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

// Ranks on one host must agree on shared memory: one with it on would wait for the other's
// shared-memory record until the timeout. Every rank sees the same records, so all fail together.
void check_shm_agrees(const std::vector<PeerRecord>& records, int rank, const std::string& where) {
  const PeerRecord& mine = records[rank];
  for (size_t r = 0; r < records.size(); ++r) {
    const PeerRecord& peer = records[r];
    if (!mine.shm || !peer.shm || *peer.shm == *mine.shm || peer.fingerprint != mine.fingerprint ||
        peer.shm_domain != mine.shm_domain) {
      continue;
    }
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("ranks on one host disagree on shared memory: rank {} has WEFT_SHM={}, "
                            "rank {} (this rank) has WEFT_SHM={} (set WEFT_SHM, or the backend's "
                            "shm setting, the same on every rank)",
                            r, shm_text(peer.shm), rank, shm_text(mine.shm)));
  }
}

int poll_timeout_ms(net::Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - net::Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// "node7" from a fingerprint "node7/<boot id>".
std::string host_name(const std::string& fingerprint) {
  return fingerprint.substr(0, fingerprint.rfind('/'));
}

}  // namespace

// Two processes of one machine (same boot id) with different values (containers with host
// networking, separate mount namespaces) cannot open each other's segments.
std::string TcpMesh::shm_domain() {
  struct stat st {};
  if (::stat("/dev/shm", &st) != 0) return "none";
  return fmt::format("{:x}:{:x}", static_cast<uint64_t>(st.st_dev),
                     static_cast<uint64_t>(st.st_ino));
}

std::string TcpMesh::encode_record(const PeerRecord& peer, uint64_t nonce) {
  return fmt::format("{}\n{}\n{}\n{}\n{}\n{:016x}\nshm={}\n", kRecordVersion, peer.host, peer.port,
                     peer.fingerprint, peer.shm_domain, nonce, shm_text(peer.shm));
}

std::string TcpMesh::host_fingerprint() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  // Out of descriptors, the boot id would read as unknown and this host as another one, and
  // set-up would then fail blaming the peers' addresses: say what is wrong instead.
  if (!in.is_open() && out_of_descriptors(errno)) {
    throw_error(ErrorCode::Io, "tcp mesh: read /proc/sys/kernel/random/boot_id",
                fd_error_text(errno));
  }
  std::getline(in, boot_id);
  return fmt::format("{}/{}", name, boot_id.empty() ? "unknown-boot" : boot_id);
}

bool TcpMesh::same_host(int peer) const {
  WEFT_CHECK(peer >= 0 && peer < size_ && static_cast<size_t>(size_) == records_.size());
  return records_[peer].fingerprint == records_[rank_].fingerprint;
}

bool TcpMesh::shares_shm(int peer) const { return share_shm(rank_, peer); }

bool TcpMesh::share_shm(int a, int b) const {
  WEFT_CHECK(a >= 0 && a < size_ && b >= 0 && b < size_ &&
             static_cast<size_t>(size_) == records_.size());
  return records_[a].fingerprint == records_[b].fingerprint &&
         records_[a].shm_domain == records_[b].shm_domain;
}

std::vector<net::Socket> TcpMesh::take_sockets() { return std::move(sockets_); }

TcpMesh TcpMesh::connect(Store& store, int rank, int size, const TcpMeshOptions& options) {
  const std::string where =
      fmt::format("rank {}/{} group \"{}\" tcp mesh", rank, size, options.group_name);
  if (size < 1 || rank < 0 || rank >= size) {
    throw_error(ErrorCode::InvalidArgument, where, "rank must be in [0, size) and size >= 1");
  }
  bool published = false;
  try {
    return connect_ranks(store, rank, size, options, where, &published);
  } catch (const Error& e) {
    // Tell the others, so that they fail now naming this rank instead of waiting for it until
    // the timeout: before publishing, in place of this rank's record (they wait for it); after,
    // under the failure key (they look while they wait for connections). Best effort.
    const std::string message = fmt::format("{}\n{}", static_cast<int>(e.code()), e.what());
    try {
      const std::string key = fmt::format("{}/{}", options.key_prefix, rank);
      if (!published) store.set(key, fmt::format("{}\n{}", kFailedRecord, message));
      store.compare_set(failure_key(options), {}, to_bytes(fmt::format("{}\n{}", rank, message)));
    } catch (const std::exception&) {
    }
    throw;
  }
}

TcpMesh TcpMesh::connect_ranks(Store& store, int rank, int size, const TcpMeshOptions& options,
                               const std::string& where, bool* published) {
  auto timeout = options.timeout.count() > 0 ? options.timeout : config().timeout;
  const auto deadline = net::deadline_after(timeout);
  auto left = [&] {
    return std::max(
        std::chrono::milliseconds(0),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - net::Clock::now()));
  };

  TcpMesh mesh(rank, size);
  mesh.sockets_.resize(size);

  const ChosenHost chosen = choose_host(options, store, where);
  const std::string& host = chosen.host;
  uint16_t port = 0;
  net::Socket listener;
  try {
    listener = net::listen_on(host, 0, &port);
  } catch (const Error& e) {
    throw_error(e.code(), where,
                fmt::format("cannot listen on {} (from {}): {}; set WEFT_HOST_ADDR or "
                            "WEFT_SOCKET_IFNAME to an address of this host",
                            host, chosen.source, e.what()));
  }
  WEFT_LOG_DEBUG("{}: listening on {}:{} (address from {})", where, host, port, chosen.source);
  uint64_t nonce = 0;
  if (rank == 0) nonce = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}/{}", options.key_prefix, r));
  store.set(
      keys[rank],
      encode_record(PeerRecord{host, port, host_fingerprint(), shm_domain(), options.shm}, nonce));
  *published = true;
  kill_here_if_asked();

  std::vector<Bytes> values;
  try {
    values = store.multi_get(keys, std::max(left(), std::chrono::milliseconds(1)));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout) throw;
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw_error(ErrorCode::Timeout, where,
                fmt::format("{} under \"{}/\" within {} ms",
                            ranks_that(missing, "did not publish its address",
                                       "did not publish their addresses"),
                            options.key_prefix, timeout.count()));
  }
  for (int r = 0; r < size; ++r) {
    uint64_t peer_nonce = 0;
    mesh.records_.push_back(decode_record(values[r], r, &peer_nonce, where));
    if (r == 0) nonce = peer_nonce;
  }
  check_shm_agrees(mesh.records_, rank, where);
  mesh.group_id_ = fnv1a(options.key_prefix) ^ nonce ^ (static_cast<uint64_t>(size) << 48);

  // The peers this rank connects to (every rank computes the same relation from the records).
  auto wanted = [&](int peer) { return !options.local_only || mesh.shares_shm(peer); };
  int higher_wanted = 0;
  for (int r = rank + 1; r < size; ++r) higher_wanted += wanted(r) ? 1 : 0;

  auto handshake_to = [&](int peer) {
    Handshake h;
    h.group_id = mesh.group_id_;
    h.from = static_cast<uint32_t>(rank);
    h.to = static_cast<uint32_t>(peer);
    h.size = static_cast<uint32_t>(size);
    std::array<uint8_t, kHandshakeBytes> bytes{};
    encode(h, bytes.data());
    return bytes;
  };
  // Why a handshake is refused, or "" when it is the one expected from a peer in `allowed`.
  auto check = [&](const Handshake& h, auto allowed) -> std::string {
    if (h.magic != kHandshakeMagic || h.version != kHandshakeVersion) return "not a weft peer";
    if (h.group_id != mesh.group_id_) return "another group (or an earlier run)";
    if (h.size != static_cast<uint32_t>(size) || h.to != static_cast<uint32_t>(rank)) {
      return fmt::format("addressed to rank {}/{}", h.to, h.size);
    }
    if (!allowed(static_cast<int>(h.from))) return fmt::format("unexpected rank {}", h.from);
    return "";
  };

  // Lower ranks: connect and send our handshake (the kernel's backlog completes the connection
  // even while that rank is still connecting to its own lower ranks).
  for (int peer = 0; peer < rank; ++peer) {
    if (!wanted(peer)) continue;
    const PeerRecord& record = mesh.records_[peer];
    std::string what = fmt::format("{} connect to rank {}", where, peer);
    // A loopback address published from another host reaches this host, not the peer.
    const std::string advice = fmt::format(
        "on rank {}'s host ({}), set WEFT_SOCKET_IFNAME to the interface, or WEFT_HOST_ADDR to the "
        "address, that this host ({}) reaches it by",
        peer, host_name(record.fingerprint), host_name(mesh.records_[rank].fingerprint));
    if (net::is_loopback(record.host) && !mesh.same_host(peer)) {
      throw_error(ErrorCode::InvalidArgument, what,
                  fmt::format("rank {} runs on another host but published the loopback address "
                              "{}:{}; {}",
                              peer, record.host, record.port, advice));
    }
    net::Socket s;
    try {
      s = net::connect_with_retry(record.host, record.port, deadline, what, kRefusedGrace);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Io || mentions_fd_limit(e.what())) throw;
      // A peer that published its address and then gave up (out of descriptors, say) refuses
      // like a wrong address: its own reason, when it left one, is the better error.
      throw_if_a_rank_failed(store, options, what);
      throw Error(ErrorCode::Io, fmt::format("{}: the address rank {} published does not reach it "
                                             "from here (or it has exited); {}",
                                             e.what(), peer, advice));
    }
    auto bytes = handshake_to(peer);
    net::write_all(s.fd(), bytes.data(), bytes.size(), deadline, what);
    mesh.sockets_[peer] = std::move(s);
  }

  // Higher ranks: accept and check their handshakes, several at once so that a silent stray
  // connection cannot hold up the real ones.
  struct Pending {
    net::Socket socket;
    std::array<uint8_t, kHandshakeBytes> bytes{};
    size_t got = 0;
  };
  std::vector<Pending> pending;
  auto missing_higher = [&] {
    std::vector<int> missing;
    for (int r = rank + 1; r < size; ++r) {
      if (wanted(r) && !mesh.sockets_[r].valid()) missing.push_back(r);
    }
    return missing;
  };
  for (int accepted = 0; accepted < higher_wanted;) {
    std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.socket.fd(), POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(),
                    std::min<int>(poll_timeout_ms(deadline), kFailureCheck.count()));
    if (rc < 0 && errno != EINTR) {
      throw_error(ErrorCode::Io, where, fmt::format("poll: {}", std::strerror(errno)));
    }
    if (rc == 0 && net::Clock::now() >= deadline) {
      throw_error(ErrorCode::Timeout, where,
                  fmt::format("{} within {} ms",
                              ranks_that(missing_higher(), "did not connect", "did not connect"),
                              timeout.count()));
    }
    // Quiet for a while: has a rank given up? (Checked only when idle: one store query per
    // kFailureCheck of silence, nothing on a set-up that proceeds.)
    if (rc == 0) throw_if_a_rank_failed(store, options, where);
    if (rc <= 0) continue;
    for (size_t i = fds.size(); i-- > 1;) {
      if (fds[i].revents == 0) continue;
      Pending& p = pending[i - 1];
      ssize_t n = ::recv(p.socket.fd(), p.bytes.data() + p.got, kHandshakeBytes - p.got, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      bool drop = n <= 0;
      std::string reason = n == 0 ? "closed before its handshake" : "";
      if (n < 0) reason = std::strerror(errno);
      if (n > 0 && (p.got += static_cast<size_t>(n)) == kHandshakeBytes) {
        Handshake h = decode(p.bytes.data());
        reason = check(h, [&](int from) {
          return from > rank && from < size && wanted(from) && !mesh.sockets_[from].valid();
        });
        drop = true;
        if (reason.empty()) {
          auto reply = handshake_to(static_cast<int>(h.from));
          set_blocking(p.socket.fd());
          net::write_all(p.socket.fd(), reply.data(), reply.size(), deadline, where);
          mesh.sockets_[h.from] = std::move(p.socket);
          ++accepted;
        }
      }
      if (drop) {
        if (!reason.empty()) {
          WEFT_LOG_WARN("{}: refused a connection from {}: {}", where,
                        net::peer_address(p.socket.fd()), reason);
        }
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i - 1));
      }
    }
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        net::set_nodelay(fd);
        pending.push_back(Pending{net::Socket(fd)});
      } else if (out_of_descriptors(errno)) {
        // The connection stays queued and the listener readable: without this, a busy loop
        // until the deadline.
        throw_error(
            ErrorCode::Io, where,
            fmt::format("accept a connection from a higher rank: {}", fd_error_text(errno, size)));
      }
    }
  }
  listener.close();

  // Lower ranks' answers: they confirm that the right process accepted us.
  for (int peer = 0; peer < rank; ++peer) {
    if (!wanted(peer)) continue;
    std::array<uint8_t, kHandshakeBytes> bytes{};
    try {
      net::read_exact(mesh.sockets_[peer].fd(), bytes.data(), bytes.size(), deadline, where);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::PeerLost) {
        throw_error(
            ErrorCode::PeerLost, where,
            fmt::format("rank {} ({}:{}) hung up before answering the handshake: it "
                        "exited or crashed during set-up ({})",
                        peer, mesh.records_[peer].host, mesh.records_[peer].port, e.what()));
      }
      if (e.code() != ErrorCode::Timeout) throw;
      std::vector<int> missing;
      for (int r = peer; r < rank; ++r) {
        if (wanted(r)) missing.push_back(r);
      }
      throw_error(ErrorCode::Timeout, where,
                  fmt::format("{} within {} ms",
                              ranks_that(missing, "did not answer the handshake",
                                         "did not answer the handshake"),
                              timeout.count()));
    }
    std::string reason = check(decode(bytes.data()), [&](int from) { return from == peer; });
    if (!reason.empty()) {
      throw_error(ErrorCode::Protocol, where,
                  fmt::format("rank {} ({}:{}) answered with a bad handshake: {}", peer,
                              mesh.records_[peer].host, mesh.records_[peer].port, reason));
    }
  }
  return mesh;
}

}  // namespace weft::tcp
