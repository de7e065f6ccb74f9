// nccl_raw: NCCL's collectives called directly in a loop, measured and printed as weft-perf
// --device cuda measures and prints them, so that the two tables side by side show what weft adds
// on top of NCCL (benchmarks/gpu/check runs both; docs/benchmarks.md, "GPU").
//
//   nccl_raw all_reduce -b 8 -e 1G -f 2                       # one rank, no launcher needed
//   weftrun --nproc-per-node 2 --standalone nccl_raw all_gather -b 1K -e 64M -f 4
//
// The same sizes (-b, -e, -f), warmup (-w), iterations (-n), check (-c) and busbw arithmetic as
// weft-perf (benchmarks/weft_perf.cc, after nccl-tests): size = the larger of what a rank sends
// and receives; all_reduce busbw = algbw x 2(n-1)/n, all_gather and reduce_scatter (n-1)/n,
// broadcast and reduce 1. Each size runs out of place, then in place; a timed run posts its n
// iterations on one stream and synchronises once, as nccl-tests does; the time printed is the
// average over ranks. float32 and sum only: the comparison wants one NCCL kernel per size, not
// every dtype.
//
// Ranks: one process each, one GPU each (local rank modulo the device count). Under a launcher
// (weftrun, torchrun, srun, mpirun) the ranks meet through weft's rendezvous, whose store carries
// NCCL's unique id from rank 0 to the others; without one it runs alone (world size 1).
// CUDA memory and streams come from libweft's CUDA runtime loader (runtime/cuda_runtime.h), so
// nothing here links CUDA; where there is no usable device it says so and exits 1.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nccl.h>

#include "weft/error.h"
#include "weft/rendezvous.h"

#include "benchmarks/nccl_tests_table.h"
#include "runtime/cuda_runtime.h"

namespace weft::nccl_raw {
namespace {

using Clock = std::chrono::steady_clock;

void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) {
    throw std::runtime_error(fmt::format("{} failed: {} ({})", call, ncclGetErrorString(result),
                                         ncclGetLastError(nullptr)));
  }
}
#define NCCL_CALL(call) check_nccl((call), #call)

struct Options {
  std::string collective = "all_reduce";
  size_t min_bytes = 32 << 20;  // weft-perf's and nccl-tests' defaults
  size_t max_bytes = 32 << 20;
  size_t step_factor = 1;
  size_t step_bytes = 1 << 20;
  int iters = 20;
  int warmup = 1;
  int check = 1;
};

const std::vector<std::string> kCollectives = {"all_reduce", "all_gather", "reduce_scatter",
                                               "broadcast", "reduce"};

// Prints the usage after `why` and exits: 2 for a usage error, 0 for -h (on stdout).
[[noreturn]] void usage(const std::string& why, int status = 2) {
  fmt::print(status == 0 ? stdout : stderr,
             "{}"
             "usage: nccl_raw [all_reduce|all_gather|reduce_scatter|broadcast|reduce|all]\n"
             "                [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]\n"
             "                [-c CHECKS] [-d float]\n"
             "weft-perf's flags with its meanings (docs/weft-perf.md); float32 sum only.\n",
             why.empty() ? "" : "nccl_raw: " + why + "\n");
  std::exit(status);
}

size_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    usage("not a size: " + text);
  }
  const std::string unit = text.substr(used);
  double scale = 1;
  if (unit == "K" || unit == "k") {
    scale = 1024.0;
  } else if (unit == "M" || unit == "m") {
    scale = 1024.0 * 1024;
  } else if (unit == "G" || unit == "g") {
    scale = 1024.0 * 1024 * 1024;
  } else if (!unit.empty()) {
    usage("not a size: " + text);
  }
  if (value < 0) usage("negative size: " + text);
  return static_cast<size_t>(value * scale);
}

int parse_int(const std::string& flag, const std::string& text, int lo, int hi) {
  try {
    size_t used = 0;
    const int v = std::stoi(text, &used);
    if (used == text.size() && v >= lo && v <= hi) return v;
  } catch (const std::exception&) {
  }
  usage(fmt::format("{} wants an integer in [{}, {}], not \"{}\"", flag, lo, hi, text));
}

Options parse(int argc, char** argv, std::vector<std::string>& collectives) {
  Options o;
  int i = 1;
  if (argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    usage("", 0);
  }
  if (argc > 1 && argv[1][0] != '-') {
    const std::string what = argv[1];
    if (what == "all") {
      collectives = kCollectives;
    } else if (std::find(kCollectives.begin(), kCollectives.end(), what) != kCollectives.end()) {
      collectives = {what};
    } else {
      usage("unknown collective: " + what +
            " (all_reduce, all_gather, reduce_scatter, broadcast, reduce or all)");
    }
    i = 2;
  } else {
    collectives = {"all_reduce"};
  }
  for (; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") usage("", 0);
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string v = argv[++i];
    if (flag == "-b") {
      o.min_bytes = parse_bytes(v);
    } else if (flag == "-e") {
      o.max_bytes = parse_bytes(v);
    } else if (flag == "-f") {
      o.step_factor = parse_int(flag, v, 1, 1 << 20);
    } else if (flag == "-i") {
      o.step_bytes = parse_bytes(v);
      o.step_factor = 1;
    } else if (flag == "-n") {
      o.iters = parse_int(flag, v, 1, 1 << 30);
    } else if (flag == "-w") {
      o.warmup = parse_int(flag, v, 0, 1 << 30);
    } else if (flag == "-c") {
      o.check = parse_int(flag, v, 0, 1 << 20);
    } else if (flag == "-d") {
      if (v != "float" && v != "float32") usage("nccl_raw measures float32 only, not " + v);
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (o.min_bytes > o.max_bytes) usage("-b is larger than -e");
  if (o.step_factor == 1 && o.step_bytes == 0) usage("-i 0 would never end");
  return o;
}

std::vector<size_t> sizes_of(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    const size_t next = o.step_factor > 1 ? s * o.step_factor : s + o.step_bytes;
    if (next <= s) break;
    s = next;
  }
  return sizes;
}

// weft-perf's Shape: per-call count, the size column and busbw / algbw.
struct Shape {
  size_t count = 0;
  size_t bytes = 0;
  double factor = 1;
};

Shape shape_of(const std::string& coll, size_t size, int n) {
  const size_t count = size / sizeof(float);
  Shape s;
  if (coll == "all_gather" || coll == "reduce_scatter") {
    s.count = count / n;
    s.bytes = s.count * n * sizeof(float);
    s.factor = double(n - 1) / n;
  } else {
    s.count = count;
    s.bytes = count * sizeof(float);
    s.factor = coll == "all_reduce" ? 2.0 * (n - 1) / n : 1.0;
  }
  return s;
}

// weft-perf's (nccl-tests') number format: as many decimals as fit the width.
std::string number(double value, int width) {
  int power = 0;
  for (uint64_t v = 1; value >= double(v) && power < 20; v *= 10) ++power;
  if (power < width - 2) return fmt::format("{:{}.2f}", value, width);
  if (power < width - 1) return fmt::format("{:{}.1f}", value, width);
  if (power < width + 1) return fmt::format("{:{}.0f}", value, width);
  return fmt::format("{:{}.1e}", value, width);
}

// Rank r's input at element i: small integers, so every sum is exact in float32.
float input(int rank, size_t i) { return float((size_t(rank) * 7 + i * 3) % 11 + 1); }

// One rank's communicator, stream and buffers (send, recv; both max_bytes, on `device`).
struct Rank {
  int rank = 0;
  int size = 1;
  int device = 0;
  CudaRuntime* cuda = nullptr;
  ncclComm_t comm = nullptr;
  CudaStream stream = nullptr;
  float* send = nullptr;
  float* recv = nullptr;
  double* scalar = nullptr;  // device memory for the time average
  std::vector<float> host;   // a host image of recv (or send) for -c
};

// Copies host <-> device in r.stream's order and waits: r.stream is a non-blocking stream, which
// cudaMemcpy's legacy default stream does not order against (a pageable host-to-device cudaMemcpy
// may even return before its DMA is done).
void copy_sync(Rank& r, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  r.cuda->copy_async(dst, src, bytes, r.stream);
  r.cuda->synchronize_stream(r.stream);
}

// Posts the collective once on r.stream.
void post(Rank& r, const std::string& coll, size_t c, bool in_place) {
  float* recv = r.recv;
  cudaStream_t stream = r.stream;
  if (coll == "all_reduce") {
    NCCL_CALL(
        ncclAllReduce(in_place ? recv : r.send, recv, c, ncclFloat32, ncclSum, r.comm, stream));
  } else if (coll == "all_gather") {
    NCCL_CALL(ncclAllGather(in_place ? recv + size_t(r.rank) * c : r.send, recv, c, ncclFloat32,
                            r.comm, stream));
  } else if (coll == "reduce_scatter") {
    NCCL_CALL(ncclReduceScatter(in_place ? recv : r.send,
                                in_place ? recv + size_t(r.rank) * c : recv, c, ncclFloat32,
                                ncclSum, r.comm, stream));
  } else if (coll == "broadcast") {
    NCCL_CALL(ncclBroadcast(in_place ? recv : r.send, recv, c, ncclFloat32, 0, r.comm, stream));
  } else if (coll == "reduce") {
    NCCL_CALL(
        ncclReduce(in_place ? recv : r.send, recv, c, ncclFloat32, ncclSum, 0, r.comm, stream));
  }
}

// Fills the inputs of one check on the host and copies them in; outputs start at -1.
void fill(Rank& r, const std::string& coll, size_t c, bool in_place) {
  const int n = r.size;
  const bool wide = coll == "all_gather" || coll == "reduce_scatter";
  const size_t recv_count = wide ? c * n : c;
  std::vector<float> send(wide && coll == "reduce_scatter" ? c * n : c);
  for (size_t i = 0; i < send.size(); ++i) send[i] = input(r.rank, i);
  std::vector<float> recv(recv_count, -1.0f);
  if (in_place) {
    if (coll == "all_gather") {
      std::copy(send.begin(), send.end(), recv.begin() + size_t(r.rank) * c);
    } else if (coll != "broadcast" || r.rank == 0) {
      std::copy(send.begin(), send.end(), recv.begin());
    }
  }
  copy_sync(r, r.send, send.data(), send.size() * sizeof(float));
  copy_sync(r, r.recv, recv.data(), recv.size() * sizeof(float));
}

// Elements of this rank's result that differ from the closed form.
int64_t wrong(Rank& r, const std::string& coll, size_t c, bool in_place) {
  const int n = r.size;
  const bool wide = coll == "all_gather" || coll == "reduce_scatter";
  std::vector<float> got(wide ? c * n : c);
  copy_sync(r, got.data(), r.recv, got.size() * sizeof(float));
  auto sum = [&](size_t i) {
    float acc = 0;
    for (int q = 0; q < n; ++q) acc += input(q, i);
    return acc;
  };
  int64_t bad = 0;
  if (coll == "all_reduce" || (coll == "reduce" && r.rank == 0)) {
    for (size_t i = 0; i < c; ++i) bad += got[i] != sum(i);
  } else if (coll == "reduce_scatter") {
    const size_t at = in_place ? size_t(r.rank) * c : 0;
    for (size_t i = 0; i < c; ++i) bad += got[at + i] != sum(size_t(r.rank) * c + i);
  } else if (coll == "all_gather") {
    for (size_t k = 0; k < c * n; ++k) bad += got[k] != input(int(k / c), k % c);
  } else if (coll == "broadcast") {
    for (size_t i = 0; i < c; ++i) bad += got[i] != input(0, i);
  }
  return bad;
}

// A sum over ranks of one double, through NCCL on the rank's stream.
double sum_over_ranks(Rank& r, double value) {
  copy_sync(r, r.scalar, &value, sizeof value);
  NCCL_CALL(ncclAllReduce(r.scalar, r.scalar, 1, ncclFloat64, ncclSum, r.comm, r.stream));
  copy_sync(r, &value, r.scalar, sizeof value);  // after the all_reduce, in r.stream's order
  return value;
}

struct Result {
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;
};

Result measure(Rank& r, const Options& o, const std::string& coll, const Shape& s, bool in_place) {
  for (int i = 0; i < o.warmup; ++i) post(r, coll, s.count, in_place);
  r.cuda->synchronize_stream(r.stream);
  sum_over_ranks(r, 0);  // every rank starts the timed loop after the others' warmup
  const auto start = Clock::now();
  for (int i = 0; i < o.iters; ++i) post(r, coll, s.count, in_place);
  r.cuda->synchronize_stream(r.stream);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / o.iters;
  Result result;
  const double average = sum_over_ranks(r, seconds) / r.size;
  result.time_us = average * 1e6;
  result.algbw = average > 0 ? double(s.bytes) / 1e9 / average : 0;
  result.busbw = result.algbw * s.factor;
  for (int k = 0; k < o.check; ++k) {
    fill(r, coll, s.count, in_place);
    post(r, coll, s.count, in_place);
    r.cuda->synchronize_stream(r.stream);
    result.wrong = int64_t(sum_over_ranks(r, double(wrong(r, coll, s.count, in_place))));
    if (result.wrong > 0) break;
  }
  return result;
}

bool launched() {
  for (const char* name : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return true;
  }
  return false;
}

int run(int argc, char** argv) {
  std::vector<std::string> collectives;
  const Options o = parse(argc, argv, collectives);
  Rank r;
  try {
    r.cuda = &cuda_runtime();
    const int count = r.cuda->device_count();
    if (count <= 0) throw_error(ErrorCode::Unsupported, "nccl_raw", "no CUDA device visible");
  } catch (const Error& e) {
    fmt::print(stderr, "nccl_raw: {}\n", e.what());
    return 1;
  }
  // The unique id goes from rank 0 to the others through weft's rendezvous store.
  std::optional<Rendezvous> rdzv;
  ncclUniqueId id;
  if (launched()) {
    rdzv.emplace(rendezvous());
    r.rank = rdzv->rank;
    r.size = rdzv->world_size;
    r.device = rdzv->local_rank % r.cuda->device_count();
    if (r.rank == 0) {
      NCCL_CALL(ncclGetUniqueId(&id));
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      rdzv->store->set("nccl_raw/unique_id", Bytes(bytes, bytes + sizeof id));
    } else {
      const Bytes bytes = rdzv->store->get("nccl_raw/unique_id");
      if (bytes.size() != sizeof id) {
        throw std::runtime_error(fmt::format("the unique id in the store has {} bytes, not {}",
                                             bytes.size(), sizeof id));
      }
      std::memcpy(&id, bytes.data(), sizeof id);
    }
  } else {
    NCCL_CALL(ncclGetUniqueId(&id));
  }
  r.cuda->set_device(r.device);
  NCCL_CALL(ncclCommInitRank(&r.comm, r.size, id, r.rank));
  r.stream = r.cuda->create_stream(r.device);
  const size_t max_bytes = std::max<size_t>(o.max_bytes, 64);
  r.send = static_cast<float*>(r.cuda->device_alloc(r.device, max_bytes));
  r.recv = static_cast<float*>(r.cuda->device_alloc(r.device, max_bytes));
  r.scalar = static_cast<double*>(r.cuda->device_alloc(r.device, sizeof(double)));
  r.cuda->fill(r.send, 0, max_bytes);
  r.cuda->fill(r.recv, 0, max_bytes);

  int version = 0;
  NCCL_CALL(ncclGetVersion(&version));
  int bad_lines = 0;
  for (const std::string& coll : collectives) {
    if (r.rank == 0) {
      fmt::print("# nccl_raw: NCCL {} called directly (benchmarks/gpu/nccl_raw.cc) ranks {}\n",
                 version, r.size);
      fmt::print("# Collective test starting: {}_perf\n", coll);
      fmt::print(
          "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} "
          "agg iters: 1 validation: {} graph: 0\n",
          o.min_bytes, o.max_bytes, o.step_factor > 1 ? o.step_factor : o.step_bytes,
          o.step_factor > 1 ? "factor" : "bytes", o.warmup, o.iters, o.check);
      fmt::print("#\n# Using devices\n");
      char host[128] = {};
      gethostname(host, sizeof host - 1);
      fmt::print(
          "#  Rank {:2d} Group  0 Pid {:6d} on {:>10} device {:2d} [0000:00:00] cuda, nccl\n",
          r.rank, int(getpid()), host, r.device);
      fmt::print("#\n");
      bench::print_nccl_tests_columns();
    }
    const bool reduces = coll == "all_reduce" || coll == "reduce_scatter" || coll == "reduce";
    const bool rooted = coll == "broadcast" || coll == "reduce";
    double bw_sum = 0;
    int bw_count = 0, bad = 0;
    for (size_t size : sizes_of(o)) {
      const Shape s = shape_of(coll, size, r.size);
      const Result out = measure(r, o, coll, s, false);
      const Result in = measure(r, o, coll, s, true);
      std::string line = fmt::format("{:12}  {:12}  {:>8}  {:>6}  {:6}", s.bytes, s.count, "float",
                                     reduces ? "sum" : "none", rooted ? 0 : -1);
      for (const Result* x : {&out, &in}) {
        line += fmt::format("  {:>7}  {:>6}  {:>6}", number(x->time_us, 7), number(x->algbw, 6),
                            number(x->busbw, 6));
        line += x->wrong < 0 ? "    N/A" : fmt::format("  {:6}", x->wrong);
        bad += x->wrong > 0;
        bw_sum += x->busbw;
        ++bw_count;
      }
      if (r.rank == 0) {
        fmt::print("{}\n", line);
        std::fflush(stdout);
      }
    }
    bad_lines += bad;
    if (r.rank == 0) {
      fmt::print("# {:<20} : {} {}\n", "Out of bounds values", bad, bad ? "FAILED" : "OK");
      fmt::print("# {:<20} : {} \n", "Avg bus bandwidth",
                 fmt::format("{:g}", bw_count ? bw_sum / bw_count : 0));
      fmt::print("#\n# Collective test concluded: {}_perf\n\n", coll);
      std::fflush(stdout);
    }
  }
  NCCL_CALL(ncclCommDestroy(r.comm));
  r.cuda->device_free(r.send);
  r.cuda->device_free(r.recv);
  r.cuda->device_free(r.scalar);
  r.cuda->destroy_stream(r.stream);
  return bad_lines ? 1 : 0;
}

}  // namespace
}  // namespace weft::nccl_raw

int main(int argc, char** argv) {
  try {
    return weft::nccl_raw::run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "nccl_raw: {}\n", e.what());
    return 1;
  }
}
