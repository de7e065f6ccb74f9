// weft-soak: runs random collectives on random groups for a given time, checks every result
// against a reference computed here, and watches memory, file descriptors and threads for growth.
//
//   weftrun --nproc-per-node 8 --standalone build/tests/soak/weft-soak --seconds 30
//   weftrun --nproc-per-node 8 --standalone build/tests/soak/weft-soak --minutes 20 --seed 42
//
// One process per rank, under any launcher init_process_group() understands. Every step is a
// function of (seed, step) only: the group family, the collective, its dtype, op, root and sizes
// come from a random generator seeded with hash(seed, step), so every rank issues the same
// collectives in the same order without talking about it, and a failure replays with --seed.
// Rank r's data for an operation is a function of (seed, step, slot, r's world rank, role), so any
// rank can regenerate any other rank's input and compute the expected result element by element
// on its own (sums, products, minima, ... in plain C++, never through weft's reduce kernels).
//
// Exactness: reductions use data whose results are exact in every dtype, so that a reference
// computed in double equals what any reduction order gives: small integers for floating sum,
// min, max, avg and premul_sum (factors 0.25, 0.5, 2), {+-1, +-2, 0.5} for floating prod, small
// integers for integer avg and prod; integer sum, min, max and the bitwise ops use any bits (sum
// and prod wrap modulo 2^bits, as runtime/reduce.h specifies, and the reference wraps the same
// way). Data-movement collectives carry random bits and are compared byte for byte. The ranges
// are sized for groups of up to 8 ranks (bfloat16 sums and float16 products stay exact); with
// more, a floating result may round and be reported as wrong.
//
// Groups (families; in a step every rank uses its own member of the chosen family, so evens and
// odds run side by side): world; parity (split by rank % 2); halves (two new_group calls); pairs
// (split by rank / 2, keys reversed); reversed (new_group with the ranks backwards); fresh (made
// every kFreshEvery steps, alternately by split with random colours, some -1, and by new_group of
// a random subset in random order, and destroyed when the next one is made).
//
// Resources: every --sample-seconds (and at the end) each rank reads its RSS (/proc/self/statm,
// after malloc_trim so that free memory the allocator keeps does not count; RssAnon and RssShmem
// from /proc/self/status beside it), its open descriptors (/proc/self/fd), its threads
// (/proc/self/task) and the /dev/shm segments it created. Samples are taken between one fresh
// group's destruction and the next one's creation, so only the fixed groups are alive. Before
// the clock starts, a pre-warm pass runs every collective at the largest size on each fixed group
// (their scratch pools grow to the largest buffer seen, then stay). After the warm-up (20% of the
// run, at least 5 s) the first sample is the baseline; a later one above it by more than
// max(64 MiB, 20%) of RSS, 8 descriptors, 4 threads or 4 segments fails the run: a group leaked
// per creation shows in descriptors and threads within a few creations.
//
// Known weft bugs are steered around unless --no-workarounds (each place says which, and the
// summary counts how often); recv_any falls back to recv from the sender where the backend
// refuses it (a group mixing shared memory and TCP).
//
// Exit codes: 0 all checks passed; 1 a wrong result; 2 a weft::Error or another exception; 3 a
// resource grew past its bound; 64 bad flags. A wrong result prints rank, group, op, dtype,
// count, the first bad index, got and want, and the seed and step to replay.
#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/half.h"
#include "weft/process_group.h"
#include "weft/reduce_op.h"
#include "weft/tensor.h"
#include "weft/work.h"

namespace {

using weft::DType;
using weft::ProcessGroup;
using weft::ReduceOp;
using weft::Tensor;
using weft::Work;
using Clock = std::chrono::steady_clock;

// The step last issued, for the message when a weft::Error ends the run.
std::string g_last_step = "set-up";

// ---- Options.

struct Options {
  double seconds = 30;
  std::optional<uint64_t> seed;
  size_t max_bytes = 4 << 20;  // the largest buffer one rank passes to one collective
  std::string report;          // JSON summary from rank 0; empty: none
  int64_t steps = -1;          // stop after this many steps (replay); -1: by time only
  double sample_seconds = 0;   // 0: the run's length / 15, between 1 and 60 s
  int timeout_seconds = 90;    // the groups' timeout: a hang fails within it
  bool recv_any = true;        // off where a group mixes shared memory and TCP (Unsupported)
  bool verbose = false;        // print every step on the group's rank 0
  bool workarounds = true;     // steer around known weft bugs (docs/reliability.md, "Soak")
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "weft-soak: %s\n"
               "usage: weft-soak [--seconds S | --minutes M] [--seed N] [--max-bytes B[K|M]]\n"
               "                 [--report FILE] [--steps N] [--sample-seconds S]\n"
               "                 [--timeout-seconds S] [--no-recv-any] [--no-workarounds]\n"
               "                 [--verbose]\n",
               why.c_str());
  std::exit(64);
}

size_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  const std::string unit = end ? end : "";
  if (end == text.c_str()) usage("not a size: " + text);
  if (unit.empty()) return value;
  if (unit == "K" || unit == "k") return value << 10;
  if (unit == "M" || unit == "m") return value << 20;
  usage("not a size: " + text);
}

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--seconds") {
      opt.seconds = std::atof(value().c_str());
    } else if (arg == "--minutes") {
      opt.seconds = 60 * std::atof(value().c_str());
    } else if (arg == "--seed") {
      opt.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (arg == "--max-bytes") {
      opt.max_bytes = parse_bytes(value());
    } else if (arg == "--report") {
      opt.report = value();
    } else if (arg == "--steps") {
      opt.steps = std::atoll(value().c_str());
    } else if (arg == "--sample-seconds") {
      opt.sample_seconds = std::atof(value().c_str());
    } else if (arg == "--timeout-seconds") {
      opt.timeout_seconds = std::atoi(value().c_str());
    } else if (arg == "--no-recv-any") {
      opt.recv_any = false;
    } else if (arg == "--verbose") {
      opt.verbose = true;
    } else if (arg == "--no-workarounds") {
      opt.workarounds = false;
    } else {
      usage("unknown flag " + arg);
    }
  }
  if (opt.seconds <= 0 && opt.steps < 0) usage("nothing to run: --seconds must be positive");
  if (opt.max_bytes < 64) usage("--max-bytes must be at least 64");
  if (opt.timeout_seconds <= 0) usage("--timeout-seconds must be positive");
  return opt;
}

// ---- Deterministic randomness: splitmix64, the same on every rank.

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x736f616b;  // "soak"
  for (uint64_t part : parts) h = mix(h ^ part);
  return h;
}

// The random bits of element i of the stream `key`: random access, so that a rank regenerates
// any block of another rank's input without generating what comes before it.
uint64_t element_bits(uint64_t key, size_t i) { return mix(key + i * 0xd1b54a32d192ed03ull); }

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix(state_++); }
  // Uniform in [0, n); n > 0. The modulo bias is irrelevant here.
  uint64_t below(uint64_t n) { return next() % n; }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1p-53 < p; }
  template <typename T>
  const T& pick(const std::vector<T>& from) {
    return from[below(from.size())];
  }
  // Index by weight.
  size_t weighted(const std::vector<int>& weights) {
    uint64_t point = below(std::accumulate(weights.begin(), weights.end(), uint64_t{0}));
    for (size_t i = 0; i < weights.size(); ++i) {
      if (point < static_cast<uint64_t>(weights[i])) return i;
      point -= weights[i];
    }
    return weights.size() - 1;
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t state_;
};

// ---- Element types.

template <typename T>
constexpr bool kFloating = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                           std::is_same_v<T, weft::Half> || std::is_same_v<T, weft::BFloat16>;

template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, weft::Half>) {
    return weft::half_to_float(v.bits);
  } else if constexpr (std::is_same_v<T, weft::BFloat16>) {
    return weft::bf16_to_float(v.bits);
  } else {
    return static_cast<double>(v);
  }
}

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, weft::Half>) {
    return weft::Half{weft::float_to_half(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, weft::BFloat16>) {
    return weft::BFloat16{weft::float_to_bf16(static_cast<float>(v))};
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the C++ type of `dtype`.
template <typename F>
decltype(auto) visit(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f(Tag<float>{});
    case DType::Float64:
      return f(Tag<double>{});
    case DType::Float16:
      return f(Tag<weft::Half>{});
    case DType::BFloat16:
      return f(Tag<weft::BFloat16>{});
    case DType::Int8:
      return f(Tag<int8_t>{});
    case DType::UInt8:
      return f(Tag<uint8_t>{});
    case DType::Int32:
      return f(Tag<int32_t>{});
    case DType::Int64:
      return f(Tag<int64_t>{});
    case DType::UInt32:
      return f(Tag<uint32_t>{});
    case DType::UInt64:
      return f(Tag<uint64_t>{});
    default:
      break;
  }
  std::fprintf(stderr, "weft-soak: no element type for dtype %d\n", static_cast<int>(dtype));
  std::abort();
}

// What values a buffer holds, so that every reduction of them is exact (see the file comment).
enum class Domain { Bits, Small, ProdSet };

Domain domain_for(DType dtype, ReduceOp op) {
  const bool floating = weft::is_floating(dtype);
  switch (op.kind) {
    case ReduceOp::Sum:
      return floating ? Domain::Small : Domain::Bits;
    case ReduceOp::Avg:
    case ReduceOp::PremulSum:
      return Domain::Small;
    case ReduceOp::Prod:
      return Domain::ProdSet;
    case ReduceOp::Min:
    case ReduceOp::Max:
      return floating ? Domain::Small : Domain::Bits;
    default:
      return Domain::Bits;
  }
}

// The largest magnitude of a Small value: 8 ranks' sum (and premul_sum by 2 or 0.25) stays an
// exact integer or quarter in the type's significand (float16: 11 bits, bfloat16: 8).
template <typename T>
int64_t small_range() {
  if constexpr (std::is_same_v<T, weft::Half>) return 64;
  if constexpr (std::is_same_v<T, weft::BFloat16>) return 8;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) return 1000;
  if constexpr (std::is_same_v<T, int8_t>) return 15;
  if constexpr (std::is_same_v<T, uint8_t>) return 31;
  return 1000000;
}

template <typename T>
T make_value(uint64_t bits, Domain domain) {
  switch (domain) {
    case Domain::Bits: {
      T v;
      std::memcpy(&v, &bits, sizeof(T));
      return v;
    }
    case Domain::Small: {
      const int64_t range = small_range<T>();
      if constexpr (kFloating<T> || std::is_signed_v<T>) {
        const int64_t v = static_cast<int64_t>(bits % (2 * range + 1)) - range;
        if constexpr (kFloating<T>) {
          return from_double<T>(static_cast<double>(v));
        } else {
          return static_cast<T>(v);
        }
      } else {
        return static_cast<T>(bits % (range + 1));
      }
    }
    case Domain::ProdSet: {
      if constexpr (kFloating<T>) {
        static constexpr double kSet[] = {1, -1, 2, -2, 0.5, 1, -1};
        return from_double<T>(kSet[bits % 7]);
      } else if constexpr (std::is_signed_v<T>) {
        static constexpr int kSet[] = {1, -1, 2, 3, -3, 1, -1};
        return static_cast<T>(kSet[bits % 7]);
      } else {
        return static_cast<T>(1 + bits % 3);
      }
    }
  }
  return T{};
}

// One element of a reduction over `contributions` values, as runtime/reduce.h specifies it.
template <typename T>
T reduce_values(ReduceOp op, const T* values, int contributions) {
  if constexpr (kFloating<T>) {
    // Every partial result is exact in double and in T for the domains above.
    double acc = 0;
    const double factor = op.kind == ReduceOp::PremulSum ? op.factor : 1.0;
    for (int k = 0; k < contributions; ++k) {
      const double v = to_double(values[k]) * factor;
      if (k == 0) {
        acc = v;
        continue;
      }
      switch (op.kind) {
        case ReduceOp::Prod:
          acc *= v;
          break;
        case ReduceOp::Min:
          acc = std::min(acc, v);
          break;
        case ReduceOp::Max:
          acc = std::max(acc, v);
          break;
        default:
          acc += v;
      }
    }
    if (op.kind == ReduceOp::Avg) {
      // Divided once in the type's arithmetic type: float for float32, float16 and bfloat16.
      if constexpr (std::is_same_v<T, double>) {
        return acc / contributions;
      } else {
        return from_double<T>(static_cast<float>(acc) / static_cast<float>(contributions));
      }
    }
    return from_double<T>(acc);
  } else {
    using U = std::make_unsigned_t<T>;
    U acc = static_cast<U>(values[0]);
    T best = values[0];
    for (int k = 1; k < contributions; ++k) {
      const U u = static_cast<U>(values[k]);
      switch (op.kind) {
        case ReduceOp::Prod:
          acc = static_cast<U>(acc * u);
          break;
        case ReduceOp::Min:
          best = std::min(best, values[k]);
          break;
        case ReduceOp::Max:
          best = std::max(best, values[k]);
          break;
        case ReduceOp::BAnd:
          acc = static_cast<U>(acc & u);
          break;
        case ReduceOp::BOr:
          acc = static_cast<U>(acc | u);
          break;
        case ReduceOp::BXor:
          acc = static_cast<U>(acc ^ u);
          break;
        default:
          acc = static_cast<U>(acc + u);
      }
    }
    if (op.kind == ReduceOp::Min || op.kind == ReduceOp::Max) return best;
    const T wrapped = static_cast<T>(acc);
    if (op.kind != ReduceOp::Avg) return wrapped;
    // Truncating toward zero in a type wide enough for the count, as runtime/reduce.cc does.
    if constexpr (sizeof(T) == 8 || std::is_same_v<T, uint32_t>) {
      using D = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
      return static_cast<T>(static_cast<D>(wrapped) / static_cast<D>(contributions));
    } else {
      return static_cast<T>(static_cast<int>(wrapped) / contributions);
    }
  }
}

std::string show_element(DType dtype, const std::byte* p) {
  return visit(dtype, [&](auto tag) -> std::string {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, p, sizeof(T));
    if constexpr (kFloating<T>) {
      uint64_t bits = 0;
      std::memcpy(&bits, p, sizeof(T));
      return fmt::format("{} (bits 0x{:0{}x})", to_double(v), bits, 2 * sizeof(T));
    } else {
      return fmt::format(
          "{}", static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(v));
    }
  });
}

// ---- Buffers.

// `count` elements of `dtype`, owned; outputs start poisoned (0xa5 bytes) so that an element the
// collective never wrote is caught.
class Buf {
 public:
  Buf(DType dtype, size_t count)
      : dtype_(dtype),
        count_(count),
        bytes_(new std::byte[std::max<size_t>(count * weft::dtype_size(dtype), 8)]) {}

  DType dtype() const { return dtype_; }
  size_t count() const { return count_; }
  size_t nbytes() const { return count_ * weft::dtype_size(dtype_); }
  std::byte* at(size_t i) const { return bytes_.get() + i * weft::dtype_size(dtype_); }
  Tensor tensor() const { return Tensor{bytes_.get(), count_, dtype_, {}}; }
  Tensor slice(size_t offset, size_t n) const { return tensor().slice(offset, n); }
  void poison() const { std::memset(bytes_.get(), 0xa5, nbytes()); }

  // Elements [offset, offset + n) get elements [from, from + n) of the stream `key`.
  void fill(size_t offset, size_t n, uint64_t key, size_t from, Domain domain) const {
    visit(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* p = reinterpret_cast<T*>(at(offset));
      for (size_t i = 0; i < n; ++i) p[i] = make_value<T>(element_bits(key, from + i), domain);
    });
  }
  void fill(uint64_t key, Domain domain) const { fill(0, count_, key, 0, domain); }

 private:
  DType dtype_;
  size_t count_;
  std::unique_ptr<std::byte[]> bytes_;
};

using BufPtr = std::shared_ptr<Buf>;

BufPtr make_buf(DType dtype, size_t count, bool poison = true) {
  auto b = std::make_shared<Buf>(dtype, count);
  if (poison) b->poison();
  return b;
}

// ---- Statistics.

enum Kind {
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kAllGatherIntoTensor,
  kAllGatherUneven,
  kReduceScatter,
  kReduceScatterTensor,
  kReduceScatterUneven,
  kGather,
  kGatherIntoTensor,
  kScatter,
  kScatterFromTensor,
  kAllToAll,
  kAllToAllSplits,
  kBarrier,
  kSendRecvRing,
  kSendRecvPairs,
  kBatchIsendIrecv,
  kObjects,
  kCoalesced,
  kNumKinds,
};

constexpr const char* kKindNames[kNumKinds] = {
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_uneven",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_uneven",
    "gather",
    "gather_into_tensor",
    "scatter",
    "scatter_from_tensor",
    "all_to_all",
    "all_to_all(splits)",
    "barrier",
    "send/recv ring",
    "send/recv pairs",
    "batch_isend_irecv",
    "object collectives",
    "coalesced units",
};

// Counters kept per rank and summed over ranks at the end; all int64 so that one all_reduce
// carries them.
struct Stats {
  std::array<int64_t, kNumKinds> kinds{};  // collectives issued by this rank, by kind
  std::array<int64_t, weft::kNumDTypes> dtypes{};
  std::array<int64_t, ReduceOp::kNumKinds> ops{};
  int64_t bytes = 0;  // payload bytes: per collective, the largest buffer this rank passed
  int64_t elements_checked = 0;
  int64_t recv_any = 0;
  int64_t recv_any_refused = 0;  // Unsupported by the group's backend: received by sender
  int64_t sync_ops = 0, async_ops = 0;
  int64_t groups_created = 0, groups_destroyed = 0;
  int64_t steps_idle = 0;   // steps in which this rank was in no group of the family
  int64_t workarounds = 0;  // times a known bug was steered around (Options::workarounds)

  std::vector<int64_t> pack() const {
    std::vector<int64_t> v(kinds.begin(), kinds.end());
    v.insert(v.end(), dtypes.begin(), dtypes.end());
    v.insert(v.end(), ops.begin(), ops.end());
    v.insert(v.end(), {bytes, elements_checked, recv_any, sync_ops, async_ops, groups_created,
                       groups_destroyed, steps_idle, workarounds, recv_any_refused});
    return v;
  }
  static Stats unpack(const std::vector<int64_t>& v) {
    Stats s;
    size_t i = 0;
    for (auto& x : s.kinds) x = v[i++];
    for (auto& x : s.dtypes) x = v[i++];
    for (auto& x : s.ops) x = v[i++];
    for (int64_t* x :
         {&s.bytes, &s.elements_checked, &s.recv_any, &s.sync_ops, &s.async_ops, &s.groups_created,
          &s.groups_destroyed, &s.steps_idle, &s.workarounds, &s.recv_any_refused}) {
      *x = v[i++];
    }
    return s;
  }
};

// ---- One step's context and the checks.

// What one rank knows about the operation it is issuing: enough to regenerate every member's
// data and to say, on a mismatch, exactly what failed and how to replay it.
struct Ctx {
  const Options* opt;
  uint64_t seed;
  uint64_t step;
  int slot;  // 0 for a lone collective; 1.. for the members of a coalesced unit
  // Shared: a check may run after the family's member was replaced (the fresh group).
  std::shared_ptr<ProcessGroup> pg;
  std::vector<int> globals;  // pg->global_ranks()
  std::string group_name;
  int me;  // group rank
  int p;   // group size
  int world_rank;
  bool coalescing;
  Stats* stats;
  // Set when this operation receives from any source; null where nobody needs to know.
  bool* used_recv_any = nullptr;
  std::string op_name;  // filled by the builder
  DType dtype = DType::Float32;
  size_t count = 0;
  std::string detail;

  // The data stream of group rank r for this operation's buffer `role`.
  uint64_t key(int r, uint64_t role) const {
    return hash({seed, step, static_cast<uint64_t>(slot), static_cast<uint64_t>(globals[r]), role});
  }
  // A generator for this operation's parameters: the same on every rank of the group.
  Rng rng(uint64_t salt = 0) const {
    return Rng(hash({seed, step, static_cast<uint64_t>(slot), 0x9a4a, salt}));
  }
  std::string describe() const {
    return fmt::format(
        "rank {} (group rank {}/{}) group \"{}\" {} {} x {}{} at step {} slot {} (seed {}; replay: "
        "weft-soak --seed {} --steps {} --max-bytes {} on as many ranks)",
        world_rank, me, p, group_name, op_name, weft::dtype_name(dtype), count,
        detail.empty() ? "" : " (" + detail + ")", step, slot, seed, seed, step + 1,
        opt->max_bytes);
  }
};

[[noreturn]] void fail_mismatch(const Ctx& c, const std::string& what, size_t index,
                                const std::byte* got, const std::byte* want, DType dtype) {
  std::fprintf(stderr, "weft-soak: MISMATCH %s: %s: first bad element %zu: got %s, want %s\n",
               c.describe().c_str(), what.c_str(), index, show_element(dtype, got).c_str(),
               show_element(dtype, want).c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// got[got_off, got_off + n) against want[0, n): byte for byte, or by value for floating
// reductions (so that +0 and -0 compare equal; nothing here makes a NaN).
void expect(const Ctx& c, const std::string& what, const Buf& got, size_t got_off, const Buf& want,
            bool by_value = false) {
  const size_t n = want.count();
  c.stats->elements_checked += static_cast<int64_t>(n);
  const size_t size = weft::dtype_size(want.dtype());
  if (n == 0 || std::memcmp(got.at(got_off), want.at(0), n * size) == 0) return;
  for (size_t i = 0; i < n; ++i) {
    const std::byte* g = got.at(got_off + i);
    const std::byte* w = want.at(i);
    if (std::memcmp(g, w, size) == 0) continue;
    if (by_value && weft::is_floating(want.dtype())) {
      const bool same = visit(want.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        T a, b;
        std::memcpy(&a, g, sizeof(T));
        std::memcpy(&b, w, sizeof(T));
        return to_double(a) == to_double(b);
      });
      if (same) continue;
    }
    fail_mismatch(c, what, i, g, w, want.dtype());
  }
}

// Elements [from, from + n) of stream `key`.
Buf stream(DType dtype, size_t n, uint64_t key, size_t from, Domain domain) {
  Buf b(dtype, n);
  b.fill(0, n, key, from, domain);
  return b;
}

// Elements [from, from + n) of the reduction, over the group, of every rank's stream `role`.
Buf reduction(const Ctx& c, ReduceOp op, Domain domain, uint64_t role, size_t from, size_t n) {
  Buf out(c.dtype, n);
  std::vector<uint64_t> keys;
  for (int r = 0; r < c.p; ++r) keys.push_back(c.key(r, role));
  visit(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> values(keys.size());
    T* o = reinterpret_cast<T*>(out.at(0));
    for (size_t i = 0; i < n; ++i) {
      for (size_t r = 0; r < keys.size(); ++r) {
        values[r] = make_value<T>(element_bits(keys[r], from + i), domain);
      }
      o[i] = reduce_values<T>(op, values.data(), static_cast<int>(keys.size()));
    }
  });
  return out;
}

// An issued operation: its Works, and what to check once they have completed.
struct Pending {
  std::vector<std::shared_ptr<Work>> works;
  std::vector<std::function<void()>> checks;
};

// ---- Parameters.

constexpr DType kDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                             DType::Int8,    DType::UInt8,   DType::Int32,   DType::Int64,
                             DType::UInt32,  DType::UInt64};

// Set during the pre-warm pass (prewarm()): every buffer float64 and as large as allowed.
bool g_prewarm = false;

DType pick_dtype(Rng& rng) {
  const DType dtype = kDTypes[rng.below(std::size(kDTypes))];
  return g_prewarm ? DType::Float64 : dtype;
}

ReduceOp pick_op(Rng& rng, DType dtype) {
  if (weft::is_floating(dtype)) {
    switch (rng.below(6)) {
      case 0:
        return ReduceOp::Sum;
      case 1:
        return ReduceOp::Prod;
      case 2:
        return ReduceOp::Min;
      case 3:
        return ReduceOp::Max;
      case 4:
        return ReduceOp::Avg;
      default: {
        static constexpr double kFactors[] = {0.25, 0.5, 2.0};
        return ReduceOp::premul_sum(kFactors[rng.below(3)]);
      }
    }
  }
  static constexpr ReduceOp::Kind kInt[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min,
                                            ReduceOp::Max, ReduceOp::Avg,  ReduceOp::BAnd,
                                            ReduceOp::BOr, ReduceOp::BXor};
  return ReduceOp(kInt[rng.below(std::size(kInt))]);
}

// An element count for one buffer of at most max_bytes: none 1 time in 20, otherwise log-uniform
// in bytes (as many buffers under 1 KiB as between 1 and 4 MiB: the small sizes are where the
// latency paths, deferral and caller-runs, are; the large ones where chunking and pipelining are).
size_t pick_count(Rng& rng, DType dtype, size_t max_bytes) {
  const size_t element = weft::dtype_size(dtype);
  if (g_prewarm) return max_bytes / element;
  if (rng.chance(0.05) || max_bytes < element) return 0;
  int top = 0;
  while ((size_t{2} << top) <= max_bytes) ++top;
  const int k = static_cast<int>(rng.below(top + 1));
  const size_t lo = k == 0 ? 1 : size_t{1} << k;
  const size_t hi = std::min(max_bytes, size_t{2} << k);
  const size_t bytes = lo + rng.below(hi - lo + 1);
  return std::max<size_t>(bytes / element, 1);
}

void note(Ctx& c, Kind kind, const char* name, DType dtype, size_t count,
          std::optional<ReduceOp> op, size_t payload_bytes) {
  c.op_name = name;
  c.dtype = dtype;
  c.count = count;
  c.stats->kinds[kind] += 1;
  c.stats->dtypes[static_cast<int>(dtype)] += 1;
  if (op) {
    c.stats->ops[op->kind] += 1;
    c.detail = weft::describe(*op);
  }
  c.stats->bytes += static_cast<int64_t>(payload_bytes);
}

// ---- The collectives. Each builder allocates and fills its buffers, issues the call(s) and
// adds the Works and checks to `out`. Roles: 1 inputs, 2 a second input, 9 garbage.

void build_all_reduce(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const ReduceOp op = pick_op(rng, dtype);
  const Domain domain = domain_for(dtype, op);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes);
  const bool in_place = rng.chance(0.5);
  note(c, kAllReduce, in_place ? "all_reduce" : "all_reduce(out of place)", dtype, n, op,
       n * weft::dtype_size(dtype));
  BufPtr in = make_buf(dtype, n, false), res = in_place ? in : make_buf(dtype, n);
  in->fill(c.key(c.me, 1), domain);
  out.works.push_back(in_place ? c.pg->all_reduce(in->tensor(), op)
                               : c.pg->all_reduce(in->tensor(), res->tensor(), op));
  out.checks.push_back([c, in, res, op, domain, n, in_place] {
    expect(c, "result", *res, 0, reduction(c, op, domain, 1, 0, n), true);
    if (!in_place)
      expect(c, "input (must be unchanged)", *in, 0, stream(c.dtype, n, c.key(c.me, 1), 0, domain));
  });
}

void build_reduce(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const ReduceOp op = pick_op(rng, dtype);
  const Domain domain = domain_for(dtype, op);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes);
  const int root = static_cast<int>(rng.below(c.p));
  const bool in_place = rng.chance(0.5);
  note(c, kReduce, in_place ? "reduce" : "reduce(out of place)", dtype, n, op,
       n * weft::dtype_size(dtype));
  c.detail += fmt::format(", root {}", root);
  BufPtr in = make_buf(dtype, n, false), res = in_place ? in : make_buf(dtype, n);
  in->fill(c.key(c.me, 1), domain);
  out.works.push_back(in_place ? c.pg->reduce(in->tensor(), root, op)
                               : c.pg->reduce(in->tensor(), res->tensor(), root, op));
  out.checks.push_back([c, in, res, op, domain, n, in_place, root] {
    if (c.me == root) {
      expect(c, "result on root", *res, 0, reduction(c, op, domain, 1, 0, n), true);
    }
    if (!in_place || c.me != root) {
      expect(c, "input (must be unchanged)", *in, 0, stream(c.dtype, n, c.key(c.me, 1), 0, domain));
    }
  });
}

void build_broadcast(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes);
  const int root = static_cast<int>(rng.below(c.p));
  note(c, kBroadcast, "broadcast", dtype, n, std::nullopt, n * weft::dtype_size(dtype));
  c.detail = fmt::format("root {}", root);
  BufPtr buf = make_buf(dtype, n, false);
  buf->fill(c.key(c.me, c.me == root ? 1 : 9), Domain::Bits);
  out.works.push_back(c.pg->broadcast(buf->tensor(), root));
  out.checks.push_back([c, buf, n, root] {
    expect(c, "result", *buf, 0, stream(c.dtype, n, c.key(root, 1), 0, Domain::Bits));
  });
}

// Per-rank counts for the uneven collectives: each at most max_bytes / p bytes.
std::vector<size_t> uneven_counts(const Ctx& c, Rng& rng, DType dtype) {
  std::vector<size_t> counts(c.p);
  for (auto& n : counts) n = pick_count(rng, dtype, c.opt->max_bytes / c.p);
  return counts;
}

std::vector<size_t> offsets_of(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

void build_all_gather(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  // 0: equal blocks of one buffer; 1: equal blocks in separate buffers; 2: per-rank sizes.
  const int variant = static_cast<int>(rng.below(3));
  std::vector<size_t> counts(c.p, pick_count(rng, dtype, c.opt->max_bytes / c.p));
  if (variant == 2) counts = uneven_counts(c, rng, dtype);
  const std::vector<size_t> offsets = offsets_of(counts);
  note(c, kAllGather, "all_gather", dtype, counts[c.me], std::nullopt,
       offsets.back() * weft::dtype_size(dtype));
  c.detail = variant == 0 ? "one buffer" : variant == 1 ? "separate buffers" : "per-rank sizes";
  BufPtr in = make_buf(dtype, counts[c.me], false);
  in->fill(c.key(c.me, 1), Domain::Bits);
  std::vector<BufPtr> outs;
  std::vector<Tensor> list;
  if (variant == 0) {
    outs.push_back(make_buf(dtype, offsets.back()));
    for (int r = 0; r < c.p; ++r) list.push_back(outs[0]->slice(offsets[r], counts[r]));
  } else {
    for (int r = 0; r < c.p; ++r) {
      outs.push_back(make_buf(dtype, counts[r]));
      list.push_back(outs.back()->tensor());
    }
  }
  out.works.push_back(c.pg->all_gather(list, in->tensor()));
  out.checks.push_back([c, in, outs, counts, offsets, variant] {
    for (int r = 0; r < c.p; ++r) {
      const Buf& got = variant == 0 ? *outs[0] : *outs[r];
      expect(c, fmt::format("block from group rank {}", r), got, variant == 0 ? offsets[r] : 0,
             stream(c.dtype, counts[r], c.key(r, 1), 0, Domain::Bits));
    }
    expect(c, "input (must be unchanged)", *in, 0,
           stream(c.dtype, counts[c.me], c.key(c.me, 1), 0, Domain::Bits));
  });
}

void build_all_gather_into_tensor(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes / c.p);
  const bool in_place = rng.chance(0.5);
  note(c, kAllGatherIntoTensor, "all_gather_into_tensor", dtype, n, std::nullopt,
       c.p * n * weft::dtype_size(dtype));
  c.detail = in_place ? "in place" : "out of place";
  BufPtr res = make_buf(dtype, c.p * n);
  BufPtr in = in_place ? res : make_buf(dtype, n, false);
  in->fill(in_place ? c.me * n : 0, n, c.key(c.me, 1), 0, Domain::Bits);
  out.works.push_back(c.pg->all_gather_into_tensor(
      res->tensor(), in_place ? res->slice(c.me * n, n) : in->tensor()));
  out.checks.push_back([c, in, res, n] {
    for (int r = 0; r < c.p; ++r) {
      expect(c, fmt::format("block from group rank {}", r), *res, r * n,
             stream(c.dtype, n, c.key(r, 1), 0, Domain::Bits));
    }
  });
}

void build_all_gather_uneven(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const std::vector<size_t> counts = uneven_counts(c, rng, dtype);
  const std::vector<size_t> offsets = offsets_of(counts);
  note(c, kAllGatherUneven, "all_gather_uneven", dtype, counts[c.me], std::nullopt,
       offsets.back() * weft::dtype_size(dtype));
  BufPtr in = make_buf(dtype, counts[c.me], false), res = make_buf(dtype, offsets.back());
  in->fill(c.key(c.me, 1), Domain::Bits);
  out.works.push_back(c.pg->all_gather_uneven(res->tensor(), in->tensor(), counts));
  out.checks.push_back([c, in, res, counts, offsets] {
    for (int r = 0; r < c.p; ++r) {
      expect(c, fmt::format("block from group rank {}", r), *res, offsets[r],
             stream(c.dtype, counts[r], c.key(r, 1), 0, Domain::Bits));
    }
  });
}

void build_reduce_scatter(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const ReduceOp op = pick_op(rng, dtype);
  const Domain domain = domain_for(dtype, op);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes / c.p);
  const bool separate = rng.chance(0.5);
  note(c, kReduceScatter, "reduce_scatter", dtype, n, op, c.p * n * weft::dtype_size(dtype));
  c.detail += separate ? ", separate inputs" : ", one input buffer";
  // Rank r's input j is elements [j * n, (j + 1) * n) of its stream either way.
  std::vector<BufPtr> ins;
  std::vector<Tensor> list;
  if (separate) {
    for (int j = 0; j < c.p; ++j) {
      ins.push_back(make_buf(dtype, n, false));
      ins.back()->fill(0, n, c.key(c.me, 1), j * n, domain);
      list.push_back(ins.back()->tensor());
    }
  } else {
    ins.push_back(make_buf(dtype, c.p * n, false));
    ins[0]->fill(c.key(c.me, 1), domain);
    for (int j = 0; j < c.p; ++j) list.push_back(ins[0]->slice(j * n, n));
  }
  BufPtr res = make_buf(dtype, n);
  out.works.push_back(c.pg->reduce_scatter(res->tensor(), list, op));
  out.checks.push_back([c, ins, res, op, domain, n] {
    expect(c, "result", *res, 0, reduction(c, op, domain, 1, c.me * n, n), true);
  });
}

void build_reduce_scatter_tensor(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const ReduceOp op = pick_op(rng, dtype);
  const Domain domain = domain_for(dtype, op);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes / c.p);
  const bool in_place = rng.chance(0.5);
  note(c, kReduceScatterTensor, "reduce_scatter_tensor", dtype, n, op,
       c.p * n * weft::dtype_size(dtype));
  c.detail += in_place ? ", in place" : ", out of place";
  BufPtr in = make_buf(dtype, c.p * n, false);
  in->fill(c.key(c.me, 1), domain);
  BufPtr res = in_place ? in : make_buf(dtype, n);
  out.works.push_back(c.pg->reduce_scatter_tensor(in_place ? in->slice(c.me * n, n) : res->tensor(),
                                                  in->tensor(), op));
  out.checks.push_back([c, in, res, op, domain, n, in_place] {
    expect(c, "result", *res, in_place ? c.me * n : 0, reduction(c, op, domain, 1, c.me * n, n),
           true);
    if (!in_place) {
      expect(c, "input (must be unchanged)", *in, 0,
             stream(c.dtype, c.p * n, c.key(c.me, 1), 0, domain));
    }
  });
}

void build_reduce_scatter_uneven(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const ReduceOp op = pick_op(rng, dtype);
  const Domain domain = domain_for(dtype, op);
  const std::vector<size_t> counts = uneven_counts(c, rng, dtype);
  const std::vector<size_t> offsets = offsets_of(counts);
  note(c, kReduceScatterUneven, "reduce_scatter_uneven", dtype, counts[c.me], op,
       offsets.back() * weft::dtype_size(dtype));
  BufPtr in = make_buf(dtype, offsets.back(), false), res = make_buf(dtype, counts[c.me]);
  in->fill(c.key(c.me, 1), domain);
  out.works.push_back(c.pg->reduce_scatter_uneven(res->tensor(), in->tensor(), counts, op));
  out.checks.push_back([c, in, res, op, domain, counts, offsets] {
    expect(c, "result", *res, 0, reduction(c, op, domain, 1, offsets[c.me], counts[c.me]), true);
  });
}

void build_gather(Ctx& c, Pending& out, bool into_tensor) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes / c.p);
  const int root = static_cast<int>(rng.below(c.p));
  note(c, into_tensor ? kGatherIntoTensor : kGather, into_tensor ? "gather_into_tensor" : "gather",
       dtype, n, std::nullopt, (c.me == root ? c.p : 1) * n * weft::dtype_size(dtype));
  c.detail = fmt::format("root {}", root);
  BufPtr in = make_buf(dtype, n, false);
  in->fill(c.key(c.me, 1), Domain::Bits);
  std::vector<BufPtr> outs;
  if (into_tensor) {
    if (c.me == root) outs.push_back(make_buf(dtype, c.p * n));
    out.works.push_back(c.pg->gather_into_tensor(
        c.me == root ? outs[0]->tensor() : Tensor{nullptr, 0, dtype, {}}, in->tensor(), root));
  } else {
    std::vector<Tensor> list;
    if (c.me == root) {
      for (int r = 0; r < c.p; ++r) {
        outs.push_back(make_buf(dtype, n));
        list.push_back(outs.back()->tensor());
      }
    }
    out.works.push_back(c.pg->gather(list, in->tensor(), root));
  }
  out.checks.push_back([c, in, outs, n, root, into_tensor] {
    if (c.me != root) return;
    for (int r = 0; r < c.p; ++r) {
      expect(c, fmt::format("block from group rank {}", r), into_tensor ? *outs[0] : *outs[r],
             into_tensor ? r * n : 0, stream(c.dtype, n, c.key(r, 1), 0, Domain::Bits));
    }
  });
}

void build_scatter(Ctx& c, Pending& out, bool from_tensor) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes / c.p);
  const int root = static_cast<int>(rng.below(c.p));
  note(c, from_tensor ? kScatterFromTensor : kScatter,
       from_tensor ? "scatter_from_tensor" : "scatter", dtype, n, std::nullopt,
       (c.me == root ? c.p : 1) * n * weft::dtype_size(dtype));
  c.detail = fmt::format("root {}", root);
  BufPtr res = make_buf(dtype, n);
  std::vector<BufPtr> ins;
  if (from_tensor) {
    if (c.me == root) {
      ins.push_back(make_buf(dtype, c.p * n, false));
      ins[0]->fill(c.key(c.me, 1), Domain::Bits);
    }
    out.works.push_back(c.pg->scatter_from_tensor(
        res->tensor(), c.me == root ? ins[0]->tensor() : Tensor{nullptr, 0, dtype, {}}, root));
  } else {
    std::vector<Tensor> list;
    if (c.me == root) {
      for (int j = 0; j < c.p; ++j) {
        ins.push_back(make_buf(dtype, n, false));
        ins.back()->fill(0, n, c.key(c.me, 1), j * n, Domain::Bits);
        list.push_back(ins.back()->tensor());
      }
    }
    out.works.push_back(c.pg->scatter(res->tensor(), list, root));
  }
  out.checks.push_back([c, ins, res, n, root] {
    expect(c, "result", *res, 0, stream(c.dtype, n, c.key(root, 1), c.me * n, Domain::Bits));
  });
}

void build_all_to_all(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const size_t n = pick_count(rng, dtype, c.opt->max_bytes / c.p);
  const bool in_place = rng.chance(0.3);
  note(c, kAllToAll, "all_to_all", dtype, n, std::nullopt, c.p * n * weft::dtype_size(dtype));
  c.detail = in_place ? "in place" : "out of place";
  BufPtr in = make_buf(dtype, c.p * n, false);
  in->fill(c.key(c.me, 1), Domain::Bits);
  BufPtr res = in_place ? in : make_buf(dtype, c.p * n);
  out.works.push_back(c.pg->all_to_all(res->tensor(), in->tensor()));
  out.checks.push_back([c, in, res, n] {
    for (int j = 0; j < c.p; ++j) {
      expect(c, fmt::format("block from group rank {}", j), *res, j * n,
             stream(c.dtype, n, c.key(j, 1), c.me * n, Domain::Bits));
    }
  });
}

void build_all_to_all_splits(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  // sends[i][j]: elements group rank i sends to group rank j; some are zero.
  std::vector<std::vector<size_t>> sends(c.p, std::vector<size_t>(c.p));
  for (auto& row : sends) {
    for (auto& n : row) n = rng.chance(0.15) ? 0 : pick_count(rng, dtype, c.opt->max_bytes / c.p);
  }
  // A rank whose splits are all zero both ways takes the even all_to_all path, the others the
  // uneven one: kept as drawn (docs/reliability.md, "Soak", found here and fixed in pairwise.cc).
  std::vector<size_t> input_splits = sends[c.me], output_splits(c.p);
  for (int j = 0; j < c.p; ++j) output_splits[j] = sends[j][c.me];
  const std::vector<size_t> in_offsets = offsets_of(input_splits);
  const std::vector<size_t> out_offsets = offsets_of(output_splits);
  const bool single = rng.chance(0.5);
  note(c, kAllToAllSplits, single ? "all_to_all_single" : "all_to_all(splits)", dtype,
       in_offsets.back(), std::nullopt,
       std::max(in_offsets.back(), out_offsets.back()) * weft::dtype_size(dtype));
  c.detail = fmt::format("input_splits [{}], output_splits [{}]", fmt::join(input_splits, " "),
                         fmt::join(output_splits, " "));
  BufPtr in = make_buf(dtype, in_offsets.back(), false), res = make_buf(dtype, out_offsets.back());
  in->fill(c.key(c.me, 1), Domain::Bits);
  out.works.push_back(
      single ? c.pg->all_to_all_single(res->tensor(), in->tensor(), output_splits, input_splits)
             : c.pg->all_to_all(res->tensor(), in->tensor(), output_splits, input_splits));
  out.checks.push_back([c, in, res, sends, out_offsets] {
    for (int j = 0; j < c.p; ++j) {
      // Rank j's block for me starts after what j sends to the ranks before me.
      size_t from = 0;
      for (int k = 0; k < c.me; ++k) from += sends[j][k];
      expect(c, fmt::format("block from group rank {}", j), *res, out_offsets[j],
             stream(c.dtype, sends[j][c.me], c.key(j, 1), from, Domain::Bits));
    }
  });
}

void build_barrier(Ctx& c, Pending& out) {
  note(c, kBarrier, "barrier", DType::Float32, 0, std::nullopt, 0);
  out.works.push_back(c.pg->barrier());
}

// Point to point: the message group rank `from` sends to `to` with index k of this operation has
// a count of its own and the data stream role 100 + k of `from` (offset 0).
size_t message_count(const Ctx& c, DType dtype, int from, int to, int k) {
  Rng rng(hash({c.key(from, 50), static_cast<uint64_t>(c.globals[to]), static_cast<uint64_t>(k)}));
  return pick_count(rng, dtype, c.opt->max_bytes);
}

uint64_t tag_of(const Ctx& c, int k) {
  // Unique per step, slot and message; below 2^62 as weft requires.
  return ((c.step & 0xffffffffffull) << 16) | (static_cast<uint64_t>(c.slot) << 8) |
         static_cast<uint64_t>(k);
}

struct Message {
  int peer;
  int k;  // index within the operation (tag and data stream)
  bool send;
};

// Issues `messages` in the given order (each a send or a receive of this rank), and checks every
// received one. recv_any on receives whose k is in `any`.
void issue_messages(Ctx& c, Pending& out, DType dtype, const std::vector<Message>& messages,
                    const std::vector<int>& any = {}) {
  for (const Message& m : messages) {
    const bool wants_any = std::find(any.begin(), any.end(), m.k) != any.end();
    if (m.send) {
      const size_t n = message_count(c, dtype, c.me, m.peer, m.k);
      BufPtr b = make_buf(dtype, n, false);
      b->fill(c.key(c.me, 100 + m.k), Domain::Bits);
      c.stats->bytes += static_cast<int64_t>(b->nbytes());
      out.works.push_back(c.pg->send(b->tensor(), m.peer, tag_of(c, m.k)));
      out.checks.push_back([c, b, m, n] {
        expect(c, fmt::format("send buffer to group rank {} (must be unchanged)", m.peer), *b, 0,
               stream(c.dtype, n, c.key(c.me, 100 + m.k), 0, Domain::Bits));
      });
    } else {
      const size_t n = message_count(c, dtype, m.peer, c.me, m.k);
      BufPtr b = make_buf(dtype, n);
      c.stats->bytes += static_cast<int64_t>(b->nbytes());
      std::shared_ptr<Work> w;
      bool use_any = wants_any;
      if (use_any) {
        // Refused at the call where the group mixes shared memory and TCP (namespace hosts):
        // then the same message by its sender.
        try {
          w = c.pg->recv_any(b->tensor(), tag_of(c, m.k));
          c.stats->recv_any += 1;
        } catch (const weft::Error& e) {
          if (e.code() != weft::ErrorCode::Unsupported) throw;
          c.stats->recv_any_refused += 1;
          use_any = false;
        }
      }
      if (!w) w = c.pg->recv(b->tensor(), m.peer, tag_of(c, m.k));
      out.works.push_back(w);
      out.checks.push_back([c, b, m, n, w, use_any] {
        if (use_any && w->source_rank() != m.peer) {
          std::fprintf(stderr,
                       "weft-soak: MISMATCH %s: recv_any tag %llu: source_rank() %d, want %d\n",
                       c.describe().c_str(), static_cast<unsigned long long>(tag_of(c, m.k)),
                       w->source_rank(), m.peer);
          std::_Exit(1);
        }
        expect(c, fmt::format("message {} from group rank {}", m.k, m.peer), *b, 0,
               stream(c.dtype, n, c.key(m.peer, 100 + m.k), 0, Domain::Bits));
      });
    }
  }
}

// Every rank sends to the next and receives from the previous. Outside a coalesced unit even ranks
// send first and odd ones receive first, which cannot deadlock whether or not a send waits for
// its receive; inside one, the order is random (the unit posts them together).
void build_ring(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  note(c, kSendRecvRing, "send/recv ring", dtype,
       message_count(c, dtype, c.me, (c.me + 1) % c.p, 0), std::nullopt, 0);
  const int next = (c.me + 1) % c.p, prev = (c.me + c.p - 1) % c.p;
  const bool send_first = c.coalescing ? Rng(c.key(c.me, 7)).chance(0.5) : c.me % 2 == 0;
  std::vector<Message> messages = {{next, 0, true}, {prev, 0, false}};
  if (!send_first) std::swap(messages[0], messages[1]);
  issue_messages(c, out, dtype, messages);
}

// Random pairs (a random perfect matching; the odd one out talks to itself), 1 to 3 messages
// each way with distinct tags; the second of each pair may receive with recv_any.
void build_pairs(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  std::vector<int> order(c.p);
  std::iota(order.begin(), order.end(), 0);
  rng.shuffle(order);
  const int messages_each_way = 1 + static_cast<int>(rng.below(3));
  const bool any = c.opt->recv_any && rng.chance(0.3);
  if (any && c.used_recv_any) *c.used_recv_any = true;
  const size_t position = std::find(order.begin(), order.end(), c.me) - order.begin();
  const bool first = position % 2 == 0;
  const int peer =
      position + 1 < order.size() || !first ? order[first ? position + 1 : position - 1] : c.me;
  note(c, kSendRecvPairs, "send/recv pairs", dtype, message_count(c, dtype, c.me, peer, 0),
       std::nullopt, 0);
  c.detail = fmt::format("peer {}, {} each way{}", peer, messages_each_way,
                         any && peer != c.me ? ", recv_any" : "");
  std::vector<Message> sends, recvs;
  for (int k = 0; k < messages_each_way; ++k) {
    sends.push_back({peer, k, true});
    recvs.push_back({peer, k, false});
  }
  std::vector<Message> messages = first ? sends : recvs;
  const std::vector<Message>& then = first ? recvs : sends;
  messages.insert(messages.end(), then.begin(), then.end());
  std::vector<int> use_any;
  if (any && peer != c.me && !first) {
    for (int k = 0; k < messages_each_way; ++k) use_any.push_back(k);
  }
  issue_messages(c, out, dtype, messages, use_any);
}

// Both directions around the ring in one batch, the ops in random order per rank.
void build_batch(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const DType dtype = pick_dtype(rng);
  const int next = (c.me + 1) % c.p, prev = (c.me + c.p - 1) % c.p;
  note(c, kBatchIsendIrecv, "batch_isend_irecv", dtype, message_count(c, dtype, c.me, next, 0),
       std::nullopt, 0);
  // Message 0 goes to next, message 1 to prev.
  std::vector<Message> messages = {
      {next, 0, true}, {prev, 1, true}, {prev, 0, false}, {next, 1, false}};
  Rng(c.key(c.me, 8)).shuffle(messages);
  std::vector<weft::P2POp> ops;
  std::vector<std::function<void()>> checks;
  for (const Message& m : messages) {
    const int from = m.send ? c.me : m.peer;
    const int to = m.send ? m.peer : c.me;
    const size_t n = message_count(c, dtype, from, to, m.k);
    BufPtr b = make_buf(dtype, n, !m.send);
    if (m.send) b->fill(c.key(c.me, 100 + m.k), Domain::Bits);
    c.stats->bytes += static_cast<int64_t>(b->nbytes());
    ops.push_back(
        {m.send ? weft::P2POp::Send : weft::P2POp::Recv, b->tensor(), m.peer, tag_of(c, m.k)});
    if (!m.send) {
      out.checks.push_back([c, b, m, n] {
        expect(c, fmt::format("message {} from group rank {}", m.k, m.peer), *b, 0,
               stream(c.dtype, n, c.key(m.peer, 100 + m.k), 0, Domain::Bits));
      });
    } else {
      out.checks.push_back([b] {});  // keeps the send buffer alive until the batch completes
    }
  }
  for (auto& w : c.pg->batch_isend_irecv(std::move(ops))) out.works.push_back(std::move(w));
}

// The object collectives block (each runs two or three collectives): checked at once.
void build_objects(Ctx& c, Pending& out) {
  Rng rng = c.rng();
  const int variant = static_cast<int>(rng.below(4));
  const int root = static_cast<int>(rng.below(c.p));
  auto object_of = [&](int r, int k) {
    Rng size_rng(hash({c.key(r, 60), static_cast<uint64_t>(k)}));
    const size_t n = size_rng.chance(0.1) ? 0 : size_rng.below(5000);
    Buf b =
        stream(DType::UInt8, n, hash({c.key(r, 61), static_cast<uint64_t>(k)}), 0, Domain::Bits);
    const auto* p = reinterpret_cast<const uint8_t*>(b.at(0));
    return weft::Bytes(p, p + n);
  };
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "weft-soak: MISMATCH %s: %s\n", c.describe().c_str(), what.c_str());
    std::_Exit(1);
  };
  static constexpr const char* kNames[] = {"all_gather_object", "broadcast_object_list",
                                           "gather_object", "scatter_object_list"};
  note(c, kObjects, kNames[variant], DType::UInt8, 0, std::nullopt, 0);
  c.detail = fmt::format("root {}", root);
  switch (variant) {
    case 0: {
      const std::vector<weft::Bytes> all = c.pg->all_gather_object(object_of(c.me, 0));
      if (static_cast<int>(all.size()) != c.p) fail(fmt::format("{} objects", all.size()));
      for (int r = 0; r < c.p; ++r) {
        if (all[r] != object_of(r, 0)) fail(fmt::format("object from group rank {}", r));
      }
      break;
    }
    case 1: {
      const int count = static_cast<int>(rng.below(4));
      std::vector<weft::Bytes> objects;
      if (c.me == root) {
        for (int k = 0; k < count; ++k) objects.push_back(object_of(root, k));
      } else {
        objects.assign(rng.below(3), weft::Bytes{1, 2, 3});
      }
      c.pg->broadcast_object_list(objects, root);
      if (static_cast<int>(objects.size()) != count)
        fail(fmt::format("{} objects", objects.size()));
      for (int k = 0; k < count; ++k) {
        if (objects[k] != object_of(root, k)) fail(fmt::format("object {}", k));
      }
      break;
    }
    case 2: {
      const std::vector<weft::Bytes> all = c.pg->gather_object(object_of(c.me, 0), root);
      if (c.me != root) {
        if (!all.empty()) fail("objects on a rank that is not root");
        break;
      }
      if (static_cast<int>(all.size()) != c.p) fail(fmt::format("{} objects", all.size()));
      for (int r = 0; r < c.p; ++r) {
        if (all[r] != object_of(r, 0)) fail(fmt::format("object from group rank {}", r));
      }
      break;
    }
    default: {
      std::vector<weft::Bytes> objects;
      if (c.me == root) {
        for (int r = 0; r < c.p; ++r) objects.push_back(object_of(root, r));
      }
      if (c.pg->scatter_object_list(objects, root) != object_of(root, c.me)) fail("object");
      break;
    }
  }
  (void)out;
}

using Builder = void (*)(Ctx&, Pending&);

// What a coalesced unit may hold: every non-blocking collective and the ring (recv_any and the
// object collectives cannot be coalesced).
const std::vector<std::pair<Builder, int>>& coalescable() {
  static const std::vector<std::pair<Builder, int>> kBuilders = {
      {build_all_reduce, 4},
      {build_reduce, 2},
      {build_broadcast, 2},
      {build_all_gather, 2},
      {build_all_gather_into_tensor, 2},
      {build_all_gather_uneven, 1},
      {build_reduce_scatter, 1},
      {build_reduce_scatter_tensor, 2},
      {build_reduce_scatter_uneven, 1},
      {[](Ctx& c, Pending& o) { build_gather(c, o, false); }, 1},
      {[](Ctx& c, Pending& o) { build_gather(c, o, true); }, 1},
      {[](Ctx& c, Pending& o) { build_scatter(c, o, false); }, 1},
      {[](Ctx& c, Pending& o) { build_scatter(c, o, true); }, 1},
      {build_all_to_all, 2},
      {build_all_to_all_splits, 1},
      {build_barrier, 1},
      {build_ring, 3},
  };
  return kBuilders;
}

void build_coalesced(Ctx& c, Pending& out) {
  Rng rng = c.rng(1);
  const int members = 1 + static_cast<int>(rng.below(5));
  std::vector<int> weights;
  for (const auto& [builder, weight] : coalescable()) weights.push_back(weight);
  const uint64_t first_seq = c.pg->sequence_number();
  c.pg->start_coalescing();
  Pending inner;
  std::vector<std::string> names;
  int collectives = 0;
  for (int m = 0; m < members; ++m) {
    Ctx sub = c;
    sub.slot = m + 1;
    sub.coalescing = true;
    sub.detail.clear();
    const size_t which = rng.weighted(weights);
    coalescable()[which].first(sub, inner);
    if (sub.op_name != "send/recv ring") ++collectives;
    names.push_back(sub.op_name);
  }
  std::shared_ptr<Work> unit = c.pg->end_coalescing();
  note(c, kCoalesced, "coalesced", DType::Float32, static_cast<size_t>(members), std::nullopt, 0);
  c.detail = fmt::format("{}", fmt::join(names, ", "));
  const uint64_t last_seq = c.pg->sequence_number();
  out.works.push_back(unit);
  std::vector<std::shared_ptr<Work>> member_works = inner.works;
  out.checks.push_back([c, member_works, first_seq, last_seq, collectives] {
    for (size_t k = 0; k < member_works.size(); ++k) {
      if (!member_works[k]->is_completed() || !member_works[k]->is_success()) {
        std::fprintf(stderr,
                     "weft-soak: MISMATCH %s: member operation %zu not complete and successful "
                     "when its unit is\n",
                     c.describe().c_str(), k);
        std::_Exit(1);
      }
    }
    if (last_seq != first_seq + static_cast<uint64_t>(collectives)) {
      std::fprintf(stderr,
                   "weft-soak: MISMATCH %s: sequence number went from %llu to %llu over %d "
                   "collectives\n",
                   c.describe().c_str(), static_cast<unsigned long long>(first_seq),
                   static_cast<unsigned long long>(last_seq), collectives);
      std::_Exit(1);
    }
  });
  for (auto& check : inner.checks) out.checks.push_back(std::move(check));
}

struct Choice {
  Builder builder;
  int weight;
};

const std::vector<Choice>& choices() {
  static const std::vector<Choice> kChoices = {
      {build_all_reduce, 14},
      {build_reduce, 6},
      {build_broadcast, 6},
      {build_all_gather, 6},
      {build_all_gather_into_tensor, 5},
      {build_all_gather_uneven, 4},
      {build_reduce_scatter, 4},
      {build_reduce_scatter_tensor, 5},
      {build_reduce_scatter_uneven, 4},
      {[](Ctx& c, Pending& o) { build_gather(c, o, false); }, 3},
      {[](Ctx& c, Pending& o) { build_gather(c, o, true); }, 3},
      {[](Ctx& c, Pending& o) { build_scatter(c, o, false); }, 3},
      {[](Ctx& c, Pending& o) { build_scatter(c, o, true); }, 3},
      {build_all_to_all, 5},
      {build_all_to_all_splits, 5},
      {build_barrier, 3},
      {build_ring, 5},
      {build_pairs, 5},
      {build_batch, 3},
      {build_objects, 2},
      {build_coalesced, 6},
  };
  return kChoices;
}

// ---- Resources.

struct Sample {
  double seconds = 0;  // since the start of the soak
  int64_t step = 0;
  int64_t rss_kib = 0;
  int64_t anon_kib = 0;   // RssAnon: the heap and anonymous mappings, where a leak shows
  int64_t shmem_kib = 0;  // RssShmem: the shared-memory rings of the groups alive
  int64_t fds = 0;
  int64_t threads = 0;
  int64_t shm_segments = 0;  // /dev/shm segments this process created that still exist
};

int64_t count_entries(const char* dir, const std::string& contains = "") {
  DIR* d = opendir(dir);
  if (!d) return -1;
  int64_t n = 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (!contains.empty() &&
        (name.rfind("weft-", 0) != 0 || name.find(contains) == std::string::npos)) {
      continue;
    }
    ++n;
  }
  closedir(d);
  return n;
}

Sample take_sample(double seconds, int64_t step) {
  malloc_trim(0);
  Sample s;
  s.seconds = seconds;
  s.step = step;
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  s.rss_kib = resident_pages * (sysconf(_SC_PAGESIZE) / 1024);
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssAnon:", 0) == 0) s.anon_kib = std::atoll(line.c_str() + 8);
    if (line.rfind("RssShmem:", 0) == 0) s.shmem_kib = std::atoll(line.c_str() + 9);
  }
  s.fds = count_entries("/proc/self/fd") - 1;  // opendir's own descriptor
  s.threads = count_entries("/proc/self/task");
  // Segment names carry the creator's pid: "weft-<job>-<group>-<pid>-r<rank>".
  s.shm_segments = count_entries("/dev/shm", fmt::format("-{}-r", getpid()));
  return s;
}

struct Bounds {
  int64_t rss_kib;
  int64_t fds = 8;
  int64_t threads = 4;
  int64_t shm_segments = 4;
};

Bounds bounds_for(const Sample& base) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitizer's allocator keeps freed memory (ASan's quarantine holds 256 MiB by default) and
  // its shadow grows with the addresses touched: RSS says nothing about leaks there (LeakSanitizer
  // finds those at exit). Descriptors, threads and segments are still checked.
  static_cast<void>(base);
  return Bounds{int64_t{4} << 20};
#else
  return Bounds{std::max<int64_t>(64 * 1024, base.rss_kib / 5)};
#endif
}

// ---- The run.

struct Families {
  std::shared_ptr<ProcessGroup> world, parity, halves, pairs, reversed, fresh;
  int fresh_generation = 0;
  bool fresh_used_recv_any = false;  // a receive from any source ran on the fresh group
};

constexpr const char* kFamilyNames[] = {"world", "parity", "halves", "pairs", "reversed", "fresh"};
constexpr int kFamilyWeights[] = {30, 14, 14, 10, 10, 22};
// The fresh group is remade every kFreshEvery steps (made, used ~kFreshEvery/5 times, destroyed).
// Every kFreshEvery steps rank 0 also tells the others whether to stop or sample (a broadcast on
// the world), so that the ranks stop and sample at the same step though their clocks differ, and
// the samples fall between the old fresh group's destruction and the new one's creation: only
// the fixed groups are alive then, and their rings and connections are the same every time.
constexpr int64_t kFreshEvery = 25;

void destroy_fresh(const Options& opt, Families& f, Stats& stats) {
  if (!f.fresh) return;
  // Known bug (docs/reliability.md, "Soak"): a member destroying the group fails another
  // member's pending recv_any with PeerLost, though the member that left was not its sender and
  // had finished everything it issued. A barrier first lets every receive complete.
  if (opt.workarounds && f.fresh_used_recv_any) {
    f.fresh->barrier()->wait();
    stats.workarounds += 1;
  }
  f.fresh_used_recv_any = false;
  f.fresh->destroy();
  f.fresh.reset();
  stats.groups_destroyed += 1;
}

void make_fresh(Families& f, Stats& stats, uint64_t seed, int64_t step) {
  const int world_size = f.world->size(), me = f.world->rank();
  const int generation = f.fresh_generation++;
  Rng rng(hash({seed, static_cast<uint64_t>(step), 0xf2e5}));
  weft::NewGroupOptions options;
  if (generation % 2 == 0) {
    // Colours in {-1, 0, 1, 2} (some ranks in no group), keys random: up to three groups at once.
    const uint64_t mine =
        hash({seed, static_cast<uint64_t>(step), 0xc010, static_cast<uint64_t>(me)});
    f.fresh = f.world->split(static_cast<int>(mine % 4) - 1, static_cast<int>((mine >> 8) % 100),
                             options);
  } else {
    std::vector<int> ranks(world_size);
    std::iota(ranks.begin(), ranks.end(), 0);
    rng.shuffle(ranks);
    ranks.resize(1 + rng.below(world_size));
    options.name = fmt::format("fresh{}", generation);
    f.fresh = f.world->new_group(ranks, options);
  }
  if (f.fresh) stats.groups_created += 1;
}

std::shared_ptr<ProcessGroup> member_of(const Families& f, int family) {
  switch (family) {
    case 0:
      return f.world;
    case 1:
      return f.parity;
    case 2:
      return f.halves;
    case 3:
      return f.pairs;
    case 4:
      return f.reversed;
    default:
      return f.fresh;
  }
}

// Waits for every pending operation and runs its checks.
void drain(std::vector<Pending>& in_flight) {
  std::vector<std::shared_ptr<Work>> works;
  for (const Pending& p : in_flight) works.insert(works.end(), p.works.begin(), p.works.end());
  weft::wait_all(works);
  for (const Pending& p : in_flight) {
    for (const auto& check : p.checks) check();
  }
  in_flight.clear();
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out;
}

Ctx make_ctx(const Options& opt, uint64_t seed, int64_t step,
             const std::shared_ptr<ProcessGroup>& pg, int world_rank, Stats& stats) {
  return Ctx{.opt = &opt,
             .seed = seed,
             .step = static_cast<uint64_t>(step),
             .slot = 0,
             .pg = pg,
             .globals = pg->global_ranks(),
             .group_name = pg->name(),
             .me = pg->rank(),
             .p = pg->size(),
             .world_rank = world_rank,
             .coalescing = false,
             .stats = &stats,
             .op_name = "",
             .detail = ""};
}

// Every builder once, at the largest sizes, on each fixed group, checked, before the clock
// starts and not counted: a group's scratch and staging pools grow to the largest buffers its
// collectives have needed and never shrink (collectives/scratch_pool.h), so without this they
// would still be growing after a short run's warm-up and look like a leak. Steps from 2^40 on,
// apart from the run's. Returns the operations issued.
int prewarm(const Options& opt, uint64_t seed, const Families& f, int me) {
  Stats uncounted;
  g_prewarm = true;
  int64_t step = int64_t{1} << 40;
  int issued = 0;
  for (const auto& pg : {f.world, f.parity, f.halves, f.pairs, f.reversed}) {
    for (const Choice& choice : choices()) {
      ++step;
      if (!pg) continue;
      Ctx c = make_ctx(opt, seed, step, pg, me, uncounted);
      g_last_step =
          fmt::format("pre-warm step {} on group \"{}\", seed {}", step, pg->name(), seed);
      std::vector<Pending> one(1);
      choice.builder(c, one[0]);
      drain(one);
      ++issued;
    }
  }
  g_prewarm = false;
  return issued;
}

int run(const Options& opt) {
  weft::ProcessGroupOptions pg_options;
  pg_options.timeout = std::chrono::seconds(opt.timeout_seconds);
  Families f;
  f.world = weft::init_process_group(pg_options);
  const int me = f.world->rank(), world_size = f.world->size();

  // The seed: given, or rank 0's clock, so that every rank uses the same one.
  uint64_t seed = opt.seed.value_or(
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) %
      1000000007);
  f.world->broadcast(Tensor::of(&seed, 1), 0)->wait();
  if (me == 0) {
    std::printf(
        "weft-soak: %d ranks, seed %llu (replay with --seed %llu), %.0f s, max %zu bytes "
        "per buffer\n",
        world_size, static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed),
        opt.seconds, opt.max_bytes);
    std::fflush(stdout);
  }

  Stats stats;
  // The fixed families, made once; every rank calls every new_group and split, in this order.
  f.parity = f.world->split(me % 2, me);
  std::vector<int> lo(world_size / 2), hi(world_size - world_size / 2), reversed(world_size);
  std::iota(lo.begin(), lo.end(), 0);
  std::iota(hi.begin(), hi.end(), world_size / 2);
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  weft::NewGroupOptions named;
  named.name = "lo";
  auto lo_group = lo.empty() ? nullptr : f.world->new_group(lo, named);
  named.name = "hi";
  auto hi_group = f.world->new_group(hi, named);
  f.halves = lo_group ? lo_group : hi_group;
  f.pairs = f.world->split(me / 2, -me);
  named.name = "reversed";
  f.reversed = f.world->new_group(reversed, named);
  stats.groups_created += 5;

  const double warmup = std::max(5.0, 0.2 * opt.seconds);
  const double interval =
      opt.sample_seconds > 0 ? opt.sample_seconds : std::clamp(opt.seconds / 15, 1.0, 60.0);
  std::vector<Sample> samples;
  std::vector<Pending> in_flight;
  size_t in_flight_limit = 1;
  const Clock::time_point prewarm_start = Clock::now();
  const int prewarm_ops = prewarm(opt, seed, f, me);
  f.world->barrier()->wait();
  if (me == 0) {
    std::printf("weft-soak: pre-warm: %d operations on rank 0 at %zu bytes per buffer in %.1f s\n",
                prewarm_ops, opt.max_bytes,
                std::chrono::duration<double>(Clock::now() - prewarm_start).count());
  }
  const Clock::time_point start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  double next_sample = 0;
  int64_t step = 0;
  samples.push_back(take_sample(0, 0));

  while (true) {
    if (opt.steps >= 0 && step >= opt.steps) {
      drain(in_flight);
      break;
    }
    if (step % kFreshEvery == 0) {
      // [stop, sample], rank 0's decision.
      int64_t control[2] = {0, 0};
      if (me == 0 && step > 0) {
        const double t = elapsed();
        control[0] = opt.steps < 0 && t >= opt.seconds;
        control[1] = t >= next_sample;
        if (control[1]) next_sample = t + interval;
      }
      if (step > 0) f.world->broadcast(Tensor::of(control, 2), 0)->wait();
      if (control[0]) {
        drain(in_flight);
        break;
      }
      if (control[1]) drain(in_flight);
      destroy_fresh(opt, f, stats);
      if (control[1]) {
        samples.push_back(take_sample(elapsed(), step));
        if (me == 0) {
          const Sample& s = samples.back();
          std::printf(
              "weft-soak: t=%6.1f s step %lld: rank 0 rss %lld KiB (anon %lld, shmem %lld), "
              "%lld fds, %lld threads, %lld shm segments\n",
              s.seconds, static_cast<long long>(s.step), static_cast<long long>(s.rss_kib),
              static_cast<long long>(s.anon_kib), static_cast<long long>(s.shmem_kib),
              static_cast<long long>(s.fds), static_cast<long long>(s.threads),
              static_cast<long long>(s.shm_segments));
          std::fflush(stdout);
        }
      }
      make_fresh(f, stats, seed, step);
    }

    Rng step_rng(hash({seed, static_cast<uint64_t>(step), 0x57e9}));
    const int family = static_cast<int>(
        step_rng.weighted(std::vector<int>(std::begin(kFamilyWeights), std::end(kFamilyWeights))));
    const size_t which = step_rng.weighted([] {
      std::vector<int> w;
      for (const Choice& ch : choices()) w.push_back(ch.weight);
      return w;
    }());
    const bool async = step_rng.chance(0.5);
    std::shared_ptr<ProcessGroup> pg = member_of(f, family);
    if (!pg) {
      stats.steps_idle += 1;
      ++step;
      continue;
    }
    Ctx c = make_ctx(opt, seed, step, pg, me, stats);
    if (family == 5) c.used_recv_any = &f.fresh_used_recv_any;
    g_last_step = fmt::format("step {} on group \"{}\" (family {}), seed {}", step, pg->name(),
                              kFamilyNames[family], seed);
    Pending pending;
    choices()[which].builder(c, pending);
    if (opt.verbose && c.me == 0) {
      std::printf("step %lld %s: %s\n", static_cast<long long>(step), kFamilyNames[family],
                  c.describe().c_str());
    }
    if (async) {
      stats.async_ops += 1;
      in_flight.push_back(std::move(pending));
      if (in_flight.size() >= in_flight_limit) {
        drain(in_flight);
        in_flight_limit = 1 + step_rng.below(6);
      }
    } else {
      stats.sync_ops += 1;
      in_flight.push_back(std::move(pending));
      drain(in_flight);
    }
    ++step;
  }
  const double seconds = elapsed();
  destroy_fresh(opt, f, stats);
  samples.push_back(take_sample(seconds, step));

  // Resource verdict, per rank: every sample after the baseline within its bounds.
  std::string resource_failure;
  const Sample* base = nullptr;
  for (const Sample& s : samples) {
    if (s.seconds >= warmup) {
      base = &s;
      break;
    }
  }
  Sample peak;
  if (base) {
    const Bounds b = bounds_for(*base);
    for (const Sample& s : samples) {
      if (s.seconds < base->seconds) continue;
      peak.rss_kib = std::max(peak.rss_kib, s.rss_kib - base->rss_kib);
      peak.fds = std::max(peak.fds, s.fds - base->fds);
      peak.threads = std::max(peak.threads, s.threads - base->threads);
      peak.shm_segments = std::max(peak.shm_segments, s.shm_segments - base->shm_segments);
      if (resource_failure.empty() &&
          (s.rss_kib - base->rss_kib > b.rss_kib || s.fds - base->fds > b.fds ||
           s.threads - base->threads > b.threads ||
           s.shm_segments - base->shm_segments > b.shm_segments)) {
        resource_failure = fmt::format(
            "at t={:.1f} s (step {}): rss {} KiB (+{}, bound +{}), fds {} (+{}, bound +{}), "
            "threads {} (+{}, bound +{}), shm segments {} (+{}, bound +{}) over the baseline at "
            "t={:.1f} s",
            s.seconds, s.step, s.rss_kib, s.rss_kib - base->rss_kib, b.rss_kib, s.fds,
            s.fds - base->fds, b.fds, s.threads, s.threads - base->threads, b.threads,
            s.shm_segments, s.shm_segments - base->shm_segments, b.shm_segments, base->seconds);
      }
    }
  }
  if (!resource_failure.empty()) {
    std::fprintf(stderr, "weft-soak: rank %d: RESOURCE GROWTH %s\n", me, resource_failure.c_str());
    for (const Sample& s : samples) {
      std::fprintf(stderr,
                   "weft-soak: rank %d sample t=%.1f step %lld rss %lld KiB (anon %lld) fds %lld "
                   "threads %lld shm %lld\n",
                   me, s.seconds, static_cast<long long>(s.step), static_cast<long long>(s.rss_kib),
                   static_cast<long long>(s.anon_kib), static_cast<long long>(s.fds),
                   static_cast<long long>(s.threads), static_cast<long long>(s.shm_segments));
    }
  }

  // Totals over ranks, and every rank's samples side by side (the sample points are the same
  // steps on every rank).
  std::vector<int64_t> totals = stats.pack();
  totals.push_back(resource_failure.empty() ? 0 : 1);
  f.world->all_reduce(Tensor::of(totals.data(), totals.size()))->wait();
  const Stats sum = Stats::unpack(totals);
  const int64_t failed_ranks = totals.back();
  const size_t per = 6;
  std::vector<int64_t> mine(samples.size() * per);
  for (size_t i = 0; i < samples.size(); ++i) {
    mine[i * per + 0] = samples[i].rss_kib;
    mine[i * per + 1] = samples[i].anon_kib;
    mine[i * per + 2] = samples[i].shmem_kib;
    mine[i * per + 3] = samples[i].fds;
    mine[i * per + 4] = samples[i].threads;
    mine[i * per + 5] = samples[i].shm_segments;
  }
  std::vector<int64_t> everyone(mine.size() * world_size);
  f.world
      ->all_gather_into_tensor(Tensor::of(everyone.data(), everyone.size()),
                               Tensor::of(mine.data(), mine.size()))
      ->wait();
  std::vector<int64_t> peaks = {peak.rss_kib, peak.fds, peak.threads, peak.shm_segments};
  f.world->all_reduce(Tensor::of(peaks.data(), peaks.size()), ReduceOp::Max)->wait();

  if (me == 0) {
    std::string out;
    out += fmt::format("weft-soak: summary: {} ranks, seed {}, {:.1f} s, {} steps\n", world_size,
                       seed, seconds, step);
    out +=
        fmt::format("  collectives issued (all ranks; a rank counts each one it takes part in):\n");
    for (int k = 0; k < kNumKinds; ++k) {
      out += fmt::format("    {:<24} {:>10}\n", kKindNames[k], sum.kinds[k]);
    }
    out += "  dtypes:";
    for (DType d : kDTypes)
      out += fmt::format(" {} {}", weft::dtype_name(d), sum.dtypes[static_cast<int>(d)]);
    out += "\n  reduce ops:";
    for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
      out += fmt::format(" {} {}", weft::reduce_op_name(ReduceOp(static_cast<ReduceOp::Kind>(k))),
                         sum.ops[k]);
    }
    out += fmt::format(
        "\n  payload {:.1f} MiB (all ranks), {} elements checked, {} recv_any ({} refused), {} "
        "sync "
        "and {} "
        "async operations, {} groups made and {} destroyed (all ranks)\n"
        "  known bugs steered around: {} (recv_any pending while another member destroys the "
        "group; --no-workarounds to hit it)\n",
        sum.bytes / 1048576.0, sum.elements_checked, sum.recv_any, sum.recv_any_refused,
        sum.sync_ops, sum.async_ops, sum.groups_created, sum.groups_destroyed, sum.workarounds);
    out += fmt::format(
        "  samples (warm-up {:.0f} s), per rank: rss MiB (anon + shmem) / fds / threads / shm "
        "segments:\n",
        warmup);
    for (size_t i = 0; i < samples.size(); ++i) {
      out += fmt::format("    t={:7.1f} s step {:>8}:", samples[i].seconds, samples[i].step);
      for (int r = 0; r < world_size; ++r) {
        const int64_t* v = &everyone[(r * samples.size() + i) * per];
        out += fmt::format(" {:.0f}({:.0f}+{:.0f})/{}/{}/{}", v[0] / 1024.0, v[1] / 1024.0,
                           v[2] / 1024.0, v[3], v[4], v[5]);
      }
      out += "\n";
    }
    const bool ok = failed_ranks == 0;
    out += fmt::format(
        "  largest growth over the baseline on any rank: rss +{} KiB, fds +{}, threads +{}, "
        "shm +{}\n",
        peaks[0], peaks[1], peaks[2], peaks[3]);
    out += fmt::format("weft-soak: verdict: {} ({})\n", ok ? "PASS" : "FAIL",
                       ok ? (base ? "every result checked, no growth after warm-up"
                                  : "every result checked; run shorter than the warm-up, so "
                                    "no resource check")
                          : fmt::format("{} ranks grew past their bounds", failed_ranks));
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
    if (!opt.report.empty()) {
      std::string json = "{\n";
      json += fmt::format(
          "  \"ranks\": {},\n  \"seed\": {},\n  \"seconds\": {:.1f},\n  "
          "\"steps\": {},\n  \"max_bytes\": {},\n",
          world_size, seed, seconds, step, opt.max_bytes);
      json += "  \"collectives\": {";
      for (int k = 0; k < kNumKinds; ++k) {
        json +=
            fmt::format("{}\"{}\": {}", k ? ", " : "", json_escape(kKindNames[k]), sum.kinds[k]);
      }
      json += "},\n  \"dtypes\": {";
      bool first = true;
      for (DType d : kDTypes) {
        json += fmt::format("{}\"{}\": {}", first ? "" : ", ", weft::dtype_name(d),
                            sum.dtypes[static_cast<int>(d)]);
        first = false;
      }
      json += "},\n  \"reduce_ops\": {";
      for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
        json +=
            fmt::format("{}\"{}\": {}", k ? ", " : "",
                        weft::reduce_op_name(ReduceOp(static_cast<ReduceOp::Kind>(k))), sum.ops[k]);
      }
      json += fmt::format(
          "}},\n  \"payload_bytes\": {},\n  \"elements_checked\": {},\n  \"recv_any\": {},\n  "
          "\"groups_created\": {},\n  \"groups_destroyed\": {},\n  \"workarounds\": {},\n  "
          "\"warmup_seconds\": {:.1f},\n",
          sum.bytes, sum.elements_checked, sum.recv_any, sum.groups_created, sum.groups_destroyed,
          sum.workarounds, warmup);
      json += "  \"samples\": [\n";
      for (size_t i = 0; i < samples.size(); ++i) {
        json += fmt::format("    {{\"seconds\": {:.1f}, \"step\": {}, \"ranks\": [",
                            samples[i].seconds, samples[i].step);
        for (int r = 0; r < world_size; ++r) {
          const int64_t* v = &everyone[(r * samples.size() + i) * per];
          json += fmt::format(
              "{}{{\"rss_kib\": {}, \"anon_kib\": {}, \"shmem_kib\": {}, \"fds\": {}, "
              "\"threads\": {}, \"shm\": {}}}",
              r ? ", " : "", v[0], v[1], v[2], v[3], v[4], v[5]);
        }
        json += fmt::format("]}}{}\n", i + 1 < samples.size() ? "," : "");
      }
      json += fmt::format(
          "  ],\n  \"growth\": {{\"rss_kib\": {}, \"fds\": {}, \"threads\": {}, \"shm\": {}}},\n"
          "  \"verdict\": \"{}\"\n}}\n",
          peaks[0], peaks[1], peaks[2], peaks[3], ok ? "pass" : "fail");
      std::ofstream(opt.report) << json;
    }
  }

  for (auto* g : {&f.parity, &lo_group, &hi_group, &f.pairs, &f.reversed}) {
    if (*g) (*g)->destroy();
  }
  f.world->barrier()->wait();
  f.world->destroy();
  return failed_ranks == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line, so that a rank stopped by the launcher has said everything up to that point.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Options opt = parse_options(argc, argv);
  try {
    return run(opt);
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "weft-soak: weft::Error (%s) after %s (replay with that --seed): %s\n",
                 std::string(weft::error_code_name(e.code())).c_str(), g_last_step.c_str(),
                 e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-soak: exception after %s: %s\n", g_last_step.c_str(), e.what());
  }
  std::fflush(stderr);
  return 2;
}
