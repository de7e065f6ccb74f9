#include "backends/tcp/tcp_mesh.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"

#include "backends/common/transport_util.h"
#include "runtime/log.h"

namespace weft::tcp {
namespace {

using backends::ranks_that;

constexpr uint32_t kHandshakeMagic = 0x4d544657;  // "WFTM" read as little-endian bytes
constexpr uint16_t kHandshakeVersion = 1;
constexpr size_t kHandshakeBytes = 32;
constexpr const char* kRecordVersion = "weft-tcp-v2";

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

std::string choose_host(const TcpMeshOptions& options) {
  if (!options.host.empty()) return options.host;
  if (options.route_to.empty() || net::is_loopback(options.route_to)) return "127.0.0.1";
  std::string local = local_address_towards(options.route_to);
  return local.empty() ? "127.0.0.1" : local;
}

std::string encode_record(const std::string& host, uint16_t port, uint64_t nonce,
                          std::optional<bool> shm) {
  return fmt::format("{}\n{}\n{}\n{}\n{:016x}\nshm={}\n", kRecordVersion, host, port,
                     TcpMesh::host_fingerprint(), nonce, shm_text(shm));
}

PeerRecord decode_record(const Bytes& bytes, int peer, uint64_t* nonce, const std::string& where) {
  std::istringstream in(to_string(bytes));
  std::string version, host, port, fingerprint, nonce_text, shm;
  std::getline(in, version);
  std::getline(in, host);
  std::getline(in, port);
  std::getline(in, fingerprint);
  std::getline(in, nonce_text);
  std::getline(in, shm);
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
  return PeerRecord{host, static_cast<uint16_t>(port_value), fingerprint, peer_shm};
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
    if (!mine.shm || !peer.shm || *peer.shm == *mine.shm || peer.fingerprint != mine.fingerprint) {
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

}  // namespace

std::string TcpMesh::host_fingerprint() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return fmt::format("{}/{}", name, boot_id.empty() ? "unknown-boot" : boot_id);
}

bool TcpMesh::same_host(int peer) const {
  WEFT_CHECK(peer >= 0 && peer < size_ && static_cast<size_t>(size_) == records_.size());
  return records_[peer].fingerprint == records_[rank_].fingerprint;
}

std::vector<net::Socket> TcpMesh::take_sockets() { return std::move(sockets_); }

TcpMesh TcpMesh::connect(Store& store, int rank, int size, const TcpMeshOptions& options) {
  const std::string where =
      fmt::format("rank {}/{} group \"{}\" tcp mesh", rank, size, options.group_name);
  if (size < 1 || rank < 0 || rank >= size) {
    throw_error(ErrorCode::InvalidArgument, where, "rank must be in [0, size) and size >= 1");
  }
  auto timeout = options.timeout.count() > 0 ? options.timeout : config().timeout;
  const auto deadline = net::deadline_after(timeout);
  auto left = [&] {
    return std::max(
        std::chrono::milliseconds(0),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - net::Clock::now()));
  };

  TcpMesh mesh(rank, size);
  mesh.sockets_.resize(size);

  const std::string host = choose_host(options);
  uint16_t port = 0;
  net::Socket listener = net::listen_on(host, 0, &port);
  uint64_t nonce = 0;
  if (rank == 0) nonce = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}/{}", options.key_prefix, r));
  store.set(keys[rank], encode_record(host, port, nonce, options.shm));

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
    const PeerRecord& record = mesh.records_[peer];
    std::string what = fmt::format("{} connect to rank {}", where, peer);
    net::Socket s = net::connect_with_retry(record.host, record.port, deadline, what);
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
      if (!mesh.sockets_[r].valid()) missing.push_back(r);
    }
    return missing;
  };
  for (int accepted = 0; accepted < size - rank - 1;) {
    std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.socket.fd(), POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(deadline));
    if (rc < 0 && errno != EINTR) {
      throw_error(ErrorCode::Io, where, fmt::format("poll: {}", std::strerror(errno)));
    }
    if (rc == 0 && net::Clock::now() >= deadline) {
      throw_error(ErrorCode::Timeout, where,
                  fmt::format("{} within {} ms",
                              ranks_that(missing_higher(), "did not connect", "did not connect"),
                              timeout.count()));
    }
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
          return from > rank && from < size && !mesh.sockets_[from].valid();
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
      }
    }
  }
  listener.close();

  // Lower ranks' answers: they confirm that the right process accepted us.
  for (int peer = 0; peer < rank; ++peer) {
    std::array<uint8_t, kHandshakeBytes> bytes{};
    try {
      net::read_exact(mesh.sockets_[peer].fd(), bytes.data(), bytes.size(), deadline, where);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Timeout) throw;
      std::vector<int> missing;
      for (int r = peer; r < rank; ++r) missing.push_back(r);
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
