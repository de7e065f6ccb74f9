// shm_ring_bench: one-way bandwidth and ping-pong latency through ShmRing between two processes.
//
//   shm_ring_bench [--ring BYTES] [--spin-us N] [--max BYTES] [--reps N]
//
// Bandwidth: the sender copies messages of 8 B .. 64 MiB into the ring (in pieces when a message
// is larger than the ring), ringing the receiver's doorbell after each piece; the receiver copies
// each message out into its own buffer, as a receive does. GB/s is 1e9 bytes per second from the
// sender's first byte to the receiver's last; the median of --reps runs per size. Latency: 8 B
// ping-pong over a pair of rings, one-way = round trip / 2, median and 99th percentile, with
// --spin-us spinning and with none (every wait sleeps in FUTEX_WAIT). Buffers and rings are
// touched before timing.
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backends/tcp/doorbell.h"
#include "backends/tcp/shm_ring.h"
#include "backends/tcp/shm_segment.h"

namespace weft::tcp {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Options {
  size_t ring_bytes = 1 << 20;
  std::chrono::nanoseconds spin = 20us;
  size_t max_message = 64 << 20;
  int reps = 3;
};

// The segment: two doorbells, a control block, then two rings (0: parent -> child, 1: back).
struct Control {
  alignas(64) std::byte bells[2][Doorbell::kFootprint];
  alignas(64) std::atomic<uint64_t> go;       // run number the receiver is ready for
  alignas(64) std::atomic<int64_t> start_ns;  // sender's clock at its first byte
};
constexpr size_t kRingsAt = 4096;

size_t ring_offset(const Options& o, int i) {
  return kRingsAt + i * ((ShmRing::footprint(o.ring_bytes) + 4095) / 4096 * 4096);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

void print_header(const Options& o) {
  utsname u{};
  uname(&u);
  std::time_t t = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  fmt::print("shm_ring_bench  {}\n", date);
  fmt::print("CPU:     {} x {} cores\n", cpu_model(), std::thread::hardware_concurrency());
  fmt::print("Kernel:  {} {} {}\n", u.sysname, u.release, u.machine);
  // Spinning only pays while the peer has a core of its own: the load says whether it had one.
  std::ifstream loadavg("/proc/loadavg");
  std::string load1, load5;
  loadavg >> load1 >> load5;
  fmt::print("Load:    {} (1 min), {} (5 min) before the run\n", load1, load5);
  fmt::print("Ring:    {} bytes; spin budget {} us; median of {} runs per size\n", o.ring_bytes,
             std::chrono::duration<double, std::micro>(o.spin).count(), o.reps);
#ifndef NDEBUG
  fmt::print("WARNING: built with assertions (not a release build): figures are pessimistic\n");
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  fmt::print("WARNING: built with a sanitizer: figures are meaningless\n");
#endif
  std::fflush(stdout);
}

// A view of the shared state from one of the two processes (0: parent, 1: child).
struct Side {
  Side(ShmSegment& segment, const Options& o, int me)
      : control(*std::launder(reinterpret_cast<Control*>(segment.data()))),
        mine(Doorbell::attach(control.bells[me])),
        peer(Doorbell::attach(control.bells[1 - me])),
        out(ShmRing::attach(segment.data() + ring_offset(o, me), ShmRing::footprint(o.ring_bytes))),
        in(ShmRing::attach(segment.data() + ring_offset(o, 1 - me),
                           ShmRing::footprint(o.ring_bytes))) {}

  void wait_for(auto&& ready, std::chrono::nanoseconds spin) {
    if (!mine.wait(ready, Clock::now() + 60s, spin)) {
      std::fprintf(stderr, "shm_ring_bench: peer made no progress for 60 s\n");
      std::exit(1);
    }
  }
  void send(const std::byte* data, size_t bytes, std::chrono::nanoseconds spin) {
    while (bytes > 0) {
      size_t n = out.write_some(data, bytes);
      if (n == 0) {
        wait_for([&] { return out.writable_bytes() > 0; }, spin);
        continue;
      }
      peer.ring();
      data += n;
      bytes -= n;
    }
  }
  void recv(std::byte* data, size_t bytes, std::chrono::nanoseconds spin) {
    while (bytes > 0) {
      size_t n = in.read_some(data, bytes);
      if (n == 0) {
        wait_for([&] { return in.readable_bytes() > 0; }, spin);
        continue;
      }
      peer.ring();
      data += n;
      bytes -= n;
    }
  }

  Control& control;
  Doorbell mine, peer;
  ShmRing out, in;
};

std::vector<size_t> message_sizes(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t m = 8; m <= o.max_message; m *= 8) sizes.push_back(m);
  if (sizes.back() != o.max_message) sizes.push_back(o.max_message);
  return sizes;
}

// Enough messages for ~256 MiB or 100 ms of 8-byte ones, whichever is fewer, but at least 4.
size_t message_count(size_t m) { return std::clamp<size_t>((256 << 20) / m, 4, 100000); }

// The child: the sender for bandwidth, the echo for latency. Mirrors parent_main's sequence.
void child_main(Side& side, const Options& o) {
  std::vector<std::byte> source(o.max_message, std::byte{1});
  uint64_t run = 0;
  for (size_t m : message_sizes(o)) {
    for (int rep = 0; rep < o.reps; ++rep) {
      ++run;
      side.wait_for([&] { return side.control.go.load(std::memory_order_acquire) == run; }, o.spin);
      side.control.start_ns.store(now_ns(), std::memory_order_relaxed);
      for (size_t i = message_count(m); i > 0; --i) side.send(source.data(), m, o.spin);
    }
  }
  std::byte ball[8];
  for (auto spin : {o.spin, std::chrono::nanoseconds(0)}) {
    for (int i = 0; i < 20000 + 200; ++i) {
      side.recv(ball, 8, spin);
      side.send(ball, 8, spin);
    }
  }
}

void parent_main(Side& side, const Options& o) {
  std::vector<std::byte> sink(o.max_message);
  std::memset(sink.data(), 0, sink.size());  // touched before timing
  fmt::print("\n{:>12} {:>10} {:>12}\n", "bytes", "messages", "GB/s");
  uint64_t run = 0;
  for (size_t m : message_sizes(o)) {
    std::vector<double> rates;
    size_t count = message_count(m);
    for (int rep = 0; rep < o.reps; ++rep) {
      side.control.go.store(++run, std::memory_order_release);
      side.peer.ring();
      for (size_t i = 0; i < count; ++i) side.recv(sink.data(), m, o.spin);
      int64_t end = now_ns();
      // The start time was stored before the first byte, so the ring's acquire made it visible.
      int64_t start = side.control.start_ns.load(std::memory_order_relaxed);
      rates.push_back(static_cast<double>(m) * count / static_cast<double>(end - start));
    }
    std::sort(rates.begin(), rates.end());
    fmt::print("{:>12} {:>10} {:>12.2f}\n", m, count, rates[rates.size() / 2]);
    std::fflush(stdout);
  }
  fmt::print("\n{:>24} {:>14} {:>14}\n", "8 B ping-pong", "one-way p50 us", "one-way p99 us");
  std::byte ball[8] = {};
  for (auto spin : {o.spin, std::chrono::nanoseconds(0)}) {
    std::vector<double> rtt;
    for (int i = 0; i < 20000 + 200; ++i) {
      auto t0 = Clock::now();
      side.send(ball, 8, spin);
      side.recv(ball, 8, spin);
      if (i >= 200)
        rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    std::sort(rtt.begin(), rtt.end());
    std::string label =
        spin.count() > 0
            ? fmt::format("spin {} us", std::chrono::duration<double, std::micro>(spin).count())
            : std::string("no spin (futex)");
    fmt::print("{:>24} {:>14.2f} {:>14.2f}\n", label, rtt[rtt.size() / 2] / 2,
               rtt[rtt.size() * 99 / 100] / 2);
  }
}

int run(const Options& o) {
  print_header(o);
  std::string name = fmt::format("/weft-shm-ring-bench-{}", getpid());
  ShmSegment segment = ShmSegment::create(name, ring_offset(o, 2));
  auto* control = new (segment.data()) Control{};
  Doorbell::create(control->bells[0]);
  Doorbell::create(control->bells[1]);
  for (int i = 0; i < 2; ++i) {
    ShmRing::create(segment.data() + ring_offset(o, i), ShmRing::footprint(o.ring_bytes),
                    o.ring_bytes);
  }
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    // The child opens by name as a peer rank would; the name goes once both have it mapped.
    ShmSegment mapped = ShmSegment::open(name, segment.size());
    Side side(mapped, o, 1);
    child_main(side, o);
    _exit(0);
  }
  Side side(segment, o, 0);
  parent_main(side, o);
  int status = 0;
  waitpid(pid, &status, 0);
  segment.unlink();
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace weft::tcp

int main(int argc, char** argv) {
  weft::tcp::Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> unsigned long long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return std::strtoull(argv[++i], nullptr, 0);
    };
    if (arg == "--ring") {
      o.ring_bytes = value();
    } else if (arg == "--spin-us") {
      o.spin = std::chrono::microseconds(value());
    } else if (arg == "--max") {
      o.max_message = value();
    } else if (arg == "--reps") {
      o.reps = std::max(1, static_cast<int>(value()));
    } else {
      std::fprintf(stderr,
                   "usage: shm_ring_bench [--ring BYTES] [--spin-us N] [--max BYTES] [--reps N]\n");
      return 2;
    }
  }
  try {
    return weft::tcp::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shm_ring_bench: %s\n", e.what());
    return 1;
  }
}
