// weft-perf: collective benchmarks that read and print like nccl-tests.
//
//   weftrun --nproc-per-node 4 --standalone weft-perf all_reduce -b 8 -e 128M -f 2
//   mpirun -n 4 weft-perf all -b 1K -e 1M -f 4 -c 1 -J results.json
//   all_reduce_perf -b 8 -e 128M -f 2 -g 4        # nccl-tests' command line, through the link
//
// The first argument names the collective (or `all`), unless weft-perf runs as one of
// nccl-tests' binary names (all_reduce_perf, ...: links installed with it); then nccl-tests'
// flags with their meaning (docs/weft-perf.md lists them, and where weft-perf departs). Rank 0
// prints nccl-tests' layout: header, one line per size with out-of-place and in-place time, algbw,
// busbw and #wrong, and the footer, so a parser written for nccl-tests reads it unchanged. GB/s =
// 1e9 B/s; busbw = algbw x the op's factor, as nccl-tests: all_reduce 2(n-1)/n; all_gather,
// reduce_scatter, all_to_all, gather, scatter (n-1)/n on the full array; broadcast, reduce,
// sendrecv 1.
//
// --device cuda[:N] puts the buffers in CUDA device memory (cudaMalloc through libweft's CUDA
// runtime loader), as nccl-tests' are: the collectives then run on the group's CUDA backend (nccl,
// or tcp staging through pinned host memory), the timed loop posts its n iterations and then
// synchronises (Work::synchronize(), nccl-tests' cudaStreamSynchronize), and -c copies inputs to
// and results from the device around each check.
//
// Uses weft's public API (include/weft), as any embedding program would, and one internal header:
// runtime/cuda_runtime.h, libweft's loader of the CUDA runtime, so that weft-perf allocates device
// memory without linking CUDA (tests/public_api/private_includes_test.sh allows this one include).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/half.h"
#include "weft/process_group.h"
#include "weft/symmetric_buffer.h"

#include "benchmarks/nccl_tests_table.h"
#include "runtime/cpu_binding.h"
#include "runtime/cuda_runtime.h"

#ifndef WEFT_VERSION
#define WEFT_VERSION "unknown"
#endif

namespace weft::perf {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Options.

struct Options {
  std::vector<std::string> collectives;
  std::string program;  // the name nccl-tests' header prints: the link's ("all_reduce_perf"), or ""
  size_t min_bytes = 32 << 20;  // nccl-tests' defaults
  size_t max_bytes = 32 << 20;
  size_t step_factor = 1;
  size_t step_bytes = 1 << 20;
  int iters = 20;
  int warmup = 1;
  int agg = 1;
  std::vector<DType> dtypes = {DType::Float32};
  std::vector<ReduceOp> ops = {ReduceOp::Sum};
  bool all_roots = false;
  int root = 0;
  int check = 1;   // -c N: up to N check iterations per result, each on fresh inputs
  int cycles = 1;  // -N: sweeps of the sizes (0: until stopped)
  int blocking = 0;
  int average = 1;  // 0 rank 0, 1 average, 2 min, 3 max
  int timeout_s = 0;
  int nthreads = 1;  // -t, -g: ranks weft-perf starts itself when no launcher started it
  int ngpus = 1;
  std::string json_path;
  std::string csv_path;
  std::string backend;
  int symmetric = 0;  // -R 1: send and receive buffers in one symmetric buffer
  // --bind-to: the ranks started here (no launcher) are bound to cores when they fit them, as
  // mpirun binds its ranks (runtime/cpu_binding.h); false: --bind-to none.
  bool bind_to_core = true;
  bool wait_each = false;  // --wait each: the timed loop waits on its Works one by one, in order
  bool cuda = false;       // --device cuda[:N]: buffers in CUDA device memory
  int cuda_device = -1;    // N of cuda:N; -1: the local rank modulo the device count
  bool corrupt = false;    // test hook: flip one element before checking
  std::vector<std::string> notes;  // "# ..." lines rank 0 prints first (flags accepted, ignored)
  std::vector<std::string> args;
};

const std::vector<std::string> kCollectives = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
    "all_to_all", "gather",     "scatter",        "sendrecv",  "barrier"};

// nccl-tests' binaries, installed as links to weft-perf (benchmarks/meson.build): the name it is
// run as picks the collective, and the rest of the command line is nccl-tests'.
const std::map<std::string, std::string> kPerfPrograms = {{"all_reduce_perf", "all_reduce"},
                                                          {"all_gather_perf", "all_gather"},
                                                          {"reduce_scatter_perf", "reduce_scatter"},
                                                          {"broadcast_perf", "broadcast"},
                                                          {"reduce_perf", "reduce"},
                                                          {"alltoall_perf", "all_to_all"},
                                                          {"sendrecv_perf", "sendrecv"},
                                                          {"gather_perf", "gather"},
                                                          {"scatter_perf", "scatter"},
                                                          {"hypercube_perf", "hypercube"}};

// nccl-tests' spellings, which its log parsers expect in the type and redop columns.
std::string type_label(DType t) {
  switch (t) {
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
    case DType::Float16:
      return "half";
    case DType::Float8E4M3:
      return "f8e4m3";
    case DType::Float8E5M2:
      return "f8e5m2";
    default:
      return std::string(dtype_name(t));
  }
}

std::string op_label(ReduceOp op) {
  return op.kind == ReduceOp::PremulSum ? "mulsum" : std::string(reduce_op_name(op));
}

// This process's rank as its launcher numbered it, or -1 when no launcher variable is set
// (weft-perf then starts the ranks itself, as nccl-tests' -g does).
int launcher_rank() {
  for (const char* name : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return -1;
}

std::string usage_text(const std::string& name) {
  const bool link = kPerfPrograms.count(name) > 0;
  return fmt::format(
      "usage: {} {}[-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]\n"
      "       [-m AGG] [-d TYPE|all] [-o OP|all] [-r ROOT|all] [-c CHECKS] [-z 0..3] [-a 0..3]\n"
      "       [-N CYCLES] [-T SECONDS] [-J FILE.json] [--csv FILE.csv] [-g N] [-t N]\n"
      "       [-R 0|1] [--backend NAME] [--device cpu|cuda|cuda:N] [--bind-to core|none]\n"
      "       [--wait all|each]\n"
      "nccl-tests' flags, also as --long_name VALUE or --long_name=VALUE (docs/weft-perf.md);\n"
      "-R 1 puts the buffers in symmetric memory (zero-copy collectives between local ranks,\n"
      "docs/symmetric-memory.md);\n"
      "--device cuda puts them in CUDA memory on device (local rank % device count), cuda:N on\n"
      "device N, as nccl-tests' buffers (-d stays the datatype); the default is cpu;\n"
      "-G, -C, -S, -p, -y, -x, -D, -V, -M, -u, -I, -K are accepted and ignored with a note.\n"
      "{}"
      "Launch under weftrun, mpirun or srun; without a launcher, -g N x -t M ranks are started\n"
      "here (one process each), each bound to its share of the cores when they fit them, as\n"
      "mpirun does (--bind-to none: not bound).\n",
      name, link ? "" : "COLLECTIVE|all ",
      link ? ""
           : "collectives: all_reduce all_gather reduce_scatter broadcast reduce all_to_all\n"
             "             gather scatter sendrecv barrier hypercube, or all; oneway (rank\n"
             "             2k sends to 2k+1 only, as ucx_perftest's tag_bw); or run it as\n"
             "             all_reduce_perf, alltoall_perf, ... (nccl-tests' names)\n");
}

// A usage error ends every rank with status 2, but only one rank says why: rank 0 of a launched
// job (or a process no launcher started), so that the message is not repeated once per rank.
std::string g_program = "weft-perf";

[[noreturn]] void usage_error(const std::string& why) {
  if (launcher_rank() <= 0) {
    fmt::print(stderr, "{}: {}\n{}", g_program, why, usage_text(g_program));
  } else {
    // The other ranks leave rank 0 the time to say why: a launcher (weftrun, torchrun) stops the
    // whole job when the first rank exits, which must not be one of these before rank 0 printed.
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  std::exit(2);
}

size_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    usage_error("not a size: " + text);
  }
  std::string unit = text.substr(used);
  double scale = 1;
  if (unit == "K" || unit == "k")
    scale = 1024.0;
  else if (unit == "M" || unit == "m")
    scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g")
    scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    usage_error("not a size: " + text);
  if (value < 0) usage_error("negative size: " + text);
  return static_cast<size_t>(value * scale);
}

int parse_int(const std::string& flag, const std::string& text, int lo, int hi) {
  try {
    size_t used = 0;
    int v = std::stoi(text, &used);
    if (used == text.size() && v >= lo && v <= hi) return v;
  } catch (const std::exception&) {
  }
  usage_error(fmt::format("{} wants an integer in [{}, {}], not \"{}\"", flag, lo, hi, text));
}

std::vector<DType> parse_dtypes(const std::string& text) {
  if (text == "all") {
    // nccl-tests' list and order, fp8 last as in nccl-tests built against NCCL 2.24+.
    return {DType::Int8,    DType::UInt8,   DType::Int32,    DType::Int64,      DType::Float16,
            DType::Float32, DType::Float64, DType::BFloat16, DType::Float8E4M3, DType::Float8E5M2};
  }
  auto t = parse_dtype(text);
  if (!t || *t == DType::Bool) usage_error("unknown or unsupported datatype: " + text);
  return {*t};
}

std::vector<ReduceOp> parse_ops(const std::string& text) {
  const ReduceOp mulsum = ReduceOp::premul_sum(0.5);
  if (text == "all") {
    return {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg, mulsum};
  }
  if (text == "mulsum") return {mulsum};
  auto op = parse_reduce_op(text);
  if (!op) usage_error("unknown reduction op: " + text);
  return {*op};
}

// --device cpu, cuda or cuda:N.
void parse_device(Options& o, const std::string& text) {
  o.cuda = text.rfind("cuda", 0) == 0;
  o.cuda_device = -1;
  if (text == "cpu" || text == "cuda") return;
  if (o.cuda && text.size() > 5 && text[4] == ':') {
    o.cuda_device = parse_int("--device cuda:N", text.substr(5), 0, 1 << 16);
    return;
  }
  usage_error("--device wants cpu, cuda or cuda:N, not \"" + text + "\"");
}

// nccl-tests' long options, by their short letter (its getopt_long table).
const std::map<std::string, std::string> kLongNames = {{"--nthreads", "-t"},
                                                       {"--ngpus", "-g"},
                                                       {"--minbytes", "-b"},
                                                       {"--maxbytes", "-e"},
                                                       {"--stepbytes", "-i"},
                                                       {"--stepfactor", "-f"},
                                                       {"--iters", "-n"},
                                                       {"--agg_iters", "-m"},
                                                       {"--warmup_iters", "-w"},
                                                       {"--run_cycles", "-N"},
                                                       {"--parallel_init", "-p"},
                                                       {"--check", "-c"},
                                                       {"--op", "-o"},
                                                       {"--datatype", "-d"},
                                                       {"--root", "-r"},
                                                       {"--blocking", "-z"},
                                                       {"--stream_null", "-y"},
                                                       {"--timeout", "-T"},
                                                       {"--cudagraph", "-G"},
                                                       {"--report_cputime", "-C"},
                                                       {"--report_timestamps", "-S"},
                                                       {"--output_file", "-J"},
                                                       {"--average", "-a"},
                                                       {"--local_register", "-R"},
                                                       {"--cta_policy", "-x"},
                                                       {"--device_implementation", "-D"},
                                                       {"--device_cta_count", "-V"},
                                                       {"--memory", "-M"},
                                                       {"--unalign", "-u"},
                                                       {"--per_iter_timing", "-I"},
                                                       {"--per_iter_skip", "-K"},
                                                       {"--help", "-h"}};

// nccl-tests' flags that mean nothing for weft on the CPU: accepted with their value and noted.
const std::map<std::string, std::string> kIgnored = {
    {"-G", "CUDA graph launches: weft's collectives run on the CPU, without graphs"},
    {"-C", "report CPU time: weft-perf's times are the CPU's wall clock already"},
    {"-S", "timestamps are not printed"},
    {"-p", "parallel init: ranks always initialise in parallel, one process each"},
    {"-y", "stream_null: --device cuda orders collectives after the default stream always"},
    {"-x", "CTA policy: no CUDA kernels run"},
    {"-D", "device implementation: no CUDA kernels run"},
    {"-V", "device CTA count: no CUDA kernels run"},
    {"-M", "memory report: not measured"},
    {"-u", "unaligned buffers: buffers are always aligned"},
    {"-I", "per-iteration timing: not measured"},
    {"-K", "per-iteration skip: not measured"}};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 0; i < argc; ++i) o.args.push_back(argv[i]);
  std::string name = argc > 0 ? argv[0] : "weft-perf";
  if (size_t slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  g_program = name;
  int first = 1;
  if (auto it = kPerfPrograms.find(name); it != kPerfPrograms.end()) {
    o.collectives = {it->second};
    o.program = name;
  } else if (argc >= 2 &&
             (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    if (launcher_rank() <= 0) fmt::print("{}", usage_text(name));
    std::exit(0);
  } else {
    if (argc < 2 || argv[1][0] == '-') usage_error("name the collective first");
    std::string what = argv[1] == std::string("alltoall") ? "all_to_all" : argv[1];
    if (what == "all") {
      o.collectives = kCollectives;
    } else if (std::find(kCollectives.begin(), kCollectives.end(), what) != kCollectives.end() ||
               what == "hypercube" || what == "oneway") {
      o.collectives = {what};
    } else {
      usage_error("unknown collective: " + what);
    }
    first = 2;
  }
  for (int i = first; i < argc; ++i) {
    std::string flag = argv[i];
    std::optional<std::string> value;
    if (flag.rfind("--", 0) == 0) {
      if (size_t eq = flag.find('='); eq != std::string::npos) {
        value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
      }
      if (auto it = kLongNames.find(flag); it != kLongNames.end()) flag = it->second;
    } else if (flag.size() > 2 && flag[0] == '-' &&
               !std::isdigit(static_cast<unsigned char>(flag[1]))) {
      value = flag.substr(2);  // getopt's -b8
      flag = flag.substr(0, 2);
    }
    if (flag == "-h") {
      if (launcher_rank() <= 0) fmt::print("{}", usage_text(name));
      std::exit(0);
    }
    if (flag == "--corrupt-one-element") {  // test hook, see docs/weft-perf.md
      o.corrupt = true;
      continue;
    }
    if (!value) {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      value = argv[++i];
    }
    const std::string& v = *value;
    if (flag == "-b")
      o.min_bytes = parse_bytes(v);
    else if (flag == "-e")
      o.max_bytes = parse_bytes(v);
    else if (flag == "-f")
      o.step_factor = parse_int(flag, v, 1, 1 << 20);
    else if (flag == "-i")
      o.step_bytes = parse_bytes(v), o.step_factor = 1;
    else if (flag == "-n")
      o.iters = parse_int(flag, v, 1, 1 << 30);
    else if (flag == "-w")
      o.warmup = parse_int(flag, v, 0, 1 << 30);
    else if (flag == "-m")
      o.agg = parse_int(flag, v, 1, 1 << 20);
    else if (flag == "-N")
      o.cycles = parse_int(flag, v, 0, 1 << 30);
    else if (flag == "-d")
      o.dtypes = parse_dtypes(v);
    else if (flag == "-o")
      o.ops = parse_ops(v);
    else if (flag == "-r" && v == "all")
      o.all_roots = true;
    else if (flag == "-r")
      o.root = parse_int(flag, v, 0, 1 << 20);
    else if (flag == "-c")
      o.check = parse_int(flag, v, 0, 1 << 20);
    else if (flag == "-z")
      o.blocking = parse_int(flag, v, 0, 3);
    else if (flag == "-a")
      o.average = parse_int(flag, v, 0, 3);
    else if (flag == "-T")
      o.timeout_s = parse_int(flag, v, 0, 1 << 24);
    else if (flag == "-J")
      o.json_path = v;
    else if (flag == "-t")
      o.nthreads = parse_int(flag, v, 1, 4096);
    else if (flag == "-g")
      o.ngpus = parse_int(flag, v, 1, 4096);
    else if (flag == "--csv")
      o.csv_path = v;
    else if (flag == "--backend")
      o.backend = v;
    else if (flag == "-R")
      o.symmetric = parse_int(flag, v, 0, 1);
    else if (flag == "--device")
      parse_device(o, v);
    else if (flag == "--bind-to" && (v == "core" || v == "none"))
      o.bind_to_core = v == "core";
    else if (flag == "--bind-to")
      usage_error("--bind-to " + v + ": expected core or none");
    else if (flag == "--wait" && (v == "all" || v == "each"))
      o.wait_each = v == "each";
    else if (flag == "--wait")
      usage_error("--wait " + v + ": expected all or each");
    else if (auto it = kIgnored.find(flag); it != kIgnored.end())
      o.notes.push_back(fmt::format("{} {} ignored: {}", flag, v, it->second));
    else
      usage_error("unknown flag " + std::string(argv[i]));
  }
  if (o.min_bytes > o.max_bytes) usage_error("-b is larger than -e");
  if (o.step_factor == 1 && o.step_bytes == 0) usage_error("-i 0 would never end");
  if (o.nthreads * o.ngpus > 4096) usage_error("-t x -g is more than 4096 ranks");
  if (o.cuda && o.symmetric)
    usage_error("-R 1 and --device cuda: symmetric buffers are host memory");
  return o;
}

std::vector<size_t> sizes_of(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    size_t next = o.step_factor > 1 ? s * o.step_factor : s + o.step_bytes;
    if (next <= s) break;  // -b 0 with a factor, or overflow
    s = next;
  }
  return sizes;
}

// ---- Element access for every dtype, through double (the values used are small integers).

using weft::bf16_to_float;
using weft::e4m3fn_to_float;
using weft::e5m2_to_float;
using weft::float_to_bf16;
using weft::float_to_e4m3fn;
using weft::float_to_e5m2;
using weft::float_to_half;
using weft::half_to_float;

double load(DType t, const void* base, size_t i) {
  switch (t) {
    case DType::Float32:
      return static_cast<const float*>(base)[i];
    case DType::Float64:
      return static_cast<const double*>(base)[i];
    case DType::Float16:
      return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::BFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::Float8E4M3:
      return e4m3fn_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::Float8E5M2:
      return e5m2_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::Int8:
      return static_cast<const int8_t*>(base)[i];
    case DType::UInt8:
      return static_cast<const uint8_t*>(base)[i];
    case DType::Int32:
      return static_cast<const int32_t*>(base)[i];
    case DType::Int64:
      return double(static_cast<const int64_t*>(base)[i]);
    case DType::UInt32:
      return static_cast<const uint32_t*>(base)[i];
    case DType::UInt64:
      return double(static_cast<const uint64_t*>(base)[i]);
    case DType::Bool:
      return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

void store(DType t, void* base, size_t i, double v) {
  switch (t) {
    case DType::Float32:
      static_cast<float*>(base)[i] = float(v);
      break;
    case DType::Float64:
      static_cast<double*>(base)[i] = v;
      break;
    case DType::Float16:
      static_cast<uint16_t*>(base)[i] = float_to_half(float(v));
      break;
    case DType::BFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(float(v));
      break;
    case DType::Float8E4M3:
      static_cast<uint8_t*>(base)[i] = float_to_e4m3fn(float(v));
      break;
    case DType::Float8E5M2:
      static_cast<uint8_t*>(base)[i] = float_to_e5m2(float(v));
      break;
    case DType::Int8:
      static_cast<int8_t*>(base)[i] = int8_t(v);
      break;
    case DType::UInt8:
      static_cast<uint8_t*>(base)[i] = uint8_t(v);
      break;
    case DType::Int32:
      static_cast<int32_t*>(base)[i] = int32_t(v);
      break;
    case DType::Int64:
      static_cast<int64_t*>(base)[i] = int64_t(v);
      break;
    case DType::UInt32:
      static_cast<uint32_t*>(base)[i] = uint32_t(v);
      break;
    case DType::UInt64:
      static_cast<uint64_t*>(base)[i] = uint64_t(v);
      break;
    case DType::Bool:
      static_cast<uint8_t*>(base)[i] = v != 0;
      break;
  }
}

bool is_bitwise(ReduceOp op) {
  return op.kind == ReduceOp::BAnd || op.kind == ReduceOp::BOr || op.kind == ReduceOp::BXor;
}

// Whether weft defines `op` on `t` (the combinations weft-perf skips with a comment otherwise).
bool defined(DType t, ReduceOp op) {
  if (is_bitwise(op)) return !is_floating(t);
  if (op.kind == ReduceOp::PremulSum) return is_floating(t);
  return true;
}

bool is_fp8(DType t) { return t == DType::Float8E4M3 || t == DType::Float8E5M2; }

// ---- The data: what rank r contributes at element i, and what a reduction of it must give.

class Data {
 public:
  Data(int ranks, DType t, ReduceOp op) : ranks_(ranks), dtype_(t), op_(op) {
    spread_ = std::clamp(100 / std::max(ranks, 1), 1, 11);  // int8 sums of every rank fit
    // fp8 holds integers exactly only up to 16 (e4m3fn) or 8 (e5m2): inputs 1 and 2 keep every
    // partial sum exact up to 8 (e4m3fn) or 4 (e5m2) ranks; matches() allows for rounding past.
    if (is_fp8(t)) spread_ = 2;
  }

  // Check iteration `rep` (-c N) gets inputs of its own, so that a result left over from the
  // previous one does not pass.
  void set_rep(int rep) { shift_ = size_t(rep) * 13; }

  double input(int rank, size_t i) const {
    i += shift_;
    if (op_.kind == ReduceOp::Prod) return (rank + i) % std::max(ranks_, 5) == 0 ? 2 : 1;
    if (is_bitwise(op_)) return double((1u << ((rank + i) % 6)) | ((i % 3) << 5));
    return double((size_t(rank) * 7 + i * 3) % size_t(spread_) + 1);
  }

  // The reduction over every rank of element i, computed here, not by weft.
  double reduced(size_t i) const {
    if (is_bitwise(op_)) {
      int64_t acc = int64_t(input(0, i));
      for (int r = 1; r < ranks_; ++r) {
        int64_t v = int64_t(input(r, i));
        acc = op_.kind == ReduceOp::BAnd  ? (acc & v)
              : op_.kind == ReduceOp::BOr ? (acc | v)
                                          : (acc ^ v);
      }
      return double(acc);
    }
    double acc = op_.kind == ReduceOp::Prod ? 1 : 0;
    for (int r = 0; r < ranks_; ++r) {
      double v = input(r, i);
      switch (op_.kind) {
        case ReduceOp::Prod:
          acc *= v;
          break;
        case ReduceOp::Min:
          acc = r == 0 ? v : std::min(acc, v);
          break;
        case ReduceOp::Max:
          acc = r == 0 ? v : std::max(acc, v);
          break;
        case ReduceOp::PremulSum:
          acc += op_.factor * v;
          break;
        default:
          acc += v;
          break;
      }
    }
    if (op_.kind == ReduceOp::Avg) {
      acc = is_floating(dtype_) ? acc / ranks_ : std::trunc(acc / ranks_);
    }
    return acc;
  }

  bool matches(double got, double expected) const {
    if (!is_floating(dtype_)) return got == expected;
    if (is_fp8(dtype_)) {
      // Every rounding costs up to half an ulp, 2^-4 of the value in e4m3fn and 2^-3 in e5m2,
      // and an element meets up to 2 * ranks of them (premultiplying each input, each partial
      // sum, the final division): that is the bound. The inputs are positive, so no
      // cancellation makes it relative to anything smaller than the result.
      const double half_ulp = dtype_ == DType::Float8E4M3 ? 1.0 / 16 : 1.0 / 8;
      return std::fabs(got - expected) <=
             2 * ranks_ * half_ulp * std::max(1.0, std::fabs(expected));
    }
    double tolerance = dtype_ == DType::Float64   ? 1e-12
                       : dtype_ == DType::Float32 ? 1e-6
                       : dtype_ == DType::Float16 ? 1e-3
                                                  : 1e-2;
    return std::fabs(got - expected) <= tolerance * std::max(1.0, std::fabs(expected));
  }

 private:
  int ranks_;
  DType dtype_;
  ReduceOp op_;
  int spread_;
  size_t shift_ = 0;
};

// ---- One collective at one size, both placements.

// Sizes in nccl-tests' terms: `count` is the per-call count (nccl-tests' paramcount) and `bytes`
// the larger of what a rank sends and receives (the size column).
struct Shape {
  size_t count = 0;
  size_t bytes = 0;
  double factor = 1;      // busbw / algbw
  double alg_factor = 1;  // algbw / (bytes / time): (n-1)/n for hypercube, as nccl-tests
};

Shape shape_of(const std::string& coll, size_t size, DType t, int n) {
  const size_t width = dtype_size(t);
  size_t count = size / width;
  Shape s;
  if (coll == "all_gather" || coll == "reduce_scatter" || coll == "all_to_all" ||
      coll == "gather" || coll == "scatter") {
    s.count = count / n;
    s.bytes = s.count * n * width;
    s.factor = double(n - 1) / n;
  } else if (coll == "hypercube") {
    // nccl-tests' hypercube_perf: an all_gather by send/recv; algbw counts the (n-1)/n of the
    // output a rank receives, busbw = algbw.
    s.count = count / n;
    s.bytes = s.count * n * width;
    s.alg_factor = double(n - 1) / n;
  } else {
    s.count = count;
    s.bytes = count * width;
    s.factor = coll == "all_reduce" ? 2.0 * (n - 1) / n : 1.0;
  }
  if (coll == "barrier") s = Shape{0, 0, 0};
  return s;
}

bool has_root(const std::string& coll) {
  return coll == "broadcast" || coll == "reduce" || coll == "gather" || coll == "scatter";
}

bool reduces(const std::string& coll) {
  return coll == "all_reduce" || coll == "reduce_scatter" || coll == "reduce";
}

// send and recv live in `symmetric` under -R 1, in `owned` otherwise; scratch always in owned.
// Under --device cuda the collectives run on device memory (device_send, device_recv,
// device_scratch, cut from one cudaMalloc), and send, recv and scratch are their host images:
// filled there and copied in before a check, copied back and checked there after it.
struct Buffers {
  std::vector<std::byte> owned;
  std::shared_ptr<SymmetricBuffer> symmetric;
  std::span<std::byte> send, recv, scratch;

  int device = -1;  // the CUDA device of the device buffers; -1: host buffers only
  std::byte* device_memory = nullptr;
  std::span<std::byte> device_send, device_recv, device_scratch;
  // Where weft-perf's own small collectives (times, #wrong, device lines) run when the group
  // has no backend for host memory (--backend nccl): staged through this device memory.
  std::span<std::byte> device_control;

  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    if (device_memory != nullptr) cuda_runtime().device_free(device_memory);
  }

  bool on_device() const { return device >= 0; }
  // What the collectives run on.
  std::span<std::byte> io_send() const { return on_device() ? device_send : send; }
  std::span<std::byte> io_recv() const { return on_device() ? device_recv : recv; }
  std::span<std::byte> io_scratch() const { return on_device() ? device_scratch : scratch; }
  Device io_device() const { return on_device() ? Device::cuda(device) : Device{}; }
};

// Copies bytes between the buffers the collectives run on: ordered on the calling thread's
// current CUDA stream under --device cuda (before the collective posted next, which waits for
// that stream), a plain memcpy otherwise.
void copy_io(const Buffers& b, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (b.on_device()) {
    cuda_runtime().copy_async(dst, src, bytes, current_cuda_stream());
  } else {
    std::memcpy(dst, src, bytes);
  }
}

// Blocks until `work` is done: Work::synchronize() for device buffers (the device's work
// included, as nccl-tests' cudaStreamSynchronize), then the current stream, where the in-place
// sendrecv queues its copy after the collective; wait() otherwise.
void complete(const Buffers& b, const std::shared_ptr<Work>& work) {
  if (b.on_device()) {
    work->synchronize();
    cuda_runtime().synchronize_stream(current_cuda_stream());
  } else {
    work->wait();
  }
}

// weft-perf's own small collectives on host values (times, #wrong counts, device lines): on host
// tensors when the group has a backend for host memory, else staged through device_control.
class Control {
 public:
  Control(ProcessGroup& pg, const Buffers& b) : pg_(pg), b_(b) {
    host_ = true;
    try {
      pg.backend_name(DeviceKind::Cpu);
    } catch (const Error&) {
      host_ = !b.on_device();  // no host backend: stage through device memory when there is some
    }
  }

  void all_reduce(Tensor t, ReduceOp op) {
    staged(t, t.count, [&](Tensor d) { return pg_.all_reduce(d, op); });
  }
  void broadcast(Tensor t, int root) {
    staged(t, t.count, [&](Tensor d) { return pg_.broadcast(d, root); });
  }
  // `out` holds size() x in.count elements.
  void all_gather(Tensor out, Tensor in) {
    if (host_) return pg_.all_gather_into_tensor(out, in)->wait();
    const size_t width = dtype_size(in.dtype);
    std::byte* base = b_.device_control.data();
    WEFT_CHECK(in.nbytes() + out.nbytes() <= b_.device_control.size());
    cuda_runtime().copy(base, in.data, in.nbytes());
    Tensor d_in{base, in.count, in.dtype, b_.io_device()};
    Tensor d_out{base + in.count * width, out.count, out.dtype, b_.io_device()};
    pg_.all_gather_into_tensor(d_out, d_in)->synchronize();
    cuda_runtime().copy(out.data, d_out.data, out.nbytes());
  }

 private:
  template <typename F>
  void staged(Tensor t, size_t count, F&& call) {
    if (host_) return call(t)->wait();
    WEFT_CHECK(t.nbytes() <= b_.device_control.size());
    cuda_runtime().copy(b_.device_control.data(), t.data, t.nbytes());
    call(Tensor{b_.device_control.data(), count, t.dtype, b_.io_device()})->synchronize();
    cuda_runtime().copy(t.data, b_.device_control.data(), t.nbytes());
  }

  ProcessGroup& pg_;
  const Buffers& b_;
  bool host_;
};

class Runner {
 public:
  Runner(ProcessGroup& pg, const Options& o, Buffers& buffers, Control& control, std::string coll,
         DType t, ReduceOp op, int root, Shape shape)
      : pg_(pg),
        o_(o),
        b_(buffers),
        control_(control),
        coll_(std::move(coll)),
        t_(t),
        op_(op),
        root_(root),
        s_(shape),
        data_(pg.size(), t, op),
        rank_(pg.rank()),
        n_(pg.size()) {}

  // Fills what the collective reads, for `in_place` or not. Output regions first get a value
  // no result has (-1), so that an element never written counts as wrong. Under --device cuda
  // the host images are filled, then copied to the device buffers.
  void fill(bool in_place) {
    fill_host(in_place);
    if (!b_.on_device() || s_.bytes == 0) return;
    cuda_runtime().copy(b_.device_send.data(), b_.send.data(), s_.bytes);
    cuda_runtime().copy(b_.device_recv.data(), b_.recv.data(), s_.bytes);
  }

  void fill_host(bool in_place) {
    const size_t c = s_.count;
    void* send = b_.send.data();
    void* recv = b_.recv.data();
    const bool wide = coll_ == "all_gather" || coll_ == "gather" || coll_ == "all_to_all" ||
                      coll_ == "hypercube" ||
                      (in_place && (coll_ == "reduce_scatter" || coll_ == "scatter"));
    if (coll_ != "barrier") {
      for (size_t i = 0, end = wide ? c * n_ : c; i < end; ++i) store(t_, recv, i, -1);
    }
    auto fill_range = [&](void* base, size_t offset, size_t len, size_t first) {
      for (size_t i = 0; i < len; ++i) store(t_, base, offset + i, data_.input(rank_, first + i));
    };
    const bool root_only = coll_ == "broadcast" || coll_ == "scatter";
    if (root_only && rank_ != root_) return;
    if (oneway_receiver()) return;  // nothing to send
    if (coll_ == "all_reduce" || coll_ == "reduce" || coll_ == "broadcast" || coll_ == "sendrecv" ||
        coll_ == "oneway") {
      fill_range(in_place ? recv : send, 0, c, 0);
    } else if (coll_ == "all_gather" || coll_ == "gather" || coll_ == "hypercube") {
      if (in_place) {
        fill_range(recv, rank_ * c, c, 0);
      } else {
        fill_range(send, 0, c, 0);
      }
    } else if (coll_ == "reduce_scatter" || coll_ == "all_to_all" || coll_ == "scatter") {
      fill_range(in_place ? recv : send, 0, c * n_, 0);
    }
  }

  std::shared_ptr<Work> issue(bool in_place) {
    const size_t c = s_.count;
    const Device device = b_.io_device();
    auto view = [&](std::span<std::byte> buf, size_t offset, size_t count) {
      return Tensor{buf.data() + offset * dtype_size(t_), count, t_, device};
    };
    const std::span<std::byte> send = b_.io_send();
    const std::span<std::byte> recv = b_.io_recv();
    const std::span<std::byte> scratch = b_.io_scratch();
    if (coll_ == "all_reduce") {
      return in_place ? pg_.all_reduce(view(recv, 0, c), op_)
                      : pg_.all_reduce(view(send, 0, c), view(recv, 0, c), op_);
    }
    if (coll_ == "all_gather") {
      return pg_.all_gather_into_tensor(view(recv, 0, c * n_),
                                        in_place ? view(recv, rank_ * c, c) : view(send, 0, c));
    }
    if (coll_ == "reduce_scatter") {
      return in_place
                 ? pg_.reduce_scatter_tensor(view(recv, rank_ * c, c), view(recv, 0, c * n_), op_)
                 : pg_.reduce_scatter_tensor(view(recv, 0, c), view(send, 0, c * n_), op_);
    }
    if (coll_ == "all_to_all") {
      return pg_.all_to_all(view(recv, 0, c * n_),
                            in_place ? view(recv, 0, c * n_) : view(send, 0, c * n_));
    }
    if (coll_ == "broadcast") {
      // weft's broadcast is in place; out of place, the root first copies its input over.
      if (!in_place && rank_ == root_) copy_io(b_, recv.data(), send.data(), c * dtype_size(t_));
      return pg_.broadcast(view(recv, 0, c), root_);
    }
    if (coll_ == "reduce") {
      return in_place ? pg_.reduce(view(recv, 0, c), root_, op_)
                      : pg_.reduce(view(send, 0, c), view(recv, 0, c), root_, op_);
    }
    if (coll_ == "gather") {
      return pg_.gather_into_tensor(view(recv, 0, c * n_),
                                    in_place ? view(recv, rank_ * c, c) : view(send, 0, c), root_);
    }
    if (coll_ == "scatter") {
      return in_place
                 ? pg_.scatter_from_tensor(view(recv, rank_ * c, c), view(recv, 0, c * n_), root_)
                 : pg_.scatter_from_tensor(view(recv, 0, c), view(send, 0, c * n_), root_);
    }
    if (coll_ == "hypercube") {
      // nccl-tests' hypercube all_gather: log2(n) steps; at the step of bit `mask` a rank
      // exchanges the mask blocks it has with rank ^ mask. REQUIRES: n a power of two.
      const size_t width = dtype_size(t_);
      if (!in_place) copy_io(b_, recv.data() + rank_ * c * width, send.data(), c * width);
      std::shared_ptr<Work> work = pg_.barrier();
      for (int mask = 1; mask < n_; mask <<= 1) {
        work->wait();
        const int s = rank_ & ~(mask - 1), r = s ^ mask;
        pg_.start_coalescing();
        pg_.send(view(recv, size_t(s) * c, c * mask), rank_ ^ mask);
        pg_.recv(view(recv, size_t(r) * c, c * mask), rank_ ^ mask);
        work = pg_.end_coalescing();
      }
      return work;
    }
    if (coll_ == "sendrecv") {
      // A ring shift. weft has no in-place send/recv: in place receives into scratch, then
      // copies into the buffer it sent from (the time includes that copy).
      const int next = (rank_ + 1) % n_, prev = (rank_ - 1 + n_) % n_;
      pg_.start_coalescing();
      pg_.send(in_place ? view(recv, 0, c) : view(send, 0, c), next);
      pg_.recv(in_place ? view(scratch, 0, c) : view(recv, 0, c), prev);
      auto work = pg_.end_coalescing();
      if (!in_place) return work;
      work->wait();  // for device buffers: orders the current stream, whose copy follows
      copy_io(b_, recv.data(), scratch.data(), c * dtype_size(t_));
      return work;
    }
    if (coll_ == "oneway") {
      // One direction only, as ucx_perftest's tag_bw and osu_bw: rank 2k sends to rank 2k+1.
      // In place, the sender sends from and the receiver receives into the recv buffer.
      if (oneway_receiver()) return pg_.recv(view(recv, 0, c), rank_ - 1);
      return pg_.send(in_place ? view(recv, 0, c) : view(send, 0, c), rank_ + 1);
    }
    return pg_.barrier();
  }

  // Elements of this rank's result that differ from the expected values (the device's result
  // copied back to the host image first, under --device cuda).
  int64_t wrong(bool in_place) {
    if (b_.on_device() && s_.bytes > 0) {
      cuda_runtime().copy(b_.recv.data(), b_.device_recv.data(), s_.bytes);
    }
    const size_t c = s_.count;
    void* recv = b_.recv.data();
    int64_t bad = 0;
    bool first = true;
    // The rank the test hook flips an element on: one that checks a result.
    int corrupt_rank = 0;
    if (coll_ == "oneway") {
      corrupt_rank = 1;  // the first receiver
    } else if (has_root(coll_) && coll_ != "scatter" && coll_ != "broadcast") {
      corrupt_rank = root_;
    }
    auto check = [&](size_t offset, double expected) {
      if (first && o_.corrupt && rank_ == corrupt_rank) {
        // The test hook. fp8's tolerance can exceed 1 (matches()): there the element turns
        // negative instead, far outside it, since every expected value is positive.
        const double value = load(t_, recv, offset);
        store(t_, recv, offset, is_fp8(t_) ? -(value + 1) : value + 1);
      }
      first = false;
      bad += !data_.matches(load(t_, recv, offset), expected);
    };
    if (coll_ == "all_reduce" || (coll_ == "reduce" && rank_ == root_)) {
      for (size_t i = 0; i < c; ++i) check(i, data_.reduced(i));
    } else if (coll_ == "reduce_scatter") {
      const size_t at = in_place ? rank_ * c : 0;
      for (size_t i = 0; i < c; ++i) check(at + i, data_.reduced(rank_ * c + i));
    } else if (coll_ == "all_gather" || coll_ == "hypercube" ||
               (coll_ == "gather" && rank_ == root_)) {
      for (size_t k = 0; k < c * n_; ++k) check(k, data_.input(int(k / c), k % c));
    } else if (coll_ == "all_to_all") {
      for (size_t k = 0; k < c * n_; ++k) check(k, data_.input(int(k / c), rank_ * c + k % c));
    } else if (coll_ == "broadcast") {
      for (size_t i = 0; i < c; ++i) check(i, data_.input(root_, i));
    } else if (coll_ == "scatter") {
      const size_t at = in_place ? rank_ * c : 0;
      for (size_t i = 0; i < c; ++i) check(at + i, data_.input(root_, rank_ * c + i));
    } else if (coll_ == "sendrecv") {
      for (size_t i = 0; i < c; ++i) check(i, data_.input((rank_ - 1 + n_) % n_, i));
    } else if (oneway_receiver()) {
      for (size_t i = 0; i < c; ++i) check(i, data_.input(rank_ - 1, i));
    }
    return bad;
  }

  // Every Work of `works` completed (synchronised, for device buffers), in issue order.
  void wait_all_of(const std::vector<std::shared_ptr<Work>>& works) {
    if (!b_.on_device()) return wait_all(works);
    for (const auto& work : works) work->synchronize();
    cuda_runtime().synchronize_stream(current_cuda_stream());  // copies queued after them
  }

  struct Result {
    double time_us = 0;
    double algbw = 0, busbw = 0;
    int64_t wrong = -1;  // -1: not checked
  };

  Result run(bool in_place) {
    fill(in_place);
    for (int i = 0; i < o_.warmup; ++i) complete(b_, issue(in_place));
    pg_.barrier()->wait();
    std::vector<std::shared_ptr<Work>> works;
    works.reserve(size_t(o_.iters) * o_.agg);
    const auto start = Clock::now();
    // -z as nccl-tests: 1 wait and barrier after each operation, 2 wait after each, 3 wait and
    // barrier after each timed iteration (its -m operations).
    for (int i = 0; i < o_.iters; ++i) {
      for (int m = 0; m < o_.agg; ++m) {
        auto work = issue(in_place);
        if (o_.blocking == 1 || o_.blocking == 2) {
          complete(b_, work);
          if (o_.blocking == 1) pg_.barrier()->wait();
        } else {
          works.push_back(std::move(work));
        }
      }
      if (o_.blocking == 3) {
        wait_all_of(works);
        works.clear();
        pg_.barrier()->wait();
      }
    }
    // --wait each: one by one in issue order, as a program that keeps a list of Works waits on
    // them (weft::wait_all waits for the last one first).
    if (o_.wait_each) {
      for (const auto& work : works) complete(b_, work);
    }
    // Device buffers: the loop has posted every iteration; this synchronises with the last
    // (nccl-tests' cudaStreamSynchronize after its loop).
    wait_all_of(works);
    double seconds =
        std::chrono::duration<double>(Clock::now() - start).count() / (double(o_.iters) * o_.agg);
    // -a: the time reported is rank 0's, the average, the minimum or the maximum over ranks.
    if (o_.average == 0) {
      control_.broadcast(Tensor::of(&seconds, 1), 0);
    } else {
      ReduceOp how = o_.average == 1   ? ReduceOp::Avg
                     : o_.average == 2 ? ReduceOp::Min
                                       : ReduceOp::Max;
      control_.all_reduce(Tensor::of(&seconds, 1), how);
    }
    Result r;
    r.time_us = seconds * 1e6;
    r.algbw =
        coll_ == "barrier" || seconds <= 0 ? 0 : double(s_.bytes) * s_.alg_factor / 1e9 / seconds;
    r.busbw = r.algbw * s_.factor;
    // -c N as nccl-tests counts it: up to N check iterations after the timed loop, each on
    // fresh inputs, stopping at the first with wrong elements (whose count is reported).
    for (int c = 0; c < o_.check; ++c) {
      data_.set_rep(c);
      fill(in_place);
      complete(b_, issue(in_place));
      r.wrong = wrong(in_place);
      control_.all_reduce(Tensor::of(&r.wrong, 1), ReduceOp::Sum);
      if (r.wrong > 0) break;
    }
    data_.set_rep(0);
    return r;
  }

 private:
  // oneway pairs rank 2k (sends) with 2k+1 (receives and checks).
  bool oneway_receiver() const { return coll_ == "oneway" && rank_ % 2 == 1; }

  ProcessGroup& pg_;
  const Options& o_;
  Buffers& b_;
  Control& control_;
  std::string coll_;
  DType t_;
  ReduceOp op_;
  int root_;
  Shape s_;
  Data data_;
  int rank_, n_;
};

// ---- Output.

// nccl-tests' number format: as many decimals as fit the width.
std::string number(double value, int width) {
  int power = 0;
  for (uint64_t v = 1; value >= double(v) && power < 20; v *= 10) ++power;
  if (power < width - 2) return fmt::format("{:{}.2f}", value, width);
  if (power < width - 1) return fmt::format("{:{}.1f}", value, width);
  if (power < width + 1) return fmt::format("{:{}.0f}", value, width);
  return fmt::format("{:{}.1e}", value, width);
}

std::string now_text() {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\')
      out += '\\', out += ch;
    else if (ch == '\n')
      out += "\\n";
    else if (ch == '\t')
      out += "\\t";
    else if (static_cast<unsigned char>(ch) < 0x20)
      out += fmt::format("\\u{:04x}", int(ch));
    else
      out += ch;
  }
  return out + "\"";
}

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

// One line per rank, gathered to every rank in rank order (nccl-tests' "Using devices").
constexpr size_t kDeviceLine = 256;

std::vector<std::string> device_lines(ProcessGroup& pg, Control& control, const Buffers& buffers,
                                      const std::string& backend) {
  constexpr size_t kLine = kDeviceLine;
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  // The CPUs it may run on (its binding, --bind-to), as Open MPI's --report-bindings says.
  std::vector<int> cpus;
  for (const weft::CpuInfo& info : weft::allowed_cpus()) cpus.push_back(info.cpu);
  std::string line = fmt::format(
      "#  Rank {:2d} Group  0 Pid {:6d} on {:>10} device {:2d} [0000:00:00] "
      "{}, weft backend {}, CPUs {}",
      pg.rank(), int(getpid()), host, std::max(buffers.device, 0),
      buffers.on_device() ? "cuda" : "cpu", backend, weft::cpu_list_text(cpus));
  std::vector<char> mine(kLine, 0), all(kLine * pg.size());
  std::memcpy(mine.data(), line.data(), std::min(line.size(), kLine - 1));
  control.all_gather(Tensor{all.data(), all.size(), DType::UInt8, Device{}},
                     Tensor{mine.data(), mine.size(), DType::UInt8, Device{}});
  std::vector<std::string> lines;
  for (int r = 0; r < pg.size(); ++r) lines.emplace_back(all.data() + r * kLine);
  return lines;
}

std::string csv_field(const Runner::Result& r) {
  return fmt::format("{},{},{},{}", json_number(r.time_us), json_number(r.algbw),
                     json_number(r.busbw), r.wrong < 0 ? "" : std::to_string(r.wrong));
}

// This process's rank among those on its host, as its launcher says (weftrun and torchrun
// LOCAL_RANK, Open MPI, Slurm, MPICH), or `fallback` when none does.
int local_rank(int fallback) {
  for (const char* name :
       {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return fallback;
}

// The CUDA device --device cuda[:N] means for this process: N, or the local rank modulo the
// device count (nccl-tests' choice with one GPU per process). Made current for this thread.
// Throws Error(Unsupported) naming the reason when there is no usable device, and
// Error(InvalidArgument) for an N past the devices there are.
int pick_device(const Options& o, int fallback_local_rank) {
  CudaRuntime& cuda = cuda_runtime();
  const int count = cuda.device_count();
  if (count <= 0) {
    throw_error(ErrorCode::Unsupported, "--device cuda", "no CUDA device visible");
  }
  const int device = o.cuda_device >= 0 ? o.cuda_device : local_rank(fallback_local_rank) % count;
  if (device >= count) {
    throw_error(ErrorCode::InvalidArgument, "--device cuda",
                fmt::format("device {} does not exist: {} visible", device, count));
  }
  cuda.set_device(device);
  return device;
}

// `url`: where the ranks meet ("" for the launcher's environment, env://). `here_rank`: the rank
// run_here gave this process, -1 under a launcher.
int run(const Options& o, const std::string& url, int here_rank) {
  int device = -1;
  if (o.cuda) {
    try {
      device = pick_device(o, std::max(here_rank, 0));
    } catch (const Error& e) {
      // Before the rendezvous: every rank says why and leaves at once, none waits for the others.
      fmt::print(stderr, "{}: --device cuda: {}\n", g_program, e.what());
      return 1;
    }
  }
  ProcessGroupOptions options;
  options.backend = o.backend;
  if (!url.empty()) options.url = url;
  if (o.timeout_s > 0) options.timeout = std::chrono::seconds(o.timeout_s);
  auto pg = init_process_group(options);
  const int n = pg->size(), rank = pg->rank();
  const bool main_rank = rank == 0;
  if (main_rank) {
    for (const std::string& note : o.notes) fmt::print("# {}: {}\n", g_program, note);
    if (url.empty() && o.ngpus * o.nthreads > 1) {
      fmt::print(
          "# {}: -t {} -g {} ignored: weft runs one rank per process, and this job's {} ranks "
          "are its launcher's\n",
          g_program, o.nthreads, o.ngpus, n);
    }
  }
  std::FILE* csv = nullptr;
  if (main_rank && !o.csv_path.empty()) {
    csv = std::fopen(o.csv_path.c_str(), "w");
    if (csv == nullptr) {
      fmt::print(stderr, "{}: cannot write {}: {}\n", g_program, o.csv_path, std::strerror(errno));
      return 1;
    }
    fmt::print(csv,
               "collective,size,count,type,redop,root,oop_time_us,oop_algbw_gbps,oop_busbw_gbps,"
               "oop_wrong,ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong\n");
  }
  const std::string backend = pg->backend_name(device >= 0 ? DeviceKind::Cuda : DeviceKind::Cpu);
  const std::string start_time = now_text();
  const std::vector<size_t> sizes = sizes_of(o);

  // Buffers for the largest size, allocated and touched once (a first touch costs far more than
  // a copy here): send and receive of max_bytes (the size column is the larger of the two), and
  // scratch for the in-place sendrecv.
  // Under -R 1 send and receive are the two halves of one symmetric buffer (pre-faulted when
  // made), so that every rank's tensors lie at the same offsets in it.
  Buffers buffers;
  const size_t max_bytes = std::max<size_t>(o.max_bytes, 64);
  std::byte* io = nullptr;
  if (o.symmetric) {
    try {
      buffers.symmetric = pg->allocate_symmetric(2 * max_bytes);
    } catch (const Error& e) {
      fmt::print(stderr, "{}: -R 1: {}\n", g_program, e.what());
      return 1;
    }
    buffers.owned.assign(max_bytes, std::byte{0});
    io = static_cast<std::byte*>(buffers.symmetric->data());
    buffers.scratch = std::span<std::byte>(buffers.owned.data(), max_bytes);
  } else {
    buffers.owned.assign(3 * max_bytes, std::byte{0});
    io = buffers.owned.data();
    buffers.scratch = std::span<std::byte>(io + 2 * max_bytes, max_bytes);
  }
  buffers.send = std::span<std::byte>(io, max_bytes);
  buffers.recv = std::span<std::byte>(io + max_bytes, max_bytes);
  if (device >= 0) {
    // Send, receive and scratch on the device as on the host, then weft-perf's control area.
    CudaRuntime& cuda = cuda_runtime();
    const size_t control = kDeviceLine * size_t(n) * 2;
    buffers.device_memory =
        static_cast<std::byte*>(cuda.device_alloc(device, 3 * max_bytes + control));
    buffers.device = device;
    cuda.fill(buffers.device_memory, 0, 3 * max_bytes + control);
    std::byte* d = buffers.device_memory;
    buffers.device_send = std::span<std::byte>(d, max_bytes);
    buffers.device_recv = std::span<std::byte>(d + max_bytes, max_bytes);
    buffers.device_scratch = std::span<std::byte>(d + 2 * max_bytes, max_bytes);
    buffers.device_control = std::span<std::byte>(d + 3 * max_bytes, control);
  }
  Control control(*pg, buffers);

  const std::vector<std::string> devices = device_lines(*pg, control, buffers, backend);
  std::string json_collectives;
  int total_bad_lines = 0;
  for (const std::string& coll : o.collectives) {
    const std::string program = o.program.empty() ? coll + "_perf" : o.program;
    if (main_rank) {
      fmt::print("# weft-perf version {} backend {} ranks {}\n", WEFT_VERSION, backend, n);
      fmt::print("# Collective test starting: {}\n", program);
      fmt::print(
          "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {}({}) warmup iters: {} "
          "iters: {} agg iters: {} validation: {} graph: 0\n",
          o.min_bytes, o.max_bytes, o.step_factor > 1 ? o.step_factor : o.step_bytes,
          o.step_factor > 1 ? "factor" : "bytes", o.warmup, o.iters, o.agg, o.check);
      if (o.symmetric) {
        fmt::print("# Buffers: symmetric memory (-R 1): collectives on them run zero-copy\n");
      }
      if (device >= 0) {
        fmt::print("# Buffers: CUDA device memory (--device cuda): timed by Work::synchronize()\n");
      }
      if (o.blocking) {
        fmt::print("# Blocking Enabled: wait for completion and barrier after each collective \n");
      }
      fmt::print("#\n# Using devices\n");
      for (const auto& line : devices) fmt::print("{}\n", line);
      fmt::print("#\n");
      bench::print_nccl_tests_columns();
      std::fflush(stdout);
    }
    int bad_lines = 0;
    double bw_sum = 0;
    int bw_count = 0;
    std::string json_results;
    const std::vector<DType> dtypes =
        coll == "barrier" ? std::vector<DType>{DType::Float32} : o.dtypes;
    const std::vector<ReduceOp> ops = reduces(coll) ? o.ops : std::vector<ReduceOp>{ReduceOp::Sum};
    std::vector<int> roots = {-1};
    if (coll == "hypercube" && (n & (n - 1)) != 0) {
      // nccl-tests skips it the same way; its line has no "#", weft-perf's does, for parsers.
      if (main_rank) fmt::print("# nRanks {} is not a power of 2, skipping\n", n);
      continue;
    }
    if (coll == "oneway" && n % 2 != 0) {
      if (main_rank)
        fmt::print("# nRanks {} is odd (oneway pairs rank 2k with 2k+1), skipping\n", n);
      continue;
    }
    if (has_root(coll)) {
      if (o.all_roots) {
        roots.clear();
        for (int r = 0; r < n; ++r) roots.push_back(r);
      } else {
        if (o.root >= n) {
          if (main_rank) fmt::print(stderr, "weft-perf: root {} >= {} ranks\n", o.root, n);
          return 2;
        }
        roots = {o.root};
      }
    }
    for (DType t : dtypes) {
      for (ReduceOp op : ops) {
        if (!defined(t, op)) {
          if (main_rank) {
            fmt::print("# skipping {} {}: weft does not define it\n", type_label(t), op_label(op));
          }
          continue;
        }
        for (int root : roots) {
          const std::vector<size_t> run_sizes = coll == "barrier" ? std::vector<size_t>{0} : sizes;
          for (int cycle = 0; o.cycles == 0 || cycle < o.cycles; ++cycle)
            for (size_t size : run_sizes) {
              Shape shape = shape_of(coll, size, t, n);
              Runner runner(*pg, o, buffers, control, coll, t, op, std::max(root, 0), shape);
              Runner::Result out = runner.run(false);
              Runner::Result in = runner.run(true);
              for (const auto* r : {&out, &in}) {
                bad_lines += r->wrong > 0;
                bw_sum += r->busbw;
                ++bw_count;
              }
              if (!main_rank) continue;
              const std::string type = coll == "barrier" ? "none" : type_label(t);
              const std::string redop = reduces(coll) ? op_label(op) : "none";
              std::string line = fmt::format("{:12}  {:12}  {:>8}  {:>6}  {:6}", shape.bytes,
                                             shape.count, type, redop, root);
              for (const auto* r : {&out, &in}) {
                line += fmt::format("  {:>7}  {:>6}  {:>6}", number(r->time_us, 7),
                                    number(r->algbw, 6), number(r->busbw, 6));
                line += r->wrong < 0 ? "    N/A" : fmt::format("  {:6}", r->wrong);
              }
              fmt::print("{}\n", line);
              std::fflush(stdout);
              auto placement = [&](const Runner::Result& r) {
                return fmt::format(R"({{"time":{},"alg_bw":{},"bus_bw":{},"nwrong":{}}})",
                                   json_number(r.time_us), json_number(r.algbw),
                                   json_number(r.busbw),
                                   r.wrong < 0 ? "null" : std::to_string(r.wrong));
              };
              if (csv != nullptr) {
                fmt::print(csv, "{},{},{},{},{},{},{},{}\n", coll, shape.bytes, shape.count, type,
                           redop, root, csv_field(out), csv_field(in));
                std::fflush(csv);
              }
              json_results += fmt::format(
                  R"({}{{"size":{},"count":{},"type":{},"redop":{},"root":{},"out_of_place":{},"in_place":{}}})",
                  json_results.empty() ? "" : ",", shape.bytes, shape.count, json_string(type),
                  json_string(redop), root, placement(out), placement(in));
            }
        }
      }
    }
    const double avg_bw = bw_count ? bw_sum / bw_count : 0;
    total_bad_lines += bad_lines;
    if (main_rank) {
      fmt::print("# {:<20} : {} {}\n", "Out of bounds values", bad_lines,
                 bad_lines ? "FAILED" : "OK");
      fmt::print("# {:<20} : {} \n", "Avg bus bandwidth", fmt::format("{:g}", avg_bw));
      fmt::print("#\n# Collective test concluded: {}\n\n", program);
      std::fflush(stdout);
      json_collectives += fmt::format(
          R"({}{{"collective":{},"results":[{}],"out_of_bounds":{{"count":{},"okay":{}}},"average_bus_bandwidth":{{"bandwidth":{}}}}})",
          json_collectives.empty() ? "" : ",", json_string(coll), json_results, bad_lines,
          bad_lines ? "false" : "true", json_number(avg_bw));
    }
  }
  if (main_rank && !o.json_path.empty()) {
    std::string args, devs;
    for (const auto& a : o.args) args += (args.empty() ? "" : ",") + json_string(a);
    for (int r = 0; r < n; ++r) {
      devs += fmt::format(R"({}{{"rank":{},"line":{}}})", r ? "," : "", r,
                          json_string(devices[r].substr(2)));
    }
    std::string step = o.step_factor > 1 ? fmt::format(R"("step_factor":{})", o.step_factor)
                                         : fmt::format(R"("step_bytes":{})", o.step_bytes);
    std::string doc = fmt::format(
        R"({{"version":1,"tool":"weft-perf","weft_version":{},"start_time":{},"end_time":{},"args":[{}],)"
        R"("config":{{"ranks":{},"backend":{},"minimum_bytes":{},"maximum_bytes":{},{},"warmup_iters":{},)"
        R"("iterations":{},"aggregated_iterations":{},"validation":{},"blocking_collectives":{},"average":{},)"
        R"("timeout_s":{},"device":{}}},"devices":[{}],"collectives":[{}]}})",
        json_string(WEFT_VERSION), json_string(start_time), json_string(now_text()), args, n,
        json_string(backend), o.min_bytes, o.max_bytes, step, o.warmup, o.iters, o.agg, o.check,
        o.blocking ? "true" : "false", o.average, pg->timeout().count() / 1000,
        json_string(device >= 0 ? fmt::format("cuda:{}", device) : "cpu"), devs, json_collectives);
    std::ofstream file(o.json_path);
    file << doc << "\n";
    if (!file) {
      fmt::print(stderr, "weft-perf: could not write {}\n", o.json_path);
      return 1;
    }
    fmt::print("# Wrote JSON output to {}\n", o.json_path);
  }
  if (csv != nullptr) std::fclose(csv);
  pg->barrier()->wait();
  pg->destroy();
  return total_bad_lines ? 1 : 0;
}

// Runs one rank; its exit status.
int run_rank(const Options& o, const std::string& url, int here_rank = -1) {
  try {
    return run(o, url, here_rank);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", g_program, e.what());
    return 1;
  }
}

// No launcher started this process: start -t x -g ranks here, as nccl-tests' one process runs
// -t threads of -g GPUs each. weft runs one rank per process, so each is a child process; they
// meet through a FileStore in a fresh directory. The first to fail stops the others, and its
// status is this process's.
int run_here(const Options& o) {
  const int ranks = o.nthreads * o.ngpus;
  char dir_template[] = "/tmp/weft-perf-XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) {
    fmt::print(stderr, "{}: cannot make a directory in /tmp: {}\n", g_program,
               std::strerror(errno));
    return 1;
  }
  const std::string store = std::string(dir) + "/store";
  auto url = [&](int r) { return fmt::format("file://{}?rank={}&world_size={}", store, r, ranks); };
  int status = 0;
  if (ranks == 1) {
    status = run_rank(o, url(0), 0);
  } else {
    std::fflush(nullptr);
    std::vector<pid_t> children;
    const std::vector<weft::CpuInfo> cpus = weft::allowed_cpus();
    for (int r = 0; r < ranks; ++r) {
      const std::vector<int> share =
          o.bind_to_core ? weft::cpu_share(cpus, r, ranks) : std::vector<int>{};
      pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        const cpu_set_t mask = weft::cpu_mask(share);
        if (!share.empty() && ::sched_setaffinity(0, sizeof mask, &mask) != 0) {
          fmt::print(stderr, "{}: rank {}: cannot bind to CPUs {} (running unbound): {}\n",
                     g_program, r, weft::cpu_list_text(share), std::strerror(errno));
        }
        std::exit(run_rank(o, url(r), r));
      }
      if (pid < 0) {
        fmt::print(stderr, "{}: fork: {}\n", g_program, std::strerror(errno));
        status = 1;
        break;
      }
      children.push_back(pid);
    }
    for (size_t left = children.size(); left > 0; --left) {
      int child_status = 0;
      pid_t pid = ::wait(&child_status);
      if (pid < 0) break;
      const int code = WIFEXITED(child_status)     ? WEXITSTATUS(child_status)
                       : WIFSIGNALED(child_status) ? 128 + WTERMSIG(child_status)
                                                   : 1;
      if (code != 0 && status == 0) {
        status = code;
        for (pid_t other : children) {
          if (other != pid) ::kill(other, SIGTERM);
        }
      }
    }
  }
  ::unlink(store.c_str());
  ::rmdir(dir);
  return status;
}

}  // namespace
}  // namespace weft::perf

int main(int argc, char** argv) {
  using namespace weft::perf;
  Options options = parse(argc, argv);
  if (launcher_rank() < 0) return run_here(options);
  return run_rank(options, "");
}
