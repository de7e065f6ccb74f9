// tests/tcp_backend/shm_transport_support.h: what the shared-memory transport tests share: a
// rank's store and ShmTransport over every peer, built inside the rank's process, and the check
// that a body throws a weft::Error.
#pragma once

#include <memory>
#include <string>

#include "weft/error.h"
#include "weft/file_store.h"

#include "backends/tcp/shm_transport.h"
#include "backends/tcp/tcp_mesh.h"
#include "tests/tcp_backend/tcp_test_support.h"

namespace weft::tcp::test {

// Small rings: a 64 MiB message wraps 1024 times, and "ring + 1" bytes is cheap.
inline constexpr size_t kRing = 64 * 1024;

struct ShmRank {
  std::unique_ptr<FileStore> store;
  std::unique_ptr<ShmTransport> transport;
};

// The options the tests start from: kRing rings, 20 s set-up timeout; key_prefix and group_id are
// set by connect_shm().
inline ShmTransport::Options test_shm_options() {
  ShmTransport::Options options;
  options.ring_bytes = kRing;
  options.timeout = 20s;
  return options;
}

// Every peer over shared memory, with the mesh's connections as control sockets.
inline ShmRank connect_shm(const std::string& store_path, int rank, int size,
                           ShmTransport::Options options = test_shm_options()) {
  ShmRank result;
  result.store = std::make_unique<FileStore>(store_path, size);
  TcpMeshOptions mesh_options;
  mesh_options.key_prefix = "test/mesh";
  mesh_options.timeout = 20s;
  TcpMesh mesh = TcpMesh::connect(*result.store, rank, size, mesh_options);
  options.key_prefix = "test/shm";
  options.group_id = mesh.group_id();
  result.transport =
      std::make_unique<ShmTransport>(*result.store, rank, size, mesh.take_sockets(), options);
  return result;
}

// Runs `body` and returns the weft::Error it throws (RANK_CHECK fails if it throws none).
template <class Body>
Error expect_error(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e;
  }
  RANK_CHECK(false, "expected a weft::Error, got none");
  return Error(ErrorCode::Io, "unreachable");
}

}  // namespace weft::tcp::test
