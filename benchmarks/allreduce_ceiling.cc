// allreduce_ceiling: how fast any all_reduce (all_gather, reduce_scatter) between processes on
// this host can be.
//
//   allreduce_ceiling [--ranks P] [--op OP] [--scheme LIST] [--sizes LIST] [--chunk BYTES]
//                     [--iters N]
//
// Not weft: the least work an fp32 collective must do, with no transport, no progress thread,
// no error checks, ranks busy-waiting on each other (sched_yield instead when P exceeds the
// cores). It bounds what weft (or Gloo, or Open MPI) can reach here, which is what tells a goal
// that needs more tuning from one that needs a different machine. Its pure copies (all_gather's)
// use weft's own copy primitive (runtime/copy.h: non-temporal stores from 4 MiB), so that the bound
// is not below what the library reaches with it. OP is all_reduce (default),
// all_gather or reduce_scatter; sizes are nccl-tests' (the full array: all_gather's gathered
// output, reduce_scatter's full input). Schemes (--scheme, comma-separated; default all that
// apply):
//
//   shm  private inputs and outputs staged through a shared mapping with one slot per rank, in
//        chunks of --chunk bytes that keep the shared data in cache (what a ring through
//        shared memory does, minus everything else).
//        all_reduce: per chunk, split into P blocks: each rank copies the blocks others reduce
//        into its slot; barrier; rank r reduces block r from every slot and its own input into
//        its output and into its slot; barrier; each rank copies the other reduced blocks out
//        of their owners' slots. Two memcpy and one reduction per byte.
//        all_gather: per chunk of the input, each rank copies it into its slot; barrier; each
//        copies the others' slots into its output. reduce_scatter: per chunk of the output,
//        each rank copies the input blocks others reduce into its slot; barrier; rank r
//        reduces its own block and the others' copies of block r into its output.
//   cma  2 ranks, cross-memory attach: no shared staging at all. all_reduce: rank r reads the
//        peer's half r with process_vm_readv, reduces it with its own into its output and
//        writes the result straight into the peer's output with process_vm_writev.
//        all_gather: each rank reads the peer's input straight into its output.
//        reduce_scatter: rank r reads the peer's block r and reduces it with its own.
//   mapped         every rank's input and output lie in one MAP_SHARED mapping (symmetric
//                  buffers, docs/symmetric-memory.md), and each rank reads and writes the others'
//                  straight: no staging copy at all. all_reduce: rank r owns slice r (cut on
//                  64-byte lines) and sums it from all P inputs, in rank order, into all P
//                  outputs. all_gather: rank r copies every rank's input into its output.
//                  reduce_scatter: rank r sums block r of all P inputs into its output.
//   mapped-copyin  the same, but each rank first copies its private input into its input in
//                  the mapping (the outputs are still there): the cost of a symmetric
//                  collective whose caller's input is an ordinary buffer.
//   A mapped run ends with a barrier: until every rank is done, a peer may still read this
//   rank's input (or, for all_reduce, write its output), as on symmetric buffers.
//
// Buffers are allocated and touched before timing. Prints the best of --iters runs per size
// (the slowest rank's), bus bandwidth as nccl-tests and weft-perf (all_reduce 2(P-1)/P,
// all_gather and reduce_scatter (P-1)/P, x bytes / time), and checks every element of every
// rank's output against sums computed here from the inputs' formula.
// Exits 1 when any run was WRONG or a rank FAILED (its line then has no trustworthy figure).
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/copy.h"
#include "runtime/cpu_binding.h"

namespace {

using Clock = std::chrono::steady_clock;

enum class Op { all_reduce, all_gather, reduce_scatter };
enum class Scheme { shm, cma, mapped, mapped_copyin };
constexpr const char* kOpNames[] = {"all_reduce", "all_gather", "reduce_scatter"};
constexpr const char* kSchemeNames[] = {"shm", "cma", "mapped", "mapped-copyin"};
constexpr int kMaxRanks = 64;

struct Options {
  int ranks = 2;
  Op op = Op::all_reduce;
  std::vector<Scheme> schemes;  // empty: every scheme that applies
  std::vector<size_t> sizes = {1 << 20, 16 << 20, 64 << 20};
  size_t chunk = 1 << 20;
  int iters = 10;
  bool cma_left_out = false;  // asked for (or by default) at P != 2
};

// Elements per rank for one size, as nccl-tests counts them: all_gather and reduce_scatter
// round the size down to P whole blocks.
struct Counts {
  size_t in;      // each rank's input
  size_t out;     // each rank's output
  size_t block;   // all_gather: the input; reduce_scatter: the output; all_reduce: = in
  size_t bytes;   // the size reported (nccl-tests': the full array)
  double factor;  // busbw / algbw
};

Counts counts(Op op, int ranks, size_t bytes) {
  size_t elems = bytes / sizeof(float), block = elems / ranks;
  double p = ranks;
  switch (op) {
    case Op::all_gather:
      return {block, block * ranks, block, block * ranks * sizeof(float), (p - 1) / p};
    case Op::reduce_scatter:
      return {block * ranks, block, block, block * ranks * sizeof(float), (p - 1) / p};
    case Op::all_reduce:
      break;
  }
  return {elems, elems, elems, elems * sizeof(float), 2 * (p - 1) / p};
}

// One cache line per rank in the shared mapping: its barrier count and what cma needs.
struct alignas(64) RankInfo {
  std::atomic<uint64_t> arrived;
  std::atomic<double> seconds;  // the rank's best time, for the report
  std::atomic<uint64_t> wrong;  // wrong elements in the rank's output, for the report
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

// The mapped schemes' layout: rank q's slot holds its input, then its output, each starting on
// a page so that no cache line is shared between buffers.
struct Mapped {
  Shared& shared;
  size_t out_at;  // elements from the slot's start to the output
  float* in(int q) const { return shared.slot(q); }
  float* out(int q) const { return shared.slot(q) + out_at; }
};

size_t page_round(size_t elems) {
  constexpr size_t kPage = 4096 / sizeof(float);
  return (elems + kPage - 1) / kPage * kPage;
}

float input_value(int rank, size_t i) { return float(rank + 1) + float(i % 7); }

// Block q of a chunk of `n` elements split P ways: [begin, end).
std::pair<size_t, size_t> block(size_t n, int ranks, int q) {
  size_t per = (n + ranks - 1) / ranks;
  size_t begin = std::min(n, q * per);
  return {begin, std::min(n, begin + per)};
}

// dst[d][i] = src[0][i] + src[1][i] + ... (in that order) for every d < ndst: each source read
// once, each destination written once. Two sources take one loop the compiler vectorizes; more
// add up in an L1-sized tile first.
void sum_to(const float* const* src, int nsrc, float* const* dst, int ndst, size_t len) {
  if (nsrc == 2 && ndst <= 2) {
    const float* __restrict__ a = src[0];
    const float* __restrict__ b = src[1];
    float* __restrict__ d0 = dst[0];
    if (ndst == 1) {
      for (size_t i = 0; i < len; ++i) d0[i] = a[i] + b[i];
    } else {
      float* __restrict__ d1 = dst[1];
      for (size_t i = 0; i < len; ++i) d0[i] = d1[i] = a[i] + b[i];
    }
    return;
  }
  constexpr size_t kTile = 2048;
  alignas(64) float acc[kTile];
  for (size_t t = 0; t < len; t += kTile) {
    size_t n = std::min(kTile, len - t);
    const float* __restrict__ a = src[0] + t;
    const float* __restrict__ b = src[1] + t;
    for (size_t i = 0; i < n; ++i) acc[i] = a[i] + b[i];
    for (int q = 2; q < nsrc; ++q) {
      const float* __restrict__ c = src[q] + t;
      for (size_t i = 0; i < n; ++i) acc[i] += c[i];
    }
    for (int d = 0; d < ndst; ++d) memcpy(dst[d] + t, acc, n * sizeof(float));
  }
}

// The shm all_reduce on one rank; the slot holds a chunk of inputs then two chunks of results
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

// The shm all_gather on one rank: chunk k of the input goes to half k % 2 of the slot, so a
// rank may fill chunk k+1 while others still copy chunk k out; it fills half k % 2 again only
// after the next barrier, which every rank reaches once done with chunk k.
void shm_allgather(Shared& shared, int rank, int ranks, size_t chunk_elems, const float* in,
                   float* out, size_t count, uint64_t& arrivals) {
  memcpy(out + rank * count, in, count * sizeof(float));
  for (size_t off = 0, k = 0; off < count; off += chunk_elems, ++k) {
    size_t len = std::min(chunk_elems, count - off);
    size_t half = chunk_elems * (k % 2);
    memcpy(shared.slot(rank) + half, in + off, len * sizeof(float));
    shared.barrier(rank, ++arrivals);
    for (int q = 0; q < ranks; ++q) {
      if (q != rank) memcpy(out + q * count + off, shared.slot(q) + half, len * sizeof(float));
    }
  }
}

// The shm reduce_scatter on one rank: per chunk of `per` output elements, half k % 2 of each
// rank's slot holds P blocks of `per`, block q being the part of q's block this rank stages
// for q (as shm_allgather's halves).
void shm_reducescatter(Shared& shared, int rank, int ranks, size_t chunk_elems, const float* in,
                       float* out, size_t count, uint64_t& arrivals) {
  size_t per = chunk_elems / ranks;
  std::array<const float*, kMaxRanks> src;
  for (size_t off = 0, k = 0; off < count; off += per, ++k) {
    size_t len = std::min(per, count - off);
    size_t half = chunk_elems * (k % 2);
    for (int q = 0; q < ranks; ++q) {
      if (q != rank) {
        memcpy(shared.slot(rank) + half + q * per, in + q * count + off, len * sizeof(float));
      }
    }
    shared.barrier(rank, ++arrivals);
    for (int q = 0; q < ranks; ++q) {
      src[q] = q == rank ? in + rank * count + off : shared.slot(q) + half + rank * per;
    }
    float* dst = out + off;
    sum_to(src.data(), ranks, &dst, 1, len);
  }
}

void cma_read(pid_t pid, float* to, const float* from, size_t elems) {
  iovec local{to, elems * sizeof(float)}, remote{const_cast<float*>(from), elems * sizeof(float)};
  if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != ssize_t(local.iov_len)) {
    perror("process_vm_readv");
    _exit(1);
  }
}

// The cma schemes on one rank of two; the caller's barrier after them stands for the peer's
// completion (its writes into `out`, its reads of `in`).
void cma_run(Shared& shared, Op op, int rank, size_t chunk_elems, const float* in, float* out,
             float* scratch, const Counts& c) {
  RankInfo& peer = shared.info(1 - rank);
  if (op == Op::all_gather) {
    weft::copy_bytes(out + rank * c.block, in, c.block * sizeof(float));
    for (size_t off = 0; off < c.block; off += chunk_elems) {
      size_t len = std::min(chunk_elems, c.block - off);
      cma_read(peer.pid, out + (1 - rank) * c.block + off, peer.in + off, len);
    }
    return;
  }
  if (op == Op::reduce_scatter) {
    const float* mine = in + rank * c.block;
    for (size_t off = 0; off < c.block; off += chunk_elems) {
      size_t len = std::min(chunk_elems, c.block - off);
      cma_read(peer.pid, scratch, peer.in + rank * c.block + off, len);
      const float* src[2] = {rank == 0 ? mine + off : scratch, rank == 0 ? scratch : mine + off};
      float* dst = out + off;
      sum_to(src, 2, &dst, 1, len);
    }
    return;
  }
  size_t n = c.in, half = n / 2;
  size_t begin = rank == 0 ? 0 : half, end = rank == 0 ? half : n;
  for (size_t off = begin; off < end; off += chunk_elems) {
    size_t len = std::min(chunk_elems, end - off);
    cma_read(peer.pid, scratch, peer.in + off, len);
    for (size_t i = 0; i < len; ++i) out[off + i] = in[off + i] + scratch[i];
    iovec result{out + off, len * sizeof(float)}, theirs{peer.out + off, len * sizeof(float)};
    if (process_vm_writev(peer.pid, &result, 1, &theirs, 1, 0) != ssize_t(result.iov_len)) {
      perror("process_vm_writev");
      _exit(1);
    }
  }
}

// The mapped schemes' collective on one rank, once the inputs are in the mapping.
void mapped_run(const Mapped& m, Op op, int rank, int ranks, const Counts& c) {
  std::array<const float*, kMaxRanks> src;
  std::array<float*, kMaxRanks> dst;
  if (op == Op::all_gather) {
    // The copy weft uses for destinations nothing reads next (non-temporal from 4 MiB): a
    // ceiling must not be beaten by the library it bounds.
    for (int q = 0; q < ranks; ++q) {
      weft::copy_bytes(m.out(rank) + q * c.block, m.in(q), c.block * sizeof(float),
                       ranks * c.block * sizeof(float));
    }
    return;
  }
  if (op == Op::reduce_scatter) {
    for (int q = 0; q < ranks; ++q) src[q] = m.in(q) + rank * c.block;
    dst[0] = m.out(rank);
    sum_to(src.data(), ranks, dst.data(), 1, c.block);
    return;
  }
  // Slices on 64-byte lines, so that no two ranks write one line of an output.
  constexpr size_t kLine = 64 / sizeof(float);
  size_t per = ((c.in + kLine - 1) / kLine + ranks - 1) / ranks * kLine;
  size_t begin = std::min(c.in, rank * per), end = std::min(c.in, begin + per);
  for (int q = 0; q < ranks; ++q) {
    src[q] = m.in(q) + begin;
    dst[q] = m.out(q) + begin;
  }
  sum_to(src.data(), ranks, dst.data(), ranks, end - begin);
}

// What element i of `rank`'s output must be, from the inputs' formula.
float expected(Op op, int rank, int ranks, const Counts& c, size_t i) {
  if (op == Op::all_gather) return input_value(int(i / c.block), i % c.block);
  size_t at = op == Op::reduce_scatter ? rank * c.block + i : i;
  float sum = 0;
  for (int q = 0; q < ranks; ++q) sum += input_value(q, at);
  return sum;
}

// One rank's run of one scheme at one size; returns the number of wrong elements.
size_t run_rank(Shared& shared, const Options& o, Scheme scheme, int rank, size_t bytes) {
  Counts c = counts(o.op, o.ranks, bytes);
  size_t chunk_elems = o.chunk / sizeof(float);
  bool mapped = scheme == Scheme::mapped || scheme == Scheme::mapped_copyin;
  Mapped m{shared, page_round(c.in)};
  // Private buffers where the scheme has them; mapped's input is in the mapping already.
  std::vector<float> in(scheme == Scheme::mapped ? 0 : c.in), out(mapped ? 0 : c.out);
  std::vector<float> scratch(scheme == Scheme::cma ? chunk_elems : 0);
  float* input = scheme == Scheme::mapped ? m.in(rank) : in.data();
  float* output = mapped ? m.out(rank) : out.data();
  for (size_t i = 0; i < c.in; ++i) input[i] = input_value(rank, i);
  RankInfo& me = shared.info(rank);
  me.pid = getpid();
  me.in = input;
  me.out = output;
  uint64_t arrivals = 0;
  shared.barrier(rank, ++arrivals);  // every rank's pointers are published
  double best = 1e30;
  for (int it = 0; it < o.iters; ++it) {
    shared.barrier(rank, ++arrivals);
    auto start = Clock::now();
    switch (scheme) {
      case Scheme::shm:
        if (o.op == Op::all_gather) {
          shm_allgather(shared, rank, o.ranks, chunk_elems, input, output, c.block, arrivals);
        } else if (o.op == Op::reduce_scatter) {
          shm_reducescatter(shared, rank, o.ranks, chunk_elems, input, output, c.block, arrivals);
        } else {
          shm_allreduce(shared, rank, o.ranks, chunk_elems, input, output, c.in, arrivals);
        }
        break;
      case Scheme::cma:
        cma_run(shared, o.op, rank, chunk_elems, input, output, scratch.data(), c);
        shared.barrier(rank, ++arrivals);
        break;
      case Scheme::mapped_copyin:
        memcpy(m.in(rank), input, c.in * sizeof(float));
        shared.barrier(rank, ++arrivals);  // every input is in the mapping
        [[fallthrough]];
      case Scheme::mapped:
        mapped_run(m, o.op, rank, o.ranks, c);
        shared.barrier(rank, ++arrivals);
        break;
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  me.seconds.store(best);
  size_t wrong = 0;
  for (size_t i = 0; i < c.out; ++i) wrong += output[i] != expected(o.op, rank, o.ranks, c, i);
  me.wrong.store(wrong);
  if (wrong > 0) {
    fmt::print(stderr, "allreduce_ceiling: rank {} of {}, {} {} {} B: {} wrong elements\n", rank,
               o.ranks, kSchemeNames[int(scheme)], kOpNames[int(o.op)], bytes, wrong);
  }
  shared.barrier(rank, ++arrivals);  // no rank frees memory a peer may still use
  return wrong;
}

size_t parse_bytes(const std::string& s) {
  size_t end = 0;
  double v = std::stod(s, &end);
  char unit = end < s.size() ? s[end] : ' ';
  double scale = unit == 'K' ? 1 << 10 : unit == 'M' ? 1 << 20 : unit == 'G' ? 1 << 30 : 1;
  return size_t(v * scale);
}

std::vector<std::string> split(const std::string& value) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= value.size();) {
    size_t comma = std::min(value.find(',', at), value.size());
    out.push_back(value.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

[[noreturn]] void usage() {
  fmt::print(stderr,
             "usage: allreduce_ceiling [--ranks P] [--op all_reduce|all_gather|reduce_scatter] "
             "[--scheme shm,cma,mapped,mapped-copyin] [--sizes LIST] [--chunk BYTES] "
             "[--iters N]\n");
  exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--ranks") {
      o.ranks = std::stoi(value);
    } else if (flag == "--op") {
      auto at = std::find(std::begin(kOpNames), std::end(kOpNames), value);
      if (at == std::end(kOpNames)) usage();
      o.op = Op(at - std::begin(kOpNames));
    } else if (flag == "--scheme") {
      for (const std::string& name : split(value)) {
        auto at = std::find(std::begin(kSchemeNames), std::end(kSchemeNames), name);
        if (at == std::end(kSchemeNames)) usage();
        o.schemes.push_back(Scheme(at - std::begin(kSchemeNames)));
      }
    } else if (flag == "--chunk") {
      o.chunk = parse_bytes(value);
    } else if (flag == "--iters") {
      o.iters = std::stoi(value);
    } else if (flag == "--sizes") {
      o.sizes.clear();
      for (const std::string& size : split(value)) o.sizes.push_back(parse_bytes(size));
    } else {
      usage();
    }
  }
  if (argc % 2 == 0 || o.ranks < 2 || o.ranks > kMaxRanks || o.chunk < 4096 || o.iters < 1) {
    fmt::print(stderr, "allreduce_ceiling: bad arguments (ranks 2..{}, chunk >= 4K)\n", kMaxRanks);
    exit(2);
  }
  if (o.schemes.empty()) {
    o.schemes = {Scheme::shm, Scheme::cma, Scheme::mapped, Scheme::mapped_copyin};
  }
  // cma is 2 ranks only: left out of a list (said in the header), refused alone.
  if (o.ranks != 2) {
    o.cma_left_out = std::find(o.schemes.begin(), o.schemes.end(), Scheme::cma) != o.schemes.end();
    o.schemes.erase(std::remove(o.schemes.begin(), o.schemes.end(), Scheme::cma), o.schemes.end());
    if (o.schemes.empty()) {
      fmt::print(stderr, "allreduce_ceiling: --scheme cma needs --ranks 2 (got {})\n", o.ranks);
      exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  fmt::print(
      "# allreduce_ceiling: {} fp32{}, {} ranks, chunk {} B (shm, cma), best of {} runs; "
      "busbw = {} x bytes / time, GB/s = 1e9 B/s; ranks bound to cores when they fit them\n",
      kOpNames[int(o.op)], o.op == Op::all_gather ? "" : " sum", o.ranks, o.chunk, o.iters,
      o.op == Op::all_reduce ? "2(P-1)/P" : "(P-1)/P");
  if (o.cma_left_out) fmt::print("# cma: 2 ranks only, not run\n");
  bool failed = false;
  const std::vector<weft::CpuInfo> cpus = weft::allowed_cpus();
  for (Scheme scheme : o.schemes) {
    for (size_t bytes : o.sizes) {
      Counts c = counts(o.op, o.ranks, bytes);
      bool mapped = scheme == Scheme::mapped || scheme == Scheme::mapped_copyin;
      size_t slot_bytes =
          mapped ? (page_round(c.in) + page_round(c.out)) * sizeof(float) : 3 * o.chunk;
      Shared shared(o.ranks, slot_bytes);
      for (int r = 0; r < o.ranks; ++r) {
        // Each rank on its share of the cores when they fit, as weft-perf's and mpirun's ranks.
        const cpu_set_t mask = weft::cpu_mask(weft::cpu_share(cpus, r, o.ranks));
        if (fork() == 0) {
          if (CPU_COUNT(&mask) > 0) sched_setaffinity(0, sizeof mask, &mask);
          _exit(run_rank(shared, o, scheme, r, bytes) == 0 ? 0 : 3);
        }
      }
      // A rank exits 3 when its output was wrong, anything else when it failed (its time and
      // count are then not to be trusted).
      bool ran = true, right = true;
      for (int r = 0; r < o.ranks; ++r) {
        int status = 0;
        wait(&status);
        ran = ran && WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3);
        right = right && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      double slowest = 0;
      uint64_t wrong = 0;
      for (int r = 0; r < o.ranks; ++r) {
        slowest = std::max(slowest, shared.info(r).seconds.load());
        wrong += shared.info(r).wrong.load();
      }
      double algbw = double(c.bytes) / slowest / 1e9;
      const char* verdict = !ran ? "FAILED" : right && wrong == 0 ? "right" : "WRONG";
      fmt::print(
          "scheme={} op={} ranks={} bytes={} time_us={:.1f} algbw={:.2f} busbw={:.2f} wrong={} "
          "{}\n",
          kSchemeNames[int(scheme)], kOpNames[int(o.op)], o.ranks, c.bytes, slowest * 1e6, algbw,
          algbw * c.factor, wrong, verdict);
      failed = failed || !ran || !right;
      fflush(stdout);
    }
  }
  return failed ? 1 : 0;
}
