// What gloo_bench and mpi_bench share: flags, buffer shapes, input values, the check, the
// bandwidth arithmetic and the output format. Neither harness links libweft; this header uses only
// the standard library and fmt, so a peer's figures owe nothing to weft's code.
//
// Shapes follow nccl-tests: for all_gather, reduce_scatter and all_to_all the size is the FULL
// array of P blocks (P = ranks), rounded down to a whole number of fp32 elements per block, and
// never below one element per block; for all_reduce and broadcast it is the buffer, rounded down
// to whole elements, never below one. The printed bytes are the size actually moved, so 8 B at 4
// ranks prints bytes=16 for all_gather.
//
// Inputs are small integers, so every fp32 sum below is exact and the expected value has a closed
// form that owes nothing to the collective under test:
//   reduced ops:  rank r, element k: (k % 1021) + r + 1; the sum over P ranks is
//                 P * (k % 1021) + P(P+1)/2. Every contribution is >= 1, so a missing or a doubled
//                 rank always shows.
//   moved ops:    rank r, element k: (k % 4093) + 4096 r, so a value names its source rank and
//                 position (exact below 2^24, that is for r < 4096).
// Outputs are filled with NaN before a checked run, so an element the collective never wrote
// counts as wrong.
#pragma once

#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace peers {

enum class Op { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, Barrier };

inline constexpr Op kAllOps[] = {Op::AllReduce, Op::AllGather, Op::ReduceScatter,
                                 Op::Broadcast, Op::AllToAll,  Op::Barrier};

inline const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "all_reduce";
    case Op::AllGather:
      return "all_gather";
    case Op::ReduceScatter:
      return "reduce_scatter";
    case Op::Broadcast:
      return "broadcast";
    case Op::AllToAll:
      return "all_to_all";
    case Op::Barrier:
      return "barrier";
  }
  return "?";
}

// nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md there): what each rank's link carries
// relative to the algorithm bandwidth on an ideal ring.
inline double busbw_factor(Op op, int ranks) {
  double p = ranks;
  switch (op) {
    case Op::AllReduce:
      return 2 * (p - 1) / p;
    case Op::AllGather:
    case Op::ReduceScatter:
    case Op::AllToAll:
      return (p - 1) / p;
    case Op::Broadcast:
      return 1;
    case Op::Barrier:
      return 0;
  }
  return 0;
}

struct Options {
  std::vector<Op> ops{std::begin(kAllOps), std::end(kAllOps)};
  std::vector<size_t> sizes{8, 1 << 20, 16 << 20, 64 << 20};
  int iters = 20;
  int warmup = 5;
  bool check = true;
  int check_runs = 1;  // checked runs after the timed ones; wrong= sums over them
};

// "8", "4K", "1M", "2G" (powers of two) to bytes.
inline size_t parse_size(std::string_view text) {
  if (text.empty()) throw std::invalid_argument("empty size");
  size_t mult = 1;
  switch (text.back()) {
    case 'K':
    case 'k':
      mult = size_t{1} << 10;
      break;
    case 'M':
    case 'm':
      mult = size_t{1} << 20;
      break;
    case 'G':
    case 'g':
      mult = size_t{1} << 30;
      break;
  }
  if (mult != 1) text.remove_suffix(1);
  size_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') throw std::invalid_argument(fmt::format("bad size '{}'", text));
    value = value * 10 + static_cast<size_t>(c - '0');
  }
  return value * mult;
}

inline std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) parts.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

inline Op parse_op(std::string_view name) {
  for (Op op : kAllOps) {
    if (name == op_name(op)) return op;
  }
  throw std::invalid_argument(fmt::format("unknown op '{}'", name));
}

inline constexpr const char* kCommonUsage =
    "  --op NAME[,NAME..]   all_reduce, all_gather, reduce_scatter, broadcast, all_to_all,\n"
    "                       barrier, or all (default all)\n"
    "  --sizes LIST         bytes, K/M/G = 2^10/2^20/2^30 (default 8,1M,16M,64M)\n"
    "  --iters N            timed iterations per (op, size) (default 20)\n"
    "  --warmup N           untimed iterations first (default 5)\n"
    "  --check | --no-check check one more run against closed-form values (default on)\n"
    "  --check-runs N       check N more runs instead of one; wrong= sums them (default 1)\n";

// Parses the common flags; `extra(flag, next_value)` handles the harness's own and returns how
// many arguments it used (0: unknown flag). Throws std::invalid_argument on a bad flag or value.
inline Options parse_common(int argc, char** argv,
                            const std::function<int(std::string_view, const char*)>& extra) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&]() -> std::string_view {
      if (value == nullptr) throw std::invalid_argument(fmt::format("{} needs a value", flag));
      ++i;
      return value;
    };
    if (flag == "--op") {
      std::string_view v = need();
      o.ops.clear();
      if (v == "all") {
        o.ops.assign(std::begin(kAllOps), std::end(kAllOps));
      } else {
        for (const auto& name : split(v, ',')) o.ops.push_back(parse_op(name));
      }
    } else if (flag == "--sizes") {
      o.sizes.clear();
      for (const auto& s : split(need(), ',')) o.sizes.push_back(parse_size(s));
    } else if (flag == "--iters") {
      o.iters = std::stoi(std::string(need()));
    } else if (flag == "--warmup") {
      o.warmup = std::stoi(std::string(need()));
    } else if (flag == "--check") {
      o.check = true;
    } else if (flag == "--no-check") {
      o.check = false;
    } else if (flag == "--check-runs") {
      o.check_runs = std::stoi(std::string(need()));
    } else {
      int used = extra(flag, value);
      if (used == 0) throw std::invalid_argument(fmt::format("unknown flag '{}'", flag));
      i += used - 1;
    }
  }
  if (o.iters < 1 || o.warmup < 0 || o.check_runs < 1) {
    throw std::invalid_argument("--iters and --check-runs must be >= 1, --warmup >= 0");
  }
  if (o.sizes.empty() || o.ops.empty()) throw std::invalid_argument("nothing to run");
  return o;
}

// Element counts for one (op, size, ranks). `block` is the per-rank block for the blocked ops.
struct Shape {
  size_t block = 0;      // elements per rank block (blocked ops), or the whole buffer
  size_t in_elems = 0;   // input buffer
  size_t out_elems = 0;  // output buffer (0: the op works in place in the input)
  size_t bytes = 0;      // the size reported: the full array, as nccl-tests counts it
};

inline Shape shape_for(Op op, size_t bytes, int ranks) {
  const size_t p = static_cast<size_t>(ranks);
  const size_t elems = bytes / sizeof(float);
  Shape s;
  switch (op) {
    case Op::AllReduce:
    case Op::Broadcast:
      s.block = std::max<size_t>(1, elems);
      s.in_elems = s.block;
      s.bytes = s.block * sizeof(float);
      break;
    case Op::AllGather:
      s.block = std::max<size_t>(1, elems / p);
      s.in_elems = s.block;
      s.out_elems = s.block * p;
      s.bytes = s.out_elems * sizeof(float);
      break;
    case Op::ReduceScatter:
      s.block = std::max<size_t>(1, elems / p);
      s.in_elems = s.block * p;
      s.out_elems = s.block;
      s.bytes = s.in_elems * sizeof(float);
      break;
    case Op::AllToAll:
      s.block = std::max<size_t>(1, elems / p);
      s.in_elems = s.block * p;
      s.out_elems = s.block * p;
      s.bytes = s.in_elems * sizeof(float);
      break;
    case Op::Barrier:
      break;
  }
  return s;
}

inline float reduce_input(int rank, size_t k) {
  return static_cast<float>(k % 1021 + static_cast<size_t>(rank) + 1);
}
inline float reduce_expected(int ranks, size_t k) {
  return static_cast<float>(static_cast<size_t>(ranks) * (k % 1021) +
                            static_cast<size_t>(ranks * (ranks + 1) / 2));
}
inline float tagged(int rank, size_t k) {
  return static_cast<float>(k % 4093 + 4096 * static_cast<size_t>(rank));
}

inline void poison(std::span<float> out) {
  std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
}

// Fills this rank's input for a checked run of `op`. For in-place ops (out empty) the input is the
// output; broadcast's non-root ranks get NaN, since the root's data must overwrite it.
inline void fill_input(Op op, int rank, std::span<float> in) {
  switch (op) {
    case Op::AllReduce:
    case Op::ReduceScatter:
      for (size_t k = 0; k < in.size(); ++k) in[k] = reduce_input(rank, k);
      break;
    case Op::Broadcast:
      if (rank == 0) {
        for (size_t k = 0; k < in.size(); ++k) in[k] = tagged(0, k);
      } else {
        poison(in);
      }
      break;
    case Op::AllGather:
    case Op::AllToAll:
      for (size_t k = 0; k < in.size(); ++k) in[k] = tagged(rank, k);
      break;
    case Op::Barrier:
      break;
  }
}

// Touches every page before timing (the first touch would otherwise be timed) with the values of
// a checked run, so timed iterations compute on realistic numbers.
inline void touch(Op op, int rank, std::span<float> in, std::span<float> out) {
  fill_input(op, rank, in);
  poison(out);
}

// The elements of one rank's result that differ from the closed form, and where they lie.
struct Wrong {
  int64_t count = 0;
  size_t first = 0;  // index of the first wrong element, with what it held and should have
  size_t last = 0;
  float got = 0;
  float want = 0;

  // "3 wrong in [17, 4095]; first [17] = 35 (want 19)" for a rank's report on stderr.
  std::string describe() const {
    return fmt::format("{} wrong in [{}, {}]; first [{}] = {} (want {})", count, first, last, first,
                       got, want);
  }
};

// Elements of `result` (what this rank holds after the op) that differ from the closed form.
inline Wrong count_wrong(Op op, int rank, int ranks, const Shape& s,
                         std::span<const float> result) {
  Wrong wrong;
  auto expect = [&](size_t i, float want) {
    if (result[i] == want) return;  // NaN never compares equal
    if (wrong.count++ == 0) {
      wrong.first = i;
      wrong.got = result[i];
      wrong.want = want;
    }
    wrong.last = i;
  };
  switch (op) {
    case Op::AllReduce:
      for (size_t k = 0; k < s.block; ++k) expect(k, reduce_expected(ranks, k));
      break;
    case Op::Broadcast:
      for (size_t k = 0; k < s.block; ++k) expect(k, tagged(0, k));
      break;
    case Op::ReduceScatter:
      // Rank r holds block r of the sum.
      for (size_t j = 0; j < s.block; ++j) {
        expect(j, reduce_expected(ranks, static_cast<size_t>(rank) * s.block + j));
      }
      break;
    case Op::AllGather:
      // Block q is rank q's input.
      for (size_t q = 0; q < static_cast<size_t>(ranks); ++q) {
        for (size_t j = 0; j < s.block; ++j) {
          expect(q * s.block + j, tagged(static_cast<int>(q), j));
        }
      }
      break;
    case Op::AllToAll:
      // Block q is what rank q sent to this rank: block `rank` of q's input.
      for (size_t q = 0; q < static_cast<size_t>(ranks); ++q) {
        for (size_t j = 0; j < s.block; ++j) {
          expect(q * s.block + j,
                 tagged(static_cast<int>(q), static_cast<size_t>(rank) * s.block + j));
        }
      }
      break;
    case Op::Barrier:
      break;
  }
  return wrong;
}

inline std::string result_line(std::string_view peer, Op op, int ranks, size_t bytes,
                               double seconds, int64_t wrong, std::string_view extra = {}) {
  double algbw = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
  return fmt::format(
      "peer={} op={} ranks={} bytes={} time_us={:.1f} algbw={:.2f} busbw={:.2f} wrong={}{}{}", peer,
      op_name(op), ranks, bytes, seconds * 1e6, algbw, algbw * busbw_factor(op, ranks),
      wrong < 0 ? std::string("-") : std::to_string(wrong), extra.empty() ? "" : " ", extra);
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

inline bool under_hypervisor() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) return line.find(" hypervisor") != std::string::npos;
  }
  return false;
}

// The machine and run, as '#' lines before the figures (STYLE.md: benchmarks print their machine).
inline void print_header(std::string_view peer, std::string_view library,
                         std::string_view transport, int ranks, const Options& o) {
  utsname u{};
  uname(&u);
  std::time_t t = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  std::ifstream loadavg("/proc/loadavg");
  std::string load1, load5;
  loadavg >> load1 >> load5;
  fmt::print("# {}_bench  {}\n", peer, date);
  fmt::print("# CPU:       {} x {} cores ({})\n", cpu_model(), std::thread::hardware_concurrency(),
             under_hypervisor() ? "VM" : "bare metal");
  fmt::print("# Kernel:    {} {} {}\n", u.sysname, u.release, u.machine);
  fmt::print("# Load:      {} (1 min), {} (5 min) before the run\n", load1, load5);
  fmt::print("# Library:   {}\n", library);
  fmt::print("# Transport: {}\n", transport);
  fmt::print(
      "# Ranks:     {}; fp32 sum; {} warmup + {} timed iterations; {}\n", ranks, o.warmup, o.iters,
      !o.check ? std::string("not checked (--no-check)")
      : o.check_runs == 1
          ? std::string("checked on one more run after timing")
          : fmt::format("checked on {} more runs after timing (wrong= sums them)", o.check_runs));
  fmt::print(
      "# time_us: mean per op over the timed iterations, the slowest rank's; GB/s = 1e9 B/s\n");
#ifndef NDEBUG
  fmt::print("# WARNING: built with assertions (not a release build): figures are pessimistic\n");
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  fmt::print("# WARNING: built with a sanitizer: figures are meaningless\n");
#endif
  std::fflush(stdout);
}

}  // namespace peers
