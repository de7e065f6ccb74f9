// backends/tcp/tcp_mesh.h: connects the ranks of a process group pairwise over TCP, through a
// Store.
//
// Setup, for N ranks, costs each rank one store write and one batched read, whatever N:
//   1. listen on an ephemeral port of the chosen interface;
//   2. set "<prefix>/<rank>" to a record: "host:port", a host fingerprint (hostname + boot id,
//      so the shared-memory transport can tell which peers share this machine), which /dev/shm
//      it sees (containers on one machine may not share one), this rank's
//      shared-memory setting and, from rank 0 only, a random group nonce;
//   3. multi_get the N records (one request; the store waits until all exist); ranks on one
//      host that disagree on shared memory fail here, naming each other and their settings;
//   4. connect to every lower rank and send a handshake, then accept one connection from every
//      higher rank and answer its handshake, then read the answers from the lower ranks. No rank
//      waits on a peer before it has written everything it owes, so setup cannot deadlock.
// The handshake is {magic, version, group id, from rank, to rank, size}; the group id mixes the
// key prefix with rank 0's nonce, so a connection from another group, from an earlier run that
// reused the prefix, or from a port scanner is refused (closed, logged) and accepting goes on.
//
// Everything runs under one deadline (options.timeout, default WEFT_TIMEOUT): past it,
// Error(Timeout) names the ranks whose record or connection is missing.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "weft/store.h"

#include "runtime/socket.h"

namespace weft::tcp {

struct TcpMeshOptions {
  // Names the group in the store: rank r's record is "<key_prefix>/<r>". Two groups sharing a
  // store must use different prefixes (the process group uses its name and incarnation).
  std::string key_prefix = "weft/tcp";
  // The address to listen on and publish. Empty: WEFT_HOST_ADDR, else WEFT_SOCKET_IFNAME's
  // address, else the local address whose route reaches `route_to`, else the local end of the
  // store's connection (Store::local_address(): peers reach us the way we reach the store), else
  // 127.0.0.1 (a store on loopback or in this process). A peer that published a loopback address
  // from another host, or an address that refuses connections, fails the setup at once with an
  // error naming the address and these variables.
  std::string host;
  std::string route_to;
  // Bounds the whole setup. 0: config().timeout (WEFT_TIMEOUT, default 300 s).
  std::chrono::milliseconds timeout{0};
  // For error messages only: "rank 2/4 group "dp" tcp mesh: ...".
  std::string group_name = "world";
  // This rank's shared-memory setting (WEFT_SHM, or the backend's shm setting), published so
  // that two ranks on one host that disagree fail at setup, naming both, instead of one waiting
  // for a shared-memory record the other never writes. Unset: not published, nothing checked.
  std::optional<bool> shm;
  // Connect only the peers that share this rank's /dev/shm (shares_shm()); the others' sockets
  // stay invalid. For a mesh that serves as shared memory's control sockets beside another
  // transport that reaches every rank (host memory paired with UCX): no connection to another
  // host's ranks, so no O(P^2) sockets across a job.
  bool local_only = false;
};

// What a rank published about itself.
struct PeerRecord {
  std::string host;
  uint16_t port = 0;
  std::string fingerprint;  // "hostname/boot-id"; equal fingerprints mean one machine
  std::string shm_domain;   // which /dev/shm it sees ("device:inode"); see shares_shm()
  std::optional<bool> shm;  // its TcpMeshOptions::shm
};

// A TcpMesh holds one connected, handshaken, blocking socket per peer, ready to be handed to a
// transport (TcpTransport sets them non-blocking).
//
// Thread safety: none; build it on one thread, then move the sockets out. Ownership: owns its
// sockets until take_sockets().
class TcpMesh {
 public:
  // Runs the setup above. Collective: every rank of the group must call it with the same
  // size and key_prefix. Throws Error(Timeout) naming missing ranks, Error(Io) when it cannot
  // listen, Error(InvalidArgument) for a bad rank/size, a malformed record in the store, or a
  // rank on this host whose shared-memory setting differs from this rank's.
  static TcpMesh connect(Store& store, int rank, int size, const TcpMeshOptions& options = {});

  int rank() const { return rank_; }
  int size() const { return size_; }
  uint64_t group_id() const { return group_id_; }

  // Every rank's record, indexed by rank (this rank's included).
  const std::vector<PeerRecord>& records() const { return records_; }
  // True when `peer` runs on this machine (same hostname and boot id).
  bool same_host(int peer) const;
  // True when `peer` runs on this machine and sees the same /dev/shm, so that shared memory can
  // join them (containers on one host with separate /dev/shm mounts do not).
  bool shares_shm(int peer) const;
  // The same for any two ranks a and b of the mesh, as every rank computes it alike.
  bool share_shm(int a, int b) const;

  // The sockets, indexed by rank; the entry for this rank is invalid (and, with local_only, those
  // of the peers that do not share this rank's /dev/shm). Leaves the mesh empty.
  std::vector<net::Socket> take_sockets();

  // This machine's fingerprint, as published: "hostname/boot-id". Throws Error(Io) when the
  // process is out of descriptors (the boot id cannot be read; fd_limit.h).
  static std::string host_fingerprint();
  // Which /dev/shm this process sees, as published: "device:inode" of the directory.
  static std::string shm_domain();
  // The store record a rank publishes: `peer`'s fields and, from rank 0, the group nonce. What a
  // test writes to stand in for a rank.
  static std::string encode_record(const PeerRecord& peer, uint64_t nonce);

 private:
  TcpMesh(int rank, int size) : rank_(rank), size_(size) {}
  // connect()'s work; *published tells whether this rank's record is in the store yet.
  static TcpMesh connect_ranks(Store& store, int rank, int size, const TcpMeshOptions& options,
                               const std::string& where, bool* published);

  int rank_;
  int size_;
  uint64_t group_id_ = 0;
  std::vector<PeerRecord> records_;
  std::vector<net::Socket> sockets_;
};

}  // namespace weft::tcp
