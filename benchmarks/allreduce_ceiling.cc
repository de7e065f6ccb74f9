// allreduce_ceiling: how fast any all_reduce between processes on this host can be.
//
//   allreduce_ceiling [--ranks P] [--sizes LIST] [--chunk BYTES] [--iters N]
//
// Not weft: the least work an fp32 sum all_reduce must do, with no transport, no progress
// thread, no error checks, ranks busy-waiting on each other (P must not exceed the cores).
// It bounds what weft (or Gloo, or Open MPI) can reach here, which is what tells a goal that
// needs more tuning from one that needs a different machine. Two schemes:
//
//   shm  P ranks, a shared mapping with one slot per rank. Per chunk of --chunk bytes, split
//        into P blocks: each rank copies the blocks others reduce into its slot; barrier; rank r
//        reduces block r from every slot and its own input into its output and into its slot;
//        barrier; each rank copies the other reduced blocks out of their owners' slots. Chunks
//        keep the shared data in cache; two memcpy and one reduction per byte, as a ring does.
//   cma  2 ranks, cross-memory attach: rank r reads the peer's half r with process_vm_readv,
//        reduces it with its own into its output and writes the result straight into the
//        peer's output with process_vm_writev. No shared staging at all.
//
// Inputs and outputs are private, allocated and touched before timing. Prints the best of
// --iters runs per size (the slowest rank's), bus bandwidth as collective_bench: 2(P-1)/P x
// bytes / time, and checks every element.
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int ranks = 2;
  std::vector<size_t> sizes = {1 << 20, 16 << 20, 64 << 20};
  size_t chunk = 1 << 20;
  int iters = 10;
};

// One cache line per rank in the shared mapping: its barrier count and what cma needs.
struct alignas(64) RankInfo {
  std::atomic<uint64_t> arrived;
  std::atomic<double> seconds;  // the rank's best time, for the report
  pid_t pid;
  float* in;
  float* out;
};

class Shared {
 public:
  Shared(int ranks, size_t slot_bytes)
      : ranks_(ranks),
        slot_bytes_(slot_bytes),
        bytes_(kSlotsAt + ranks * slot_bytes),
        base_(static_cast<char*>(
            mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    if (base_ == MAP_FAILED) {
      perror("mmap");
      exit(1);
    }
    memset(base_, 0, bytes_);  // touched once, before any timing
  }
  ~Shared() { munmap(base_, bytes_); }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
  RankInfo& info(int rank) { return reinterpret_cast<RankInfo*>(base_)[rank]; }
  float* slot(int rank) { return reinterpret_cast<float*>(base_ + kSlotsAt + rank * slot_bytes_); }
  // All ranks spin until each has arrived `count` times.
  void barrier(int rank, uint64_t count) {
    info(rank).arrived.store(count, std::memory_order_release);
    for (int q = 0; q < ranks_; ++q) {
      while (info(q).arrived.load(std::memory_order_acquire) < count) {
        if (oversubscribed_) {
          sched_yield();  // the rank waited for needs this core
        } else {
          __builtin_ia32_pause();
        }
      }
    }
  }

 private:
  static constexpr size_t kSlotsAt = 64 * 1024;
  int ranks_;
  bool oversubscribed_ = ranks_ > static_cast<int>(std::thread::hardware_concurrency());
  size_t slot_bytes_;
  size_t bytes_;
  char* base_;
};

float input_value(int rank, size_t i) { return float(rank + 1) + float(i % 7); }

// Block q of a chunk of `n` elements split P ways: [begin, end).
std::pair<size_t, size_t> block(size_t n, int ranks, int q) {
  size_t per = (n + ranks - 1) / ranks;
  size_t begin = std::min(n, q * per);
  return {begin, std::min(n, begin + per)};
}

// The shm scheme on one rank; the slot holds a chunk of inputs then two chunks of results
// (alternating, so a rank may reduce chunk k+1 while others still copy chunk k's result out).
void shm_allreduce(Shared& shared, int rank, int ranks, size_t chunk_elems, const float* in,
                   float* out, size_t n, uint64_t& arrivals) {
  float* mine = shared.slot(rank);
  for (size_t off = 0, k = 0; off < n; off += chunk_elems, ++k) {
    size_t len = std::min(chunk_elems, n - off);
    for (int q = 0; q < ranks; ++q) {
      auto [b, e] = block(len, ranks, q);
      if (q != rank) memcpy(mine + b, in + off + b, (e - b) * sizeof(float));
    }
    shared.barrier(rank, ++arrivals);
    auto [b, e] = block(len, ranks, rank);
    float* result = mine + chunk_elems * (1 + k % 2);
    // One pass per peer's slot, each a plain loop the compiler vectorizes; the last pass
    // writes the sum to both places.
    float* sum = out + off;
    const float* mine_in = in + off;
    int last = rank == ranks - 1 ? ranks - 2 : ranks - 1;
    for (int q = 0; q < ranks; ++q) {
      if (q == rank) continue;
      const float* theirs = shared.slot(q);
      if (q == last) {
        for (size_t i = b; i < e; ++i) result[i - b] = sum[i] = mine_in[i] + theirs[i];
      } else {
        for (size_t i = b; i < e; ++i) sum[i] = mine_in[i] + theirs[i];
      }
      mine_in = sum;  // later passes add into the partial sum
    }
    shared.barrier(rank, ++arrivals);
    for (int q = 0; q < ranks; ++q) {
      auto [qb, qe] = block(len, ranks, q);
      const float* theirs = shared.slot(q) + chunk_elems * (1 + k % 2);
      if (q != rank) memcpy(out + off + qb, theirs, (qe - qb) * sizeof(float));
    }
  }
}

// The cma scheme on one rank of two.
void cma_allreduce(Shared& shared, int rank, size_t chunk_elems, const float* in, float* out,
                   float* scratch, size_t n) {
  RankInfo& peer = shared.info(1 - rank);
  size_t half = n / 2;
  size_t begin = rank == 0 ? 0 : half, end = rank == 0 ? half : n;
  for (size_t off = begin; off < end; off += chunk_elems) {
    size_t len = std::min(chunk_elems, end - off);
    iovec local{scratch, len * sizeof(float)}, remote{peer.in + off, len * sizeof(float)};
    if (process_vm_readv(peer.pid, &local, 1, &remote, 1, 0) != ssize_t(local.iov_len)) {
      perror("process_vm_readv");
      _exit(1);
    }
    for (size_t i = 0; i < len; ++i) out[off + i] = in[off + i] + scratch[i];
    iovec result{out + off, len * sizeof(float)}, theirs{peer.out + off, len * sizeof(float)};
    if (process_vm_writev(peer.pid, &result, 1, &theirs, 1, 0) != ssize_t(result.iov_len)) {
      perror("process_vm_writev");
      _exit(1);
    }
  }
}

// One rank's run of one scheme at one size; returns the number of wrong elements.
size_t run_rank(Shared& shared, const Options& o, bool cma, int rank, size_t bytes) {
  size_t n = bytes / sizeof(float);
  size_t chunk_elems = o.chunk / sizeof(float);
  std::vector<float> in(n), out(n), scratch(chunk_elems);
  for (size_t i = 0; i < n; ++i) in[i] = input_value(rank, i);
  RankInfo& me = shared.info(rank);
  me.pid = getpid();
  me.in = in.data();
  me.out = out.data();
  uint64_t arrivals = 0;
  shared.barrier(rank, ++arrivals);  // every rank's pointers are published
  double best = 1e30;
  for (int it = 0; it < o.iters; ++it) {
    shared.barrier(rank, ++arrivals);
    auto start = Clock::now();
    if (cma) {
      cma_allreduce(shared, rank, chunk_elems, in.data(), out.data(), scratch.data(), n);
      shared.barrier(rank, ++arrivals);  // the peer's writes into `out` are done
    } else {
      shm_allreduce(shared, rank, o.ranks, chunk_elems, in.data(), out.data(), n, arrivals);
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  me.seconds.store(best);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    float expected = 0;
    for (int q = 0; q < o.ranks; ++q) expected += input_value(q, i);
    wrong += out[i] != expected;
  }
  shared.barrier(rank, ++arrivals);  // no rank frees memory a peer may still write
  return wrong;
}

size_t parse_bytes(const std::string& s) {
  size_t end = 0;
  double v = std::stod(s, &end);
  char unit = end < s.size() ? s[end] : ' ';
  double scale = unit == 'K' ? 1 << 10 : unit == 'M' ? 1 << 20 : unit == 'G' ? 1 << 30 : 1;
  return size_t(v * scale);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--ranks") {
      o.ranks = std::stoi(value);
    } else if (flag == "--chunk") {
      o.chunk = parse_bytes(value);
    } else if (flag == "--iters") {
      o.iters = std::stoi(value);
    } else if (flag == "--sizes") {
      o.sizes.clear();
      for (size_t at = 0; at <= value.size();) {
        size_t comma = std::min(value.find(',', at), value.size());
        o.sizes.push_back(parse_bytes(value.substr(at, comma - at)));
        at = comma + 1;
      }
    } else {
      fmt::print(stderr,
                 "usage: allreduce_ceiling [--ranks P] [--sizes LIST] [--chunk BYTES] "
                 "[--iters N]\n");
      exit(2);
    }
  }
  if (argc % 2 == 0 || o.ranks < 2 || o.ranks > 64 || o.chunk < 4096 || o.iters < 1) {
    fmt::print(stderr, "allreduce_ceiling: bad arguments (ranks 2..64, chunk >= 4K)\n");
    exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  fmt::print(
      "# allreduce_ceiling: fp32 sum, {} ranks, chunk {} B, best of {} runs; "
      "busbw = 2(P-1)/P x bytes / time, GB/s = 1e9 B/s\n",
      o.ranks, o.chunk, o.iters);
  for (bool cma : {false, true}) {
    if (cma && o.ranks != 2) continue;
    for (size_t bytes : o.sizes) {
      Shared shared(o.ranks, 3 * o.chunk);
      for (int r = 0; r < o.ranks; ++r) {
        if (fork() == 0) _exit(run_rank(shared, o, cma, r, bytes) == 0 ? 0 : 3);
      }
      bool right = true;
      for (int r = 0; r < o.ranks; ++r) {
        int status = 0;
        wait(&status);
        right = right && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      double slowest = 0;
      for (int r = 0; r < o.ranks; ++r) slowest = std::max(slowest, shared.info(r).seconds.load());
      double busbw = double(bytes) / slowest / 1e9 * 2 * (o.ranks - 1) / o.ranks;
      fmt::print("scheme={} ranks={} bytes={} time_us={:.1f} busbw={:.2f} {}\n",
                 cma ? "cma" : "shm", o.ranks, bytes, slowest * 1e6, busbw,
                 right ? "right" : "WRONG");
    }
  }
}
