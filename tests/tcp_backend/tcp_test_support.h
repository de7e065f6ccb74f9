// tests/tcp_backend/tcp_test_support.h: what the TCP transport tests share: a temporary
// FileStore per test (no server thread to keep across fork), a connected transport per rank,
// and byte patterns that a receiver can check without the sender's buffer.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "weft/file_store.h"

#include "backends/tcp/tcp_mesh.h"
#include "backends/tcp/tcp_transport.h"
#include "tests/support/multiproc.h"

namespace weft::tcp::test {

using namespace std::chrono_literals;
using collectives::Clock;
using collectives::make_tag;
using weft::test::describe_failures;
using weft::test::run_ranks;
using weft::test::run_ranks_ok;

// A directory removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "weft-tcp-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One rank's store and transport. The store outlives the transport (members die in reverse).
struct TcpRank {
  std::unique_ptr<FileStore> store;
  std::unique_ptr<TcpTransport> transport;
};

// Builds the mesh and the transport for `rank` of `size`; call inside a rank's body.
inline TcpRank connect_rank(const std::string& store_path, int rank, int size,
                            TcpTransport::Options options = {},
                            std::chrono::milliseconds timeout = 20s) {
  TcpRank result;
  result.store = std::make_unique<FileStore>(store_path, size);
  TcpMeshOptions mesh_options;
  mesh_options.key_prefix = "test/tcp";
  mesh_options.timeout = timeout;
  TcpMesh mesh = TcpMesh::connect(*result.store, rank, size, mesh_options);
  result.transport = std::make_unique<TcpTransport>(std::move(mesh), std::move(options));
  return result;
}

// The byte at offset i of message `seed`: differs between neighbouring offsets and messages.
inline uint8_t pattern_byte(uint64_t seed, size_t i) {
  uint64_t x =
      (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ULL ^ (seed * 0xBF58476D1CE4E5B9ULL);
  return static_cast<uint8_t>(x >> 56);
}

inline std::vector<uint8_t> pattern(uint64_t seed, size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = pattern_byte(seed, i);
  return data;
}

// Throws naming the first wrong byte, unless data holds pattern(seed, bytes).
inline void check_pattern(const std::vector<uint8_t>& data, uint64_t seed, const char* what) {
  for (size_t i = 0; i < data.size(); ++i) {
    RANK_CHECK(data[i] == pattern_byte(seed, i), "{}: byte {} of {} is {}, expected {}", what, i,
               data.size(), data[i], pattern_byte(seed, i));
  }
}

inline Clock::time_point within(std::chrono::milliseconds timeout) {
  return Clock::now() + timeout;
}

}  // namespace weft::tcp::test
