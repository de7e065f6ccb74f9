// tcp_transport_bench: ping-pong latency and one-way bandwidth of TcpTransport between two
// processes over loopback (or whatever `--host` names).
//
//   tcp_transport_bench [--iters N]
//
// Prints the machine first, then one line per size: latency is half the median round trip of a
// ping-pong; bandwidth is one direction, a window of 8 sends in flight, acknowledged at the end.
// Both ranks check the bytes they receive against the pattern the sender wrote.
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "weft/file_store.h"

#include "backends/tcp/tcp_mesh.h"
#include "backends/tcp/tcp_transport.h"

namespace {

using namespace std::chrono_literals;
using weft::collectives::Clock;
using weft::collectives::make_tag;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

void print_machine() {
  utsname u{};
  uname(&u);
  std::printf("# tcp_transport_bench: %s x %u cores, %s %s, loopback, 2 processes\n",
              cpu_model().c_str(), std::thread::hardware_concurrency(), u.sysname, u.release);
#ifndef NDEBUG
  std::printf("# WARNING: built with assertions (not a release build); figures are pessimistic\n");
#endif
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void check(const std::vector<uint8_t>& data, uint8_t seed) {
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] != static_cast<uint8_t>(i * 31 + seed)) {
      std::fprintf(stderr, "wrong byte %zu\n", i);
      std::exit(2);
    }
  }
}

void run(int rank, const std::string& store_path, int iters) {
  weft::FileStore store(store_path, 2);
  weft::tcp::TcpMeshOptions mesh_options;
  mesh_options.timeout = 30s;
  weft::tcp::TcpTransport t(weft::tcp::TcpMesh::connect(store, rank, 2, mesh_options), {});
  int peer = 1 - rank;
  auto deadline = [] { return Clock::now() + 60s; };
  uint64_t seq = 1;

  if (rank == 0) std::printf("%12s %14s %14s\n", "bytes", "latency_us", "bandwidth_GB/s");
  for (size_t bytes : {size_t{8}, size_t{1} << 10, size_t{64} << 10, size_t{1} << 20,
                       size_t{16} << 20, size_t{64} << 20}) {
    std::vector<uint8_t> out(bytes), in(bytes);
    for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 31 + rank);
    int rounds = bytes >= (size_t{16} << 20) ? std::max(3, iters / 100) : iters;
    std::vector<double> round_trips;
    for (int i = 0; i < rounds + 2; ++i) {  // two warm-up rounds
      auto start = Clock::now();
      auto tag = make_tag(seq++, 0);
      if (rank == 0) {
        auto r = t.recv(peer, in.data(), bytes, tag);
        t.wait(t.send(peer, out.data(), bytes, tag), deadline());
        t.wait(r, deadline());
      } else {
        t.wait(t.recv(peer, in.data(), bytes, tag), deadline());
        t.wait(t.send(peer, out.data(), bytes, tag), deadline());
      }
      if (i >= 2)
        round_trips.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    check(in, static_cast<uint8_t>(peer));

    // A window of kWindow messages in flight; the receiver posts each receive before the
    // message can arrive, as a collective does, so every message lands with zero copy.
    constexpr int kWindow = 8;
    int messages = std::max(kWindow, static_cast<int>((size_t{256} << 20) / bytes));
    messages = std::min(messages, 20000);
    uint8_t ack = 0;
    auto start = Clock::now();
    std::vector<weft::collectives::Request> window;
    for (int m = 0; m < messages; ++m) {
      auto tag = make_tag(seq, static_cast<uint32_t>(m));
      if (window.size() == kWindow) {
        t.wait(window.front(), deadline());
        window.erase(window.begin());
      }
      window.push_back(rank == 0 ? t.send(peer, out.data(), bytes, tag)
                                 : t.recv(peer, in.data(), bytes, tag));
    }
    for (auto r : window) t.wait(r, deadline());
    auto ack_tag = make_tag(seq++, 0xFFFFFF);
    if (rank == 0) {
      t.wait(t.recv(peer, &ack, 1, ack_tag), deadline());
    } else {
      t.wait(t.send(peer, &ack, 1, ack_tag), deadline());
      check(in, static_cast<uint8_t>(peer));
    }
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (rank == 0) {
      std::printf("%12zu %14.2f %14.3f\n", bytes, median(round_trips) / 2 * 1e6,
                  static_cast<double>(bytes) * messages / seconds / 1e9);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::max(10, std::atoi(argv[i + 1]));
  }
  print_machine();
  std::string dir = (std::filesystem::temp_directory_path() / "weft-tcp-bench-XXXXXX").string();
  if (!mkdtemp(dir.data())) return 1;
  std::string store_path = dir + "/store";
  pid_t child = fork();
  if (child == 0) {
    try {
      run(1, store_path, iters);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 1: %s\n", e.what());
      _exit(1);
    }
    _exit(0);
  }
  int code = 0;
  try {
    run(0, store_path, iters);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank 0: %s\n", e.what());
    code = 1;
  }
  int status = 0;
  waitpid(child, &status, 0);
  std::filesystem::remove_all(dir);
  return code != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
