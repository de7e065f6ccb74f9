// The conformance suite every backend must pass: each collective of ProcessGroup, over every dtype
// and reduce op it takes, in and out of place, in every list/tensor/uneven form, on 1 to 8 real
// processes, with every algorithm the tcp backend can be forced to use and with shared memory off
// and on, checked element by element against a reference computed here from a closed form
// f(rank, i), never with weft's reduce code.
//
// WEFT_TEST_BACKEND names the backend under test (default "tcp"; another backend runs one
// variant, its defaults). WEFT_TEST_FULL=1 runs the whole cross product on the small counts:
// world sizes 6 and 7 too, more counts, and every form, root and placement for every combination
// (minutes, not seconds). WEFT_TEST_WORLD_SIZES=3,8 runs only the sizes listed.
//
// WEFT_TEST_SYMMETRIC=1 (weft-conformance --symmetric) places every tensor in a symmetric buffer
// (weft/symmetric_buffer.h) of the group that runs the collective, on the tcp backend with shared
// memory only: the collectives with a zero-copy path take it (docs/symmetric-memory.md), the others
// take the message path with tensors in symmetric memory; the checks are the same. Each variant
// allocates one buffer (its Arena) when it is made; a check's tensors are cut from it by a bump
// allocator that starts again from the beginning once all of the previous check's buffers are gone,
// so that every rank places the same check's tensors at the same offsets. Tensors start one
// element past a 64-byte line: off the 8-byte grid for elements under 8 bytes, element-aligned
// always (the reduce kernels, like C++, need element alignment).
//
// WEFT_TEST_DEVICE=cuda puts every tensor the suite passes in CUDA device memory on device
// (local rank % device count), allocated through libweft's CUDA runtime loader: each Buffer keeps a
// host image that the checks fill and read as always, copied to the device before the buffer's
// tensor is handed to a collective and back before the first read after it (Buffer, DeviceImage).
// Run on the nccl backend (world size 1 on one GPU) or on tcp staging CUDA tensors through pinned
// host memory. Where there is no usable device the whole executable says so and exits 77 (meson's
// "skipped"). WEFT_TEST_DEVICE=fake runs the same plumbing on ordinary memory passed as host
// tensors, so that a machine without a GPU checks the copies in and out against a real backend.
//
// WEFT_TEST_UNSUPPORTED=report (weft-conformance --unsupported=report) turns an Error(Unsupported)
// from the backend into a note instead of a failure: the test case stops at that world size, the
// note (world size and the error's text) goes to conformance_report.h's list, which
// weft-conformance prints as a table, and the case passes unless something else failed.
//
// WEFT_TEST_LAUNCHER=env runs the suite under an outside launcher instead of forking its ranks:
// every process is one rank (`mpirun -n 4 -x WEFT_TEST_LAUNCHER=env conformance_test`, for a
// backend whose ranks must be MPI's), rank and world size come from the launcher's environment
// (env://, docs/launching.md), each test case runs its body once for that world size only, and
// each rank fails its own Catch2 run: the launcher's exit status tells. weft reads WEFT_DEBUG
// once per process, so the [debug] family runs only with WEFT_DEBUG=detail set for the whole run
// (and is skipped with a warning otherwise).
//
// Cost: each test case starts one world per world size and makes, over all of its ranks, one
// sub-group per (algorithm, shm) variant. Every (dtype, op, count) runs on every algorithm that
// implements the collective, over both transports; the form, root and placement turn with the
// combination, so that each meets every dtype and op without the product of all of them. The
// 1 MiB+ count runs for float32 sum on every variant and for one or two other combinations per
// collective. So the suite takes seconds on two cores running eight ranks, and stays within its
// timeout under the sanitizers. The reference is the costly part (each rank recomputes every
// rank's inputs), not weft.
//
// Values are chosen so that every result is exact whatever order an algorithm reduces in: small
// multiples of 1/2 for floating sums (exact in float16 and bfloat16 too; fp8, which holds integers
// exactly only up to 16 (e4m3fn) or 8 (e5m2), sums integers in [-2, 2] or [-1, 1], and its
// premul_sum inputs are zero on all but two ranks), powers of two for products, and full-range bits
// for integers (whose sums and products wrap, which the reference computes modulo 2^bits; avg
// truncates toward zero). Min and max also meet NaN, both signed zeros and infinities, and bool
// inputs use non-canonical true bytes (2, 0x80, 0xff), all as runtime/reduce.h specifies. Outputs
// start as sentinel bits, and scattered lists have a gap after each block, so that a write out of
// place shows. A wrong element is reported with rank, collective, dtype, op, count, algorithm, shm,
// index, the value got and the value expected (and every rank's input for reductions), and the rank
// goes on, so one run lists every failing combination.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/ranges.h>

#include "weft/process_group.h"
#include "weft/rendezvous.h"
#include "weft/symmetric_buffer.h"
#include "weft/tcp_store.h"

#include "runtime/cuda_runtime.h"
#include "tests/conformance/conformance_report.h"
#include "tests/support/cuda_device.h"
#include "tests/support/fake_cuda.h"
#include "tests/support/multiproc.h"

namespace weft {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// ---- What runs.

std::string backend_under_test() {
  const char* value = std::getenv("WEFT_TEST_BACKEND");
  return value && *value ? value : "tcp";
}

bool report_unsupported() {
  const char* value = std::getenv("WEFT_TEST_UNSUPPORTED");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "fail") return false;
  if (std::string_view(value) == "report") return true;
  throw std::invalid_argument(
      fmt::format("WEFT_TEST_UNSUPPORTED=\"{}\": expected fail (the default) or report", value));
}

// How a rank that met Error(Unsupported) under report_unsupported() says so on its stderr.
constexpr std::string_view kUnsupportedMarker = "conformance: unsupported: ";

// The first unsupported report among the ranks' outputs ("" when none): the rest of its line.
std::string unsupported_in(const std::string& output) {
  const size_t at = output.find(kUnsupportedMarker);
  if (at == std::string::npos) return "";
  const size_t from = at + kUnsupportedMarker.size();
  return output.substr(from, output.find('\n', from) - from);
}

bool symmetric_mode() {
  const char* value = std::getenv("WEFT_TEST_SYMMETRIC");
  return value && std::string_view(value) == "1";
}

// ---- Device mode (WEFT_TEST_DEVICE).

enum class DeviceMode { Host, Cuda, Fake };

DeviceMode device_mode() {
  static const DeviceMode mode = [] {
    const char* value = std::getenv("WEFT_TEST_DEVICE");
    if (value == nullptr || *value == '\0' || std::string_view(value) == "cpu") {
      return DeviceMode::Host;
    }
    // staged: CUDA tensors against tests/support/fake_cuda.h's stand-in runtime (installed
    // below), so the host backend's staging of CUDA tensors runs the whole suite without a GPU.
    if (std::string_view(value) == "cuda" || std::string_view(value) == "staged") {
      return DeviceMode::Cuda;
    }
    if (std::string_view(value) == "fake") return DeviceMode::Fake;
    throw std::invalid_argument(fmt::format(
        "WEFT_TEST_DEVICE=\"{}\": expected cpu (the default), cuda, staged or fake", value));
  }();
  return mode;
}

// Under WEFT_TEST_DEVICE=cuda on a machine with no usable CUDA device nothing here can run: the
// executable says why and exits 77 (meson's "skipped") before any test case starts.
const bool kDeviceChecked = [] {
  const char* value = std::getenv("WEFT_TEST_DEVICE");
  if (value != nullptr && std::string_view(value) == "cuda") {
    test::cuda_devices_or_skip("WEFT_TEST_DEVICE=cuda");
  }
  if (value != nullptr && std::string_view(value) == "staged") {
    static test::FakeCuda fake;  // inherited by every forked rank
    set_cuda_runtime_for_testing(&fake);
  }
  return true;
}();

// The CUDA device this rank's tensors lie on under WEFT_TEST_DEVICE=cuda: its local rank modulo
// the device count, chosen when the rank starts (choose_device). -1 before.
int g_cuda_device = -1;

void choose_device(int local_rank) {
  if (device_mode() == DeviceMode::Cuda) g_cuda_device = test::use_cuda_device_for(local_rank);
}

// Memory on the suite's device for one Buffer (its host image's twin), and the copies between
// them. Fake mode: ordinary memory, passed to the backend as host tensors.
class DeviceImage {
 public:
  explicit DeviceImage(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    if (device_mode() == DeviceMode::Cuda) {
      memory_ = cuda_runtime().device_alloc(g_cuda_device, bytes_);
    } else {
      memory_ = ::operator new(bytes_);
    }
  }
  ~DeviceImage() {
    if (memory_ == nullptr) return;
    if (device_mode() == DeviceMode::Cuda) {
      cuda_runtime().device_free(memory_);
    } else {
      ::operator delete(memory_);
    }
  }
  DeviceImage(const DeviceImage&) = delete;
  DeviceImage& operator=(const DeviceImage&) = delete;

  void* data() const { return memory_; }
  Device device() const {
    return device_mode() == DeviceMode::Cuda ? Device::cuda(g_cuda_device) : Device::cpu();
  }
  // Synchronous copies on the legacy default stream: after whatever a Work's wait() ordered
  // that stream behind, before the collective issued next (which waits for that stream).
  void copy_in(const void* host) const {
    if (bytes_ == 0) return;
    if (device_mode() == DeviceMode::Cuda) {
      cuda_runtime().copy(memory_, host, bytes_);
    } else {
      std::memcpy(memory_, host, bytes_);
    }
  }
  void copy_out(void* host) const {
    if (bytes_ == 0) return;
    if (device_mode() == DeviceMode::Cuda) {
      cuda_runtime().copy(host, memory_, bytes_);
    } else {
      std::memcpy(host, memory_, bytes_);
    }
  }

 private:
  size_t bytes_;
  void* memory_ = nullptr;
};

// Where a tensor the suite makes without a Buffer (null data, zero elements) says it lies.
Device suite_device() {
  return device_mode() == DeviceMode::Cuda ? Device::cuda(g_cuda_device) : Device::cpu();
}

bool full_run() {
  const char* value = std::getenv("WEFT_TEST_FULL");
  return value && std::string(value) == "1";
}

// Whether an outside launcher started this process as one rank (WEFT_TEST_LAUNCHER=env), rather
// than the suite forking every rank itself (unset, or "fork").
bool launched() {
  const char* value = std::getenv("WEFT_TEST_LAUNCHER");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "fork") return false;
  if (std::string_view(value) == "env") return true;
  throw std::invalid_argument(
      fmt::format("WEFT_TEST_LAUNCHER=\"{}\": expected fork (the default) or env", value));
}

// The launcher's world, met once per process through env://: this process's rank, the world
// size and the launcher's store. Never destroyed: rank 0 hosts the store, which the other ranks
// use until their last test case.
struct Launch {
  Rendezvous rdzv;
  uint64_t worlds = 0;  // worlds started so far: the same count on every rank
};

Launch& launch() {
  static Launch* instance = [] {
    RendezvousOptions options;
    options.timeout = seconds(60);
    return new Launch{rendezvous(options)};
  }();
  return *instance;
}

std::vector<int> world_sizes() {
  if (launched()) return {launch().rdzv.world_size};
  if (const char* only = std::getenv("WEFT_TEST_WORLD_SIZES"); only && *only) {
    std::vector<int> sizes;
    for (const char* p = only; *p;) {
      char* end = nullptr;
      const long size = std::strtol(p, &end, 10);
      if (end == p || size < 1 || size > 64) {
        throw std::invalid_argument(
            fmt::format("WEFT_TEST_WORLD_SIZES=\"{}\": expected sizes "
                        "1..64 separated by commas",
                        only));
      }
      sizes.push_back(static_cast<int>(size));
      p = *end == ',' ? end + 1 : end;
    }
    return sizes;
  }
  if (full_run()) return {1, 2, 3, 4, 5, 6, 7, 8};
  return {1, 2, 3, 4, 5, 8};
}

// The sizes of `sizes` (a test case's own list) that WEFT_TEST_WORLD_SIZES lets run: all of them
// when it is unset or under a launcher (run_world skips the others there), else those it lists
// (conformance_nccl_* run world size 1 only: NCCL refuses two ranks on one GPU).
std::vector<int> world_sizes_among(const std::vector<int>& sizes) {
  const char* only = std::getenv("WEFT_TEST_WORLD_SIZES");
  if (launched() || only == nullptr || *only == '\0') return sizes;
  const std::vector<int> listed = world_sizes();
  std::vector<int> kept;
  for (int size : sizes) {
    if (std::find(listed.begin(), listed.end(), size) != listed.end()) kept.push_back(size);
  }
  return kept;
}

// Element counts for the cross products: empty, one element (fewer than ranks, so most chunks
// are empty), and odd primes that never divide into ranks or chunks evenly.
std::vector<size_t> small_counts() {
  if (full_run()) return {0, 1, 2, 7, 64, 1031, 4099};
  return {0, 1, 7, 1031};
}

// Past 1 MiB for any dtype, so that the algorithms cut it into many chunks and segments, and a
// few elements more, so that the last segment is a partial one.
size_t large_count(DType dtype) { return (size_t{1} << 20) / dtype_size(dtype) + 13; }

// The ops in the order reduce_op.h declares them; PremulSum's factor is exact in every floating
// dtype and turns the half-integer inputs into multiples of 1/4.
std::vector<ReduceOp> all_ops() {
  return {ReduceOp::Sum,  ReduceOp::Prod, ReduceOp::Min,
          ReduceOp::Max,  ReduceOp::Avg,  ReduceOp::premul_sum(-1.5),
          ReduceOp::BAnd, ReduceOp::BOr,  ReduceOp::BXor};
}

bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor;
}

// runtime/reduce.h's table, restated: bitwise ops need integers or bool, avg has no boolean
// meaning, premul_sum is for floating dtypes only.
bool op_defined(DType dtype, ReduceOp op) {
  if (is_bitwise(op)) return !is_floating(dtype);
  if (op == ReduceOp::Avg) return dtype != DType::Bool;
  if (op == ReduceOp::PremulSum) return is_floating(dtype);
  return true;
}

// The algorithm names the tcp backend takes as its "algo" setting (collectives/planner.h).
// halving_doubling is newer than the others: a build whose planner does not know it yet skips it
// (run_world), so that the suite runs it wherever it exists.
const std::vector<std::string> kAllAlgorithms = {"auto",     "ring",          "recursive_doubling",
                                                 "bruck",    "tree",          "linear",
                                                 "pairwise", "dissemination", "halving_doubling"};
const std::string kOptionalAlgorithm = "halving_doubling";

// The reference is arithmetic on the test's own constants, run on one thread: under
// ThreadSanitizer it is left uninstrumented, or checking it would be most of the suite's time
// there, for nothing TSan could find. (The buffers weft writes are read with instrumented code.)
#if defined(__SANITIZE_THREAD__)
#define REFERENCE __attribute__((no_sanitize("thread")))
#else
#define REFERENCE
#endif

// ---- Elements as bits.
//
// An element is handled as the uint64_t holding its bytes (the low dtype_size bytes), so that
// every comparison is bit for bit, signed zeros and NaN payloads included.

REFERENCE uint64_t width_mask(DType dtype) {
  const size_t bits = 8 * dtype_size(dtype);
  return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}

// Bits of the binary format with `mantissa` stored significand bits and exponent bias `bias`
// (float16: 10, 15; bfloat16: 7, 127) nearest to `value`, ties to even.
REFERENCE uint64_t narrow_float_bits(double value, int mantissa, int bias) {
  const uint64_t sign = std::signbit(value) ? 0x8000 : 0;  // both formats are 16 bits wide
  const uint64_t exponent_ones = static_cast<uint64_t>(2 * bias + 1);
  const double magnitude = std::fabs(value);
  if (std::isnan(value)) return (exponent_ones << mantissa) | (uint64_t{1} << (mantissa - 1));
  if (std::isinf(value)) return sign | (exponent_ones << mantissa);
  if (magnitude == 0) return sign;
  int e = 0;
  std::frexp(magnitude, &e);  // magnitude = m * 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  int exponent = std::max(e - 1, 1 - bias);  // below 1 - bias: a denormal, fixed scale
  // nearbyint rounds to nearest even in the default rounding mode.
  auto significand =
      static_cast<uint64_t>(std::nearbyint(std::ldexp(magnitude, mantissa - exponent)));
  if (significand >= (uint64_t{2} << mantissa)) {
    significand >>= 1;  // rounded up to the next power of two: exact, so no second rounding
    ++exponent;
  }
  if (exponent > bias) return sign | (exponent_ones << mantissa);          // overflow: infinity
  if (significand < (uint64_t{1} << mantissa)) return sign | significand;  // denormal
  return sign | (static_cast<uint64_t>(exponent + bias) << mantissa) |
         (significand - (uint64_t{1} << mantissa));
}

REFERENCE double narrow_float_value(uint64_t bits, int mantissa, int bias) {
  const bool negative = (bits >> 15) & 1;
  const uint64_t exponent_ones = static_cast<uint64_t>(2 * bias + 1);
  const uint64_t exponent = (bits >> mantissa) & exponent_ones;
  const uint64_t fraction = bits & ((uint64_t{1} << mantissa) - 1);
  double magnitude;
  if (exponent == exponent_ones) {
    magnitude = fraction ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(fraction), 1 - bias - mantissa);
  } else {
    magnitude = std::ldexp(static_cast<double>(fraction + (uint64_t{1} << mantissa)),
                           static_cast<int>(exponent) - bias - mantissa);
  }
  return negative ? -magnitude : magnitude;
}

// fp8 (one byte, sign in bit 7) nearest to `value`, ties to even, with PyTorch's rules past the
// range (weft/half.h): e4m3fn (3 significand bits, bias 7, the all-ones exponent holding numbers,
// S.1111.111 the only NaN) turns infinities and whatever rounds onto or past the NaN pattern into
// NaN; e5m2 (2 bits, bias 15) is IEEE-like, overflowing to infinity.
REFERENCE uint64_t fp8_bits(double value, bool e4m3) {
  const int mantissa = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const uint64_t sign = std::signbit(value) ? 0x80 : 0;
  const uint64_t infinity = e4m3 ? 0x7f : 0x7c;  // e4m3fn has none: NaN stands in
  if (std::isnan(value)) return sign | 0x7f;
  if (std::isinf(value)) return sign | infinity;
  const double magnitude = std::fabs(value);
  if (magnitude == 0) return sign;
  int e = 0;
  std::frexp(magnitude, &e);
  int exponent = std::max(e - 1, 1 - bias);
  auto significand =
      static_cast<uint64_t>(std::nearbyint(std::ldexp(magnitude, mantissa - exponent)));
  if (significand >= (uint64_t{2} << mantissa)) {
    significand >>= 1;
    ++exponent;
  }
  if (significand < (uint64_t{1} << mantissa)) return sign | significand;  // denormal
  const int max_exponent = e4m3 ? bias + 1 : bias;  // e4m3fn: exponent field 15 is a number
  if (exponent > max_exponent) return sign | infinity;
  const uint64_t code = (static_cast<uint64_t>(exponent + bias) << mantissa) |
                        (significand - (uint64_t{1} << mantissa));
  return sign | std::min<uint64_t>(code, e4m3 ? 0x7f : 0x7c);
}

REFERENCE double fp8_value(uint64_t bits, bool e4m3) {
  const int mantissa = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const bool negative = (bits >> 7) & 1;
  const uint64_t exponent = (bits & 0x7f) >> mantissa;
  const uint64_t fraction = bits & ((uint64_t{1} << mantissa) - 1);
  double magnitude;
  if (e4m3 ? (bits & 0x7f) == 0x7f : exponent == 31) {
    magnitude = e4m3 || fraction ? std::numeric_limits<double>::quiet_NaN()
                                 : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(fraction), 1 - bias - mantissa);
  } else {
    magnitude = std::ldexp(static_cast<double>(fraction + (uint64_t{1} << mantissa)),
                           static_cast<int>(exponent) - bias - mantissa);
  }
  return negative ? -magnitude : magnitude;
}

// Bits of the `dtype` value nearest to `value` (ties to even). REQUIRES: is_floating(dtype).
REFERENCE uint64_t float_bits(DType dtype, double value) {
  switch (dtype) {
    case DType::Float32:
      return std::bit_cast<uint32_t>(static_cast<float>(value));
    case DType::Float64:
      return std::bit_cast<uint64_t>(value);
    case DType::Float16:
    case DType::BFloat16: {
      // The common case first, cheaply: a value that float holds exactly and whose dropped
      // significand bits are zero is exact in 16 bits too, and its bits are float's, moved.
      const float narrow = static_cast<float>(value);
      const uint32_t f = std::bit_cast<uint32_t>(narrow);
      if (static_cast<double>(narrow) == value || std::isnan(value)) {
        if (dtype == DType::BFloat16 && (f & 0xffff) == 0) return f >> 16;
        const uint32_t exponent = (f >> 23) & 0xff;
        if (dtype == DType::Float16 && (f & 0x1fff) == 0 && exponent >= 113 && exponent <= 142) {
          return ((f >> 16) & 0x8000) | ((exponent - 112) << 10) | ((f >> 13) & 0x3ff);
        }
      }
      return dtype == DType::Float16 ? narrow_float_bits(value, 10, 15)
                                     : narrow_float_bits(value, 7, 127);
    }
    case DType::Float8E4M3:
    case DType::Float8E5M2:
      return fp8_bits(value, dtype == DType::Float8E4M3);
    default:
      throw std::logic_error("float_bits: not a floating dtype");
  }
}

REFERENCE double float_value(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::Float32:
      return std::bit_cast<float>(static_cast<uint32_t>(bits));
    case DType::Float64:
      return std::bit_cast<double>(bits);
    case DType::Float16:
      return narrow_float_value(bits, 10, 15);
    case DType::BFloat16:
      return narrow_float_value(bits, 7, 127);
    case DType::Float8E4M3:
    case DType::Float8E5M2:
      return fp8_value(bits, dtype == DType::Float8E4M3);
    default:
      throw std::logic_error("float_value: not a floating dtype");
  }
}

REFERENCE bool is_signed_integer(DType dtype) {
  return dtype == DType::Int8 || dtype == DType::Int32 || dtype == DType::Int64;
}

// The integer the bits hold: sign-extended for signed dtypes, zero-extended for the unsigned
// ones and bool (uint64 above 2^63 comes out negative: compare and divide those as uint64_t).
REFERENCE int64_t int_value(DType dtype, uint64_t bits) {
  bits &= width_mask(dtype);
  const size_t width = 8 * dtype_size(dtype);
  if (is_signed_integer(dtype) && width < 64 && (bits >> (width - 1)) & 1) {
    bits |= ~width_mask(dtype);
  }
  return static_cast<int64_t>(bits);
}

REFERENCE int64_t int_min(DType dtype) {
  return is_signed_integer(dtype) ? int_value(dtype, (width_mask(dtype) >> 1) ^ width_mask(dtype))
                                  : 0;
}
REFERENCE int64_t int_max(DType dtype) {
  return is_signed_integer(dtype) ? static_cast<int64_t>(width_mask(dtype) >> 1)
                                  : static_cast<int64_t>(width_mask(dtype));
}

std::string show(DType dtype, uint64_t bits) {
  const int digits = static_cast<int>(2 * dtype_size(dtype));
  if (is_floating(dtype))
    return fmt::format("{} (0x{:0{}x})", float_value(dtype, bits), bits, digits);
  if (dtype == DType::Bool) return fmt::format("0x{:02x}", bits);
  if (dtype == DType::UInt64) return fmt::format("{}", bits);
  return fmt::format("{}", int_value(dtype, bits));
}

// Bit for bit, except that any NaN matches an expected NaN (reduce.h fixes NaN-ness, not the
// payload an algorithm's operand order leaves).
bool same(DType dtype, uint64_t got, uint64_t expected) {
  if (got == expected) return true;
  if (is_floating(dtype) && std::isnan(float_value(dtype, expected))) {
    return std::isnan(float_value(dtype, got));
  }
  return false;
}

// ---- Inputs and references.

REFERENCE uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

REFERENCE uint64_t hash(uint64_t salt, uint64_t a, uint64_t b, uint64_t c = 0) {
  return mix(mix(salt + a * 0x9e3779b97f4a7c15ULL + c * 0xc2b2ae3d27d4eb4fULL) + b);
}

// Distinct, arbitrary bits for the collectives that only move data: element `index` of the
// piece that `from` sends (to `to`, where it matters).
REFERENCE uint64_t pattern(DType dtype, uint64_t salt, uint64_t from, uint64_t index,
                           uint64_t to = 0) {
  return hash(salt, from, index, to + 1) & width_mask(dtype);
}

// What an output holds before a collective: bits no correct result has by accident.
REFERENCE uint64_t sentinel(DType dtype, uint64_t salt, size_t index) {
  return hash(salt ^ 0x5e471e1ULL, index, 77) & width_mask(dtype);
}

// Rank r's element i for one (dtype, op, ranks) and the reduction of element i over all ranks,
// computed from the op's meaning in runtime/reduce.h.
class Reduction {
 public:
  Reduction(DType dtype, ReduceOp op, int ranks, uint64_t salt)
      : dtype_(dtype), op_(op), ranks_(ranks) {
    for (int r = 0; r < ranks; ++r) seeds_.push_back(hash(salt, r, 0));
  }

  REFERENCE uint64_t input(int rank, size_t i) const {
    if (is_floating(dtype_)) return float_bits(dtype_, float_input(rank, i));
    if (dtype_ == DType::Bool) return bool_input(rank, i);
    return static_cast<uint64_t>(int_input(rank, i)) & width_mask(dtype_);
  }

  REFERENCE uint64_t expected(size_t i) const {
    if (is_floating(dtype_)) return float_expected(i);
    if (dtype_ == DType::Bool) return bool_expected(i);
    return int_expected(i);
  }

  // Every rank's input at element i, for failure messages.
  std::string inputs(size_t i) const {
    std::vector<std::string> all;
    for (int r = 0; r < ranks_; ++r) all.push_back(show(dtype_, input(r, i)));
    return fmt::format("inputs by rank [{}]", fmt::join(all, ", "));
  }

 private:
  // Rank r's random bits for element i.
  REFERENCE uint64_t bits(int rank, size_t i) const { return mix(seeds_[rank] + i); }

  REFERENCE double float_input(int rank, size_t i) const {
    const uint64_t h = bits(rank, i);
    switch (op_.kind) {
      case ReduceOp::Prod: {
        // Products of these are +-2^k with |k| <= 8: exact in every floating dtype.
        static constexpr double kFactors[] = {1.0, -1.0, 2.0, 0.5, -2.0, 1.0, -0.5};
        return kFactors[h % 7];
      }
      case ReduceOp::Min:
      case ReduceOp::Max:
        switch (i % 17) {
          case 3:  // one rank's NaN wins
            return rank == static_cast<int>((i / 17) % ranks_)
                       ? std::numeric_limits<double>::quiet_NaN()
                       : 1.0;
          case 8:  // -0 orders below +0
            return (h & 1) ? -0.0 : 0.0;
          case 12: {
            // e4m3fn has no infinity (one would become NaN): its extremes are +-448.
            const double extreme =
                dtype_ == DType::Float8E4M3 ? 448.0 : std::numeric_limits<double>::infinity();
            return (h & 1) ? extreme : -extreme;
          }
          default:  // rounded to the dtype by input(), as the min/max of them is
            return static_cast<double>(static_cast<int64_t>(h % 41) - 20) * 0.25;
        }
      default:  // Sum, Avg, PremulSum: |sum| <= 16 (24 with the factor) in steps of 1/4
        if (i % 17 == 8) return -0.0;  // an IEEE sum of -0s is -0
        if (is_fp8()) return fp8_sum_input(rank, i, h);
        return static_cast<double>(static_cast<int64_t>(h % 9) - 4) * 0.5;
    }
  }

  REFERENCE bool is_fp8() const {
    return dtype_ == DType::Float8E4M3 || dtype_ == DType::Float8E5M2;
  }

  // fp8's sum inputs, such that every partial sum over up to 8 ranks is exact, in any order:
  // integers in [-2, 2] for e4m3fn (|sum| <= 16) and [-1, 1] for e5m2 (|sum| <= 8). PremulSum
  // scales by -1.5 first, which no longer leaves every partial sum exact, so there the inputs are
  // in [-1, 1] on two ranks (i % ranks and the one after it) and 0 elsewhere: the sums are 0,
  // +-1.5 and +-3. Factors like 0.1 meet only two ranks (see the all_reduce test case).
  REFERENCE double fp8_sum_input(int rank, size_t i, uint64_t h) const {
    const auto small = [&](int64_t limit) {
      return static_cast<double>(static_cast<int64_t>(h % static_cast<uint64_t>(2 * limit + 1)) -
                                 limit);
    };
    if (op_ == ReduceOp::PremulSum) {
      const int first = static_cast<int>(i % static_cast<size_t>(ranks_));
      const bool chosen = rank == first || rank == (first + 1) % ranks_;
      return chosen ? small(1) : 0.0;
    }
    return small(dtype_ == DType::Float8E4M3 ? 2 : 1);
  }

  REFERENCE int64_t int_input(int rank, size_t i) const {
    const uint64_t h = bits(rank, i);
    if (op_ == ReduceOp::Min || op_ == ReduceOp::Max) {
      if (i % 17 == 3) return int_min(dtype_);
      if (i % 17 == 12) return int_max(dtype_);
    }
    return int_value(dtype_, h);  // the full range: sums and products wrap
  }

  // And-like ops see mostly true, or-like ops mostly false, so that both outcomes occur. True is
  // any non-zero byte; with one rank nothing is combined, so the byte would come back as given.
  REFERENCE bool truth(int rank, size_t i) const {
    const uint64_t h = bits(rank, i);
    switch (op_.kind) {
      case ReduceOp::Prod:
      case ReduceOp::Min:
      case ReduceOp::BAnd:
        return h % static_cast<uint64_t>(ranks_ + 1) != 0;
      case ReduceOp::Sum:
      case ReduceOp::Max:
      case ReduceOp::BOr:
        return h % static_cast<uint64_t>(ranks_ + 1) == 0;
      default:
        return h & 1;
    }
  }
  // PremulSum's first step for one input: the factor rounded to the dtype's arithmetic type
  // (float, or double for float64), one multiplication in it, the product stored in the dtype.
  // Exact for factors like -1.5 on the inputs above; for others (0.1) the sum of the products is
  // still exact in double, and so rounded once, with two ranks.
  REFERENCE double premultiplied(double x) const {
    if (dtype_ == DType::Float64) return x * op_.factor;
    const float product = static_cast<float>(x) * static_cast<float>(op_.factor);
    return float_value(dtype_, float_bits(dtype_, product));
  }

  REFERENCE uint64_t bool_input(int rank, size_t i) const {
    static constexpr uint64_t kTrueBytes[] = {1, 2, 0x80, 0xff};
    if (!truth(rank, i)) return 0;
    return ranks_ == 1 ? 1 : kTrueBytes[(bits(rank, i) >> 40) % 4];
  }

  REFERENCE uint64_t float_expected(size_t i) const {
    double acc = 0;
    for (int r = 0; r < ranks_; ++r) {
      double x = float_input(r, i);
      if (op_ == ReduceOp::PremulSum) x = premultiplied(x);
      if (r == 0) {
        acc = x;
        continue;
      }
      switch (op_.kind) {
        case ReduceOp::Prod:
          acc *= x;
          break;
        case ReduceOp::Min:
        case ReduceOp::Max: {
          if (std::isnan(acc) || std::isnan(x)) {
            acc = std::numeric_limits<double>::quiet_NaN();
          } else if (acc == x) {  // equal, or +0 against -0: -0 is the smaller
            const bool take_negative = op_ == ReduceOp::Min;
            if (std::signbit(x) == take_negative) acc = x;
          } else if ((x < acc) == (op_ == ReduceOp::Min)) {
            acc = x;
          }
          break;
        }
        default:  // exact: every partial sum is representable
          acc += x;
      }
    }
    if (op_ == ReduceOp::Avg) {
      // One IEEE division of the exact sum, rounded once to the dtype.
      if (dtype_ == DType::Float32) {
        return std::bit_cast<uint32_t>(static_cast<float>(acc) / static_cast<float>(ranks_));
      }
      return float_bits(dtype_, acc / ranks_);
    }
    return float_bits(dtype_, acc);
  }

  REFERENCE uint64_t int_expected(size_t i) const {
    uint64_t acc = 0;  // wraps modulo 2^64, then is cut to the dtype's width
    int64_t extreme = 0;
    for (int r = 0; r < ranks_; ++r) {
      const int64_t x = int_input(r, i);
      const auto bits = static_cast<uint64_t>(x);
      if (r == 0) {
        acc = bits;
        extreme = x;
        continue;
      }
      switch (op_.kind) {
        case ReduceOp::Prod:
          acc *= bits;
          break;
        case ReduceOp::Min:
          extreme = dtype_ == DType::UInt64
                        ? static_cast<int64_t>(std::min(static_cast<uint64_t>(extreme), bits))
                        : std::min(extreme, x);
          break;
        case ReduceOp::Max:
          extreme = dtype_ == DType::UInt64
                        ? static_cast<int64_t>(std::max(static_cast<uint64_t>(extreme), bits))
                        : std::max(extreme, x);
          break;
        case ReduceOp::BAnd:
          acc &= bits;
          break;
        case ReduceOp::BOr:
          acc |= bits;
          break;
        case ReduceOp::BXor:
          acc ^= bits;
          break;
        default:
          acc += bits;
      }
    }
    if (op_ == ReduceOp::Min || op_ == ReduceOp::Max) acc = static_cast<uint64_t>(extreme);
    if (op_ == ReduceOp::Avg) {
      // The wrapped sum, read in the dtype, divided truncating toward zero (C++'s division).
      acc = dtype_ == DType::UInt64 ? acc / static_cast<uint64_t>(ranks_)
                                    : static_cast<uint64_t>(int_value(dtype_, acc) / ranks_);
    }
    return acc & width_mask(dtype_);
  }

  REFERENCE uint64_t bool_expected(size_t i) const {
    bool acc = truth(0, i);
    for (int r = 1; r < ranks_; ++r) {
      const bool x = truth(r, i);
      switch (op_.kind) {
        case ReduceOp::Prod:
        case ReduceOp::Min:
        case ReduceOp::BAnd:
          acc = acc && x;
          break;
        case ReduceOp::BXor:
          acc = acc != x;
          break;
        default:  // sum, max, bor
          acc = acc || x;
      }
    }
    if (ranks_ == 1) return bool_input(0, i);
    return acc ? 1 : 0;
  }

  DType dtype_;
  ReduceOp op_;
  int ranks_;
  std::vector<uint64_t> seeds_;  // per rank
};

// ---- Buffers and checks.

// Under symmetric_mode(): one symmetric buffer of a variant's group, cut into a check's tensors.
// Every rank makes the same checks in the same order, and a check's buffers are all gone before
// the next check makes its first one, so restarting at offset 0 whenever none is live gives every
// rank the same offsets for the same check. Where ranks need different sizes for one check (the
// uneven forms, a root's list), the caller reserves a bound that is the same on every rank, so
// that the offsets after it do not depend on the rank either.
//
// Thread safety: none; the test body's thread only. Ownership: Buffers cut from it must die
// before it (Variant holds it; a check's buffers live within the check).
class Arena {
 public:
  explicit Arena(std::shared_ptr<SymmetricBuffer> buffer) : buffer_(std::move(buffer)) {}

  // Room for `at_most` >= `count` elements of `dtype`: the first of them one element past a
  // 64-byte line. Throws when the buffer is too small (a test bug: kArenaBytes).
  unsigned char* take(DType dtype, size_t count, size_t at_most) {
    const size_t element = dtype_size(dtype);
    const size_t offset = (next_ + 63) / 64 * 64 + element;
    const size_t end = offset + std::max(count, at_most) * element;
    if (end > buffer_->size()) {
      throw std::logic_error(
          fmt::format("conformance arena of {} bytes too small: {} needed", buffer_->size(), end));
    }
    next_ = end;
    ++live_;
    return static_cast<unsigned char*>(buffer_->data()) + offset;
  }

  void give_back() {
    if (--live_ == 0) next_ = 0;
  }

  const SymmetricBuffer& buffer() const { return *buffer_; }

 private:
  std::shared_ptr<SymmetricBuffer> buffer_;
  size_t next_ = 0;  // bytes taken since the arena was last empty
  size_t live_ = 0;  // buffers cut from it and not yet destroyed
};

// Bytes per rank of a variant's arena: the largest check's tensors, live at once, with room to
// spare (all_gather of large_count() floats on 8 ranks is 8 MiB of output plus 1 MiB of input;
// two async batches of large_count() / 16 are about 12 MiB).
constexpr size_t kArenaBytes = size_t{24} << 20;

// Host memory for `count` elements of `dtype`, read and written as bits.
class Buffer {
 public:
  // The memory starts uninitialised: every check fills what it passes. operator new aligns it
  // for every dtype. With an arena (symmetric_mode()), the memory is cut from it, reserving
  // room for `at_most` elements (the same on every rank: see Arena).
  // Under WEFT_TEST_DEVICE, the memory is the host image of a DeviceImage (see sync()).
  Buffer(DType dtype, size_t count) : Buffer(nullptr, dtype, count) {}
  Buffer(Arena* arena, DType dtype, size_t count, size_t at_most = 0)
      : dtype_(dtype),
        count_(count),
        storage_(arena       ? arena->take(dtype, count, at_most)
                 : count > 0 ? new unsigned char[count * dtype_size(dtype)]
                             : nullptr,
                 Release{arena}),
        device_(device_mode() != DeviceMode::Host
                    ? std::make_unique<DeviceImage>(count * dtype_size(dtype))
                    : nullptr) {}

  DType dtype() const { return dtype_; }
  size_t count() const { return count_; }
  // The tensor a collective gets: the device image under WEFT_TEST_DEVICE, brought up to date
  // with the host image first.
  Tensor tensor() {
    if (device_) {
      sync(Side::Device);
      return Tensor{device_->data(), count_, dtype_, device_->device()};
    }
    return Tensor{storage_.get(), count_, dtype_, Device::cpu()};
  }
  Tensor tensor(size_t offset, size_t n) { return tensor().slice(offset, n); }

  // Instrumented under TSan: this reads what weft wrote, so a write that lands after the Work
  // completed is a race it reports.
  uint64_t get(size_t i) const {
    if (device_) sync(Side::Host);
    switch (dtype_size(dtype_)) {
      case 1:
        return element<uint8_t>(i);
      case 2:
        return element<uint16_t>(i);
      case 4:
        return element<uint32_t>(i);
      default:
        return element<uint64_t>(i);
    }
  }
  // Not instrumented: buffers are filled before the collective that uses them is issued.
  REFERENCE void set(size_t i, uint64_t bits) {
    if (device_) {
      sync(Side::Host);
      newer_ = Side::Host;
    }
    switch (dtype_size(dtype_)) {
      case 1:
        element<uint8_t>(i) = static_cast<uint8_t>(bits);
        return;
      case 2:
        element<uint16_t>(i) = static_cast<uint16_t>(bits);
        return;
      case 4:
        element<uint32_t>(i) = static_cast<uint32_t>(bits);
        return;
      default:
        element<uint64_t>(i) = bits;
    }
  }
  template <typename F>
  REFERENCE void fill(size_t offset, size_t n, F bits_of) {
    for (size_t k = 0; k < n; ++k) set(offset + k, bits_of(k));
  }
  template <typename F>
  REFERENCE void fill(F bits_of) {
    fill(0, count_, bits_of);
  }

 private:
  // An array of unsigned char provides storage for objects of any type (C++20 [intro.object]):
  // elements are read and written with their own width.
  template <typename U>
  U& element(size_t i) const {
    return reinterpret_cast<U*>(storage_.get())[i];
  }

  // Hands the memory back to its arena, or to operator delete[].
  struct Release {
    Arena* arena = nullptr;
    void operator()(unsigned char* p) const {
      if (arena) {
        arena->give_back();
      } else {
        delete[] p;
      }
    }
  };

  // Under WEFT_TEST_DEVICE, which of the two images may hold what the other does not: the host
  // after set(), the device once a tensor of it has been handed out (a collective may write it).
  // sync(side) makes `side` current, copying the whole buffer across when it is not.
  enum class Side { Both, Host, Device };
  void sync(Side side) const {
    if (newer_ == Side::Both || newer_ == side) {
      if (side == Side::Device) newer_ = Side::Device;
      return;
    }
    if (side == Side::Device) {
      device_->copy_in(storage_.get());
      newer_ = Side::Device;
    } else {
      device_->copy_out(storage_.get());
      newer_ = Side::Both;
    }
  }

  DType dtype_;
  size_t count_;
  std::unique_ptr<unsigned char[], Release> storage_;  // null when empty and not in an arena
  std::unique_ptr<DeviceImage> device_;                // WEFT_TEST_DEVICE only
  mutable Side newer_ = Side::Both;                    // WEFT_TEST_DEVICE only
};

// One rank's failed checks. A wrong result does not stop the rank (the others expect it at the
// next collective): the checks go on and the rank fails at the end, listing them.
class Report {
 public:
  using Explain = std::function<std::string(size_t)>;

  // Checks buffer[offset + k] against expected(k) for k < n; `what` names the piece ("output
  // block 2"), and indices in messages are k.
  template <typename Expected>
  void expect(const std::string& where, const std::string& what, const Buffer& buffer,
              size_t offset, size_t n, const Expected& expected, const Explain& explain = {}) {
    size_t wrong = 0;
    std::string first;
    for (size_t k = 0; k < n; ++k) {
      const uint64_t got = buffer.get(offset + k);
      const uint64_t want = expected(k);
      if (same(buffer.dtype(), got, want)) continue;
      if (++wrong <= 3) {
        first += fmt::format("\n    index {}: got {} expected {}", k, show(buffer.dtype(), got),
                             show(buffer.dtype(), want));
        if (explain) first += "; " + explain(k);
      }
    }
    if (wrong > 0) {
      add(fmt::format("{}: {}: {} of {} elements wrong{}", where, what, wrong, n, first));
    }
  }
  template <typename Expected>
  void expect(const std::string& where, const std::string& what, const Buffer& buffer,
              const Expected& expected, const Explain& explain = {}) {
    expect(where, what, buffer, 0, buffer.count(), expected, explain);
  }

  void add(std::string message) {
    if (messages_.size() < kShown) messages_.push_back(std::move(message));
    ++failures_;
  }

  void throw_if_any() const {
    if (failures_ == 0) return;
    throw std::runtime_error(
        fmt::format("{} conformance checks failed{}:\n  {}", failures_,
                    failures_ > kShown ? fmt::format(" (first {})", kShown) : "",
                    fmt::join(messages_, "\n  ")));
  }

 private:
  static constexpr size_t kShown = 40;
  std::vector<std::string> messages_;
  size_t failures_ = 0;
};

// ---- Worlds and variants.

// A sub-group over every rank of the world with its own backend settings.
struct Variant {
  std::string algo;  // "" for a backend other than tcp (one variant, the backend's defaults)
  std::string shm;
  std::shared_ptr<ProcessGroup> pg;
  std::shared_ptr<Arena> arena;  // symmetric_mode() only: where its checks' tensors lie
};

// What a test body gets on each rank.
struct Rank {
  int rank = 0;
  int size = 1;
  std::string host = "127.0.0.1";  // the world's store: host, port (on rank 0's host)
  uint16_t port = 0;
  std::shared_ptr<ProcessGroup> world;
  std::vector<Variant> variants;
  Report report;
  uint64_t calls = 0;  // advanced in lockstep on every rank: a fresh salt per collective

  uint64_t salt() { return ++calls; }

  // "rank 2/4 all_reduce (in place) float16 op sum count 1031 algo ring shm 0": the words every
  // failure message starts with.
  std::string where(const Variant& v, std::string_view collective, DType dtype, std::string_view op,
                    size_t count, std::string_view extra = "") const {
    return fmt::format("rank {}/{} {} {} op {} count {} algo {} shm {}{}{}", v.pg->rank(),
                       v.pg->size(), collective, dtype_name(dtype), op, count,
                       v.algo.empty() ? "-" : v.algo, v.shm.empty() ? "-" : v.shm,
                       extra.empty() ? "" : " ", extra);
  }
};

// The collective's Work, waited for; its failure (the group is broken then) ends the rank with
// the call's description.
void wait_for(const std::shared_ptr<Work>& work, const std::string& where) {
  try {
    work->wait();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::Unsupported && report_unsupported()) throw;  // run_rank says so
    throw std::runtime_error(fmt::format("{}: the collective failed: {}", where, e.what()));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: the collective failed: {}", where, e.what()));
  }
}

// One rank of a world: the world through a store on rank 0 at `host`:`port`, and one sub-group
// per (algorithm in `algos`, shm setting in `shms`), all under WEFT_DEBUG=detail when
// `debug_detail`. Throws the rank's failed checks and errors.
void run_rank_body(int rank, int size, uint16_t port, const std::vector<std::string>& algos,
                   const std::function<void(Rank&)>& body, const std::vector<std::string>& shms,
                   bool debug_detail, const std::string& host) {
  const std::string backend = backend_under_test();
  if (symmetric_mode() && backend != "tcp") {
    throw std::invalid_argument(fmt::format(
        "WEFT_TEST_SYMMETRIC=1 runs on the tcp backend only (symmetric memory), not {}", backend));
  }
  if (symmetric_mode() && device_mode() != DeviceMode::Host) {
    throw std::invalid_argument(
        "WEFT_TEST_SYMMETRIC=1 and WEFT_TEST_DEVICE: symmetric buffers "
        "are host memory");
  }
  // The ranks forked here share one host; a launcher says which local rank this process is.
  choose_device(launched() ? launch().rdzv.local_rank : rank);
  // Before weft reads its configuration, which it does once per process.
  if (debug_detail) setenv("WEFT_DEBUG", "detail", 1);
  ProcessGroupOptions options;
  options.url = fmt::format("tcp://{}:{}", host, port);
  options.rank = rank;
  options.world_size = size;
  options.backend = backend;
  options.timeout = seconds(30);
  Rank r;
  r.rank = rank;
  r.size = size;
  r.host = host;
  r.port = port;
  r.world = init_process_group(options);
  std::vector<int> everyone(size);
  std::iota(everyone.begin(), everyone.end(), 0);
  // Backends made by the generic layer (backends/common) take "algo"; only tcp takes "shm" (ucx
  // picks its transports by UCX_TLS).
  const bool generic = backend == "tcp" || backend == "ucx";
  const std::vector<std::string> no_shm = {""};
  if (generic) {
    // Symmetric buffers need shared memory: every variant has it on in that mode.
    const std::vector<std::string> shm_on = {"1"};
    for (const std::string& shm : backend != "tcp" ? no_shm : symmetric_mode() ? shm_on : shms) {
      for (const std::string& algo : algos) {
        NewGroupOptions group_options;
        group_options.name = fmt::format("{}-shm{}", algo, shm);
        group_options.backend_settings = {{"algo", algo}};
        if (!shm.empty()) group_options.backend_settings["shm"] = shm;
        try {
          r.variants.push_back({algo, shm, r.world->new_group(everyone, group_options), nullptr});
        } catch (const Error& e) {
          // Every rank refuses the name alike, after the group's connections are made.
          const bool unknown =
              e.code() == ErrorCode::InvalidArgument &&
              std::string_view(e.what()).find("unknown algorithm") != std::string_view::npos;
          if (algo != kOptionalAlgorithm || !unknown) throw;
        }
      }
    }
  } else {
    r.variants.push_back({"", "", r.world->new_group(everyone), nullptr});
  }
  if (symmetric_mode()) {
    // Collective over each group, in the same order on every rank.
    for (Variant& v : r.variants) {
      v.arena = std::make_shared<Arena>(v.pg->allocate_symmetric(kArenaBytes));
    }
  }
  body(r);
  // Rank 0 hosts the store: everyone leaves together.
  r.world->barrier()->wait();
  r.report.throw_if_any();
}

// run_rank_body(), with an Error(Unsupported) marked as such under report_unsupported() (every
// rank of the world meets it, or the ranks that do not fail for their peers' leaving).
void run_rank(int rank, int size, uint16_t port, const std::vector<std::string>& algos,
              const std::function<void(Rank&)>& body, const std::vector<std::string>& shms,
              bool debug_detail, const std::string& host = "127.0.0.1") {
  try {
    run_rank_body(rank, size, port, algos, body, shms, debug_detail, host);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Unsupported || !report_unsupported()) throw;
    throw std::runtime_error(fmt::format("{}{}", kUnsupportedMarker, e.what()));
  }
}

// Under report_unsupported(): notes an unsupported report in `failures` and says so; false (and
// nothing noted) when there is none, or when reporting is off.
bool noted_unsupported(int size, const std::string& failures) {
  if (failures.empty() || !report_unsupported()) return false;
  std::string what = unsupported_in(failures);
  if (what.empty()) return false;
  WARN("world size " << size << ": unsupported by backend " << backend_under_test() << ": "
                     << what);
  conformance::unsupported_notes().push_back({size, std::move(what)});
  return true;
}

// Under WEFT_TEST_LAUNCHER=env: this process is one rank of the launcher's world, so only that
// world size runs, here; the others are skipped. Rank 0 picks the port of the world's store and
// tells the other ranks, with its address (the one it reaches the launcher's store by: the ranks
// may run on several hosts), through the launcher's store. A failure fails this rank's test case.
void run_launched_world(int size, const std::vector<std::string>& algos,
                        const std::function<void(Rank&)>& body,
                        const std::vector<std::string>& shms, bool debug_detail) {
  Launch& l = launch();
  if (size != l.rdzv.world_size) return;
  if (debug_detail) {
    const char* debug = std::getenv("WEFT_DEBUG");
    if (debug == nullptr || std::string_view(debug) != "detail") {
      WARN(
          "skipped: weft reads WEFT_DEBUG once per process; under WEFT_TEST_LAUNCHER=env run "
          "this test case with WEFT_DEBUG=detail in the environment");
      return;
    }
  }
  const std::string key = fmt::format("conformance/world/{}/port", ++l.worlds);
  // The world's own store is hosted by its rank 0, not by the launcher that hosts the
  // launcher's store (weftrun and torchrun say so for every rendezvous in their ranks).
  unsetenv("TORCHELASTIC_USE_AGENT_STORE");
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  if (l.rdzv.rank == 0) {
    port = test::free_port();
    if (std::string local = l.rdzv.store->local_address(); !local.empty()) host = local;
    const std::string text = fmt::format("{} {}", host, port);
    l.rdzv.store->set(key, Bytes(text.begin(), text.end()));
  } else {
    const Bytes bytes = l.rdzv.store->get(key, seconds(150));
    std::istringstream text(std::string(bytes.begin(), bytes.end()));
    text >> host >> port;
  }
  std::string failure;
  try {
    run_rank(l.rdzv.rank, size, port, algos, body, shms, debug_detail, host);
  } catch (const std::exception& e) {
    failure = fmt::format("rank {} failed: {}", l.rdzv.rank, e.what());
  }
  if (noted_unsupported(size, failure)) return;
  INFO("world size " << size << ", backend " << backend_under_test() << "\n" << failure);
  CHECK(failure.empty());
}

// Runs `body` on `size` ranks, each in its own process (run_rank). A rank's failed checks and
// errors fail the test case naming the world size; the other world sizes still run. Under
// WEFT_TEST_LAUNCHER=env, run_launched_world instead.
void run_world(int size, const std::vector<std::string>& algos,
               const std::function<void(Rank&)>& body,
               const std::vector<std::string>& shms = {"0", "1"}, bool debug_detail = false) {
  if (launched()) return run_launched_world(size, algos, body, shms, debug_detail);
  const std::string backend = backend_under_test();
  const uint16_t port = test::free_port();
  auto results = test::run_ranks(
      size, [&](int rank) { run_rank(rank, size, port, algos, body, shms, debug_detail); },
      seconds(150));
  const std::string failures = test::describe_failures(results);
  if (noted_unsupported(size, failures)) return;
  INFO("world size " << size << ", backend " << backend << "\n" << failures);
  CHECK(failures.empty());
}

// The variants whose algorithm is one of `names`.
std::vector<const Variant*> pick(const Rank& r, const std::vector<std::string>& names) {
  std::vector<const Variant*> picked;
  for (const Variant& v : r.variants) {
    if (v.algo.empty() || std::find(names.begin(), names.end(), v.algo) != names.end()) {
      picked.push_back(&v);
    }
  }
  return picked;
}

// Roots 0, a middle one and the last, without repeats.
std::vector<int> roots_of(int size) {
  std::vector<int> roots = {0};
  if (size / 2 != 0) roots.push_back(size / 2);
  if (size - 1 != 0 && size - 1 != size / 2) roots.push_back(size - 1);
  return roots;
}

// Whether option k of `options` runs at `turn`: `per` of them, turning with `turn`, so that
// consecutive turns cover them all; every option under WEFT_TEST_FULL. Variants with shm on start
// their turns one later (turn_of), so that the two transports see each combination in different
// options.
bool in_turn(size_t turn, size_t k, size_t options, size_t per = 1) {
  return full_run() || (k + options - turn % options) % options < per;
}
size_t turn_of(const Variant& v) { return v.shm == "1" ? 1 : 0; }

// Uneven per-rank counts around n: some ranks contribute nothing, the others differing amounts.
std::vector<size_t> uneven_counts(int size, size_t n) {
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = r % 3 == 1 ? 0 : n + 2 * r;
  return counts;
}

// Offsets of P blocks of the given counts laid out with `gap` elements after each (a gap makes
// a list of tensors "scattered": the group stages it through its own buffer).
std::vector<size_t> block_offsets(const std::vector<size_t>& counts, size_t gap) {
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t q = 0; q < counts.size(); ++q) offsets[q + 1] = offsets[q] + counts[q] + gap;
  return offsets;
}

// ---- Issuing and checking.

// A collective issued and not yet checked: finish() waits for its Work, then checks what it left
// in the buffers, which `verify` owns until then. Issuing several before finishing any is how a
// caller overlaps them, and how the suite checks that they stay apart.
struct Issued {
  std::shared_ptr<Work> work;
  std::string where;
  std::function<void()> verify;
};

void finish(const Issued& issued) {
  wait_for(issued.work, issued.where);
  issued.verify();
}

using BufferPtr = std::shared_ptr<Buffer>;

// A check's buffer for variant v: in v's arena under symmetric_mode(), reserving `at_most`
// elements there (pass a bound that is the same on every rank when `count` is not).
BufferPtr make_buffer(const Variant& v, DType dtype, size_t count, size_t at_most = 0) {
  return std::make_shared<Buffer>(v.arena.get(), dtype, count, at_most);
}

// ---- all_reduce.

Issued start_all_reduce(Rank& r, const Variant& v, DType dtype, ReduceOp op, size_t n,
                        bool in_place) {
  const std::string where =
      r.where(v, in_place ? "all_reduce (in place)" : "all_reduce", dtype, describe(op), n);
  const Reduction red(dtype, op, v.pg->size(), r.salt());
  const uint64_t salt = r.salt();
  BufferPtr input = make_buffer(v, dtype, n);
  input->fill([&](size_t i) { return red.input(v.pg->rank(), i); });
  BufferPtr output = in_place ? input : make_buffer(v, dtype, n);
  if (!in_place) output->fill([&](size_t i) { return sentinel(dtype, salt, i); });
  auto work = in_place ? v.pg->all_reduce(input->tensor(), op)
                       : v.pg->all_reduce(input->tensor(), output->tensor(), op);
  return {work, where, [&r, rank = v.pg->rank(), where, red, input, output, in_place] {
            r.report.expect(
                where, in_place ? "tensor" : "output", *output,
                [&](size_t i) { return red.expected(i); }, [&](size_t i) { return red.inputs(i); });
            if (in_place) return;
            r.report.expect(where, "input (must be unchanged)", *input,
                            [&](size_t i) { return red.input(rank, i); });
          }};
}

void check_all_reduce(Rank& r, const Variant& v, DType dtype, ReduceOp op, size_t n,
                      bool in_place) {
  finish(start_all_reduce(r, v, dtype, op, n, in_place));
}

TEST_CASE("all_reduce equals the reference for every dtype, op, placement, algorithm and shm",
          "[conformance][all_reduce]") {
  for (int size : world_sizes()) {
    run_world(size, {"ring", "recursive_doubling", "halving_doubling"}, [](Rank& r) {
      for (const Variant* v : pick(r, {"ring", "recursive_doubling", "halving_doubling"})) {
        // Each (dtype, op, count) in one placement per transport, the other on the other one.
        size_t turn = turn_of(*v);
        for (DType dtype : kAllDTypes) {
          for (ReduceOp op : all_ops()) {
            if (!op_defined(dtype, op)) continue;
            for (size_t n : small_counts()) {
              ++turn;
              if (in_turn(turn, 0, 2)) check_all_reduce(r, *v, dtype, op, n, true);
              if (in_turn(turn, 1, 2)) check_all_reduce(r, *v, dtype, op, n, false);
            }
          }
        }
        check_all_reduce(r, *v, DType::Float32, ReduceOp::Sum, large_count(DType::Float32),
                         turn_of(*v) == 0);
        // An inexact factor, rounded to the dtype's arithmetic type before it multiplies
        // (reduce.h). With two ranks the sum of the products is rounded once, in any algorithm.
        if (r.size > 2) continue;
        for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                            DType::Float8E4M3, DType::Float8E5M2}) {
          check_all_reduce(r, *v, dtype, ReduceOp::premul_sum(0.1), 1031, turn_of(*v) == 0);
        }
      }
      // Two more combinations at the large count, one per transport.
      check_all_reduce(r, r.variants.front(), DType::BFloat16, ReduceOp::Avg,
                       large_count(DType::BFloat16), true);
      check_all_reduce(r, r.variants.back(), DType::Int64, ReduceOp::BXor,
                       large_count(DType::Int64), false);
    });
  }
}

// ---- reduce.

Issued start_reduce(Rank& r, const Variant& v, DType dtype, ReduceOp op, size_t n, int root,
                    bool in_place) {
  const std::string where = r.where(v, in_place ? "reduce (in place)" : "reduce", dtype,
                                    describe(op), n, fmt::format("root {}", root));
  const Reduction red(dtype, op, v.pg->size(), r.salt());
  const uint64_t salt = r.salt();
  BufferPtr input = make_buffer(v, dtype, n);
  input->fill([&](size_t i) { return red.input(v.pg->rank(), i); });
  BufferPtr output = in_place ? input : make_buffer(v, dtype, n);
  if (!in_place) output->fill([&](size_t i) { return sentinel(dtype, salt, i); });
  auto work = in_place ? v.pg->reduce(input->tensor(), root, op)
                       : v.pg->reduce(input->tensor(), output->tensor(), root, op);
  return {work, where,
          [&r, rank = v.pg->rank(), where, red, input, output, in_place, root, dtype, salt] {
            auto unchanged = [&](size_t i) { return red.input(rank, i); };
            if (rank == root) {
              r.report.expect(
                  where, in_place ? "tensor on root" : "output on root", *output,
                  [&](size_t i) { return red.expected(i); },
                  [&](size_t i) { return red.inputs(i); });
            } else if (in_place) {
              r.report.expect(where, "tensor off root (must be unchanged)", *input, unchanged);
            } else {
              r.report.expect(where, "output off root (ignored: must be untouched)", *output,
                              [&](size_t i) { return sentinel(dtype, salt, i); });
            }
            if (!in_place) r.report.expect(where, "input (must be unchanged)", *input, unchanged);
          }};
}

void check_reduce(Rank& r, const Variant& v, DType dtype, ReduceOp op, size_t n, int root,
                  bool in_place) {
  finish(start_reduce(r, v, dtype, op, n, root, in_place));
}

TEST_CASE("reduce equals the reference on roots first, middle and last", "[conformance][reduce]") {
  for (int size : world_sizes()) {
    run_world(size, {"tree"}, [](Rank& r) {
      const std::vector<int> roots = roots_of(r.size);
      for (const Variant* v : pick(r, {"tree"})) {
        // Each (dtype, op, count) once per transport, the root and the placement turning with
        // the combination (every root in both placements under WEFT_TEST_FULL).
        size_t turn = 0;
        for (DType dtype : kAllDTypes) {
          for (ReduceOp op : all_ops()) {
            if (!op_defined(dtype, op)) continue;
            for (size_t n : small_counts()) {
              ++turn;
              for (size_t k = 0; k < roots.size(); ++k) {
                if (!in_turn(turn, k, roots.size())) continue;
                if (in_turn(turn + turn_of(*v), 0, 2)) {
                  check_reduce(r, *v, dtype, op, n, roots[k], true);
                }
                if (in_turn(turn + turn_of(*v), 1, 2)) {
                  check_reduce(r, *v, dtype, op, n, roots[k], false);
                }
              }
            }
          }
        }
        for (int root : roots) {
          check_reduce(r, *v, DType::Float32, ReduceOp::Sum, large_count(DType::Float32), root,
                       root % 2 == 0);
        }
      }
      check_reduce(r, r.variants.back(), DType::Int32, ReduceOp::Min, large_count(DType::Int32),
                   roots.back(), false);
    });
  }
}

// ---- broadcast.

Issued start_broadcast(Rank& r, const Variant& v, DType dtype, size_t n, int root) {
  const std::string where = r.where(v, "broadcast", dtype, "-", n, fmt::format("root {}", root));
  const uint64_t salt = r.salt();
  BufferPtr tensor = make_buffer(v, dtype, n);
  if (v.pg->rank() == root) {
    tensor->fill([&](size_t i) { return pattern(dtype, salt, root, i); });
  } else {
    tensor->fill([&](size_t i) { return sentinel(dtype, salt, i); });
  }
  return {v.pg->broadcast(tensor->tensor(), root), where,
          [&r, rank = v.pg->rank(), where, tensor, dtype, salt, root] {
            r.report.expect(where, rank == root ? "tensor on root (must be unchanged)" : "tensor",
                            *tensor, [&](size_t i) { return pattern(dtype, salt, root, i); });
          }};
}

void check_broadcast(Rank& r, const Variant& v, DType dtype, size_t n, int root) {
  finish(start_broadcast(r, v, dtype, n, root));
}

TEST_CASE("broadcast copies root's bits to every rank from every root",
          "[conformance][broadcast]") {
  for (int size : world_sizes()) {
    run_world(size, {"tree"}, [](Rank& r) {
      const std::vector<int> roots = roots_of(r.size);
      for (const Variant* v : pick(r, {"tree"})) {
        // One root per (dtype, count) and transport, turning: every dtype meets every root.
        size_t turn = turn_of(*v);
        for (DType dtype : kAllDTypes) {
          for (size_t n : small_counts()) {
            ++turn;
            for (size_t k = 0; k < roots.size(); ++k) {
              if (in_turn(turn, k, roots.size())) check_broadcast(r, *v, dtype, n, roots[k]);
            }
          }
        }
        for (int root : roots_of(r.size)) {
          check_broadcast(r, *v, DType::Float32, large_count(DType::Float32), root);
        }
      }
      check_broadcast(r, r.variants.back(), DType::UInt8, large_count(DType::UInt8), r.size - 1);
    });
  }
}

// ---- all_gather.

// The shapes a list, tensor or uneven collective takes. "Scattered" lists have a gap after each
// block (the group stages them through its own buffer); "in place" passes this rank's block (of
// the list, tensor or uneven tensor) as the other operand.
enum class Form {
  List,
  ListScattered,
  ListInPlace,
  ListScatteredInPlace,
  Tensor,
  TensorInPlace,
  Uneven,
  UnevenInPlace,
};

std::string_view form_name(Form form) {
  switch (form) {
    case Form::List:
      return "list";
    case Form::ListScattered:
      return "scattered list";
    case Form::ListInPlace:
      return "list in place";
    case Form::ListScatteredInPlace:
      return "scattered list in place";
    case Form::Tensor:
      return "tensor";
    case Form::TensorInPlace:
      return "tensor in place";
    case Form::Uneven:
      return "uneven";
    case Form::UnevenInPlace:
      return "uneven in place";
  }
  return "?";
}

bool is_list(Form form) {
  return form == Form::List || form == Form::ListScattered || form == Form::ListInPlace ||
         form == Form::ListScatteredInPlace;
}
bool is_scattered(Form form) {
  return form == Form::ListScattered || form == Form::ListScatteredInPlace;
}
bool is_in_place(Form form) {
  return form == Form::ListInPlace || form == Form::ListScatteredInPlace ||
         form == Form::TensorInPlace || form == Form::UnevenInPlace;
}
bool is_uneven(Form form) { return form == Form::Uneven || form == Form::UnevenInPlace; }

// all_gather in one of its forms; `uneven` gives the list forms per-rank sizes.
Issued start_all_gather(Rank& r, const Variant& v, DType dtype, size_t n, Form form, bool uneven) {
  const size_t p = v.pg->size();
  const size_t me = v.pg->rank();
  const std::vector<size_t> counts =
      uneven || is_uneven(form) ? uneven_counts(v.pg->size(), n) : std::vector<size_t>(p, n);
  const std::string collective = fmt::format("all_gather ({}{})", form_name(form),
                                             uneven && !is_uneven(form) ? " of uneven sizes" : "");
  const std::string where =
      r.where(v, collective, dtype, "-", n, fmt::format("counts [{}]", fmt::join(counts, ",")));
  const uint64_t salt = r.salt();
  const size_t gap = is_scattered(form) ? 1 : 0;
  const std::vector<size_t> offsets = block_offsets(counts, gap);
  auto mine = [dtype, salt, me](size_t i) { return pattern(dtype, salt, me, i); };
  BufferPtr output = make_buffer(v, dtype, offsets.back());
  output->fill([&](size_t i) { return sentinel(dtype, salt, i); });
  if (is_in_place(form)) output->fill(offsets[me], counts[me], mine);
  BufferPtr own =
      make_buffer(v, dtype, counts[me], *std::max_element(counts.begin(), counts.end()));
  own->fill(mine);
  const Tensor input = is_in_place(form) ? output->tensor(offsets[me], counts[me]) : own->tensor();
  std::shared_ptr<Work> work;
  if (is_list(form)) {
    std::vector<Tensor> outputs;
    for (size_t q = 0; q < p; ++q) outputs.push_back(output->tensor(offsets[q], counts[q]));
    work = v.pg->all_gather(outputs, input);
  } else if (is_uneven(form)) {
    work = v.pg->all_gather_uneven(output->tensor(), input, counts);
  } else {
    work = v.pg->all_gather_into_tensor(output->tensor(), input);
  }
  return {work, where,
          [&r, rank = v.pg->rank(), where, output, own, counts, offsets, gap, dtype, salt, mine] {
            for (size_t q = 0; q < counts.size(); ++q) {
              r.report.expect(where, fmt::format("output block {}", q), *output, offsets[q],
                              counts[q], [&](size_t i) { return pattern(dtype, salt, q, i); });
              if (gap == 0) continue;
              const size_t at = offsets[q] + counts[q];
              r.report.expect(where, fmt::format("gap after block {} (must be untouched)", q),
                              *output, at, gap,
                              [&](size_t i) { return sentinel(dtype, salt, at + i); });
            }
            r.report.expect(where, "input (must be unchanged)", *own, mine);
          }};
}

void check_all_gather(Rank& r, const Variant& v, DType dtype, size_t n, Form form, bool uneven) {
  finish(start_all_gather(r, v, dtype, n, form, uneven));
}

TEST_CASE("all_gather assembles every rank's bits in list, tensor, in-place and uneven forms",
          "[conformance][all_gather]") {
  for (int size : world_sizes()) {
    run_world(size, {"ring", "bruck"}, [](Rank& r) {
      struct Call {
        Form form;
        bool uneven;
      };
      const Call calls[] = {
          {Form::List, false},        {Form::ListScattered, false},
          {Form::ListInPlace, false}, {Form::ListScatteredInPlace, false},
          {Form::Tensor, false},      {Form::TensorInPlace, false},
          {Form::Uneven, false},      {Form::UnevenInPlace, false},
          {Form::List, true},         {Form::ListScattered, true},
          {Form::ListInPlace, true},  {Form::ListScatteredInPlace, true},
      };
      for (const Variant* v : pick(r, {"ring", "bruck"})) {
        // Three of the twelve forms per (dtype, count), turning: every form meets every dtype.
        size_t turn = turn_of(*v);
        for (DType dtype : kAllDTypes) {
          for (size_t n : small_counts()) {
            ++turn;
            for (size_t k = 0; k < std::size(calls); ++k) {
              if (in_turn(3 * turn, k, std::size(calls), 3)) {
                check_all_gather(r, *v, dtype, n, calls[k].form, calls[k].uneven);
              }
            }
          }
        }
        check_all_gather(r, *v, DType::Float32, large_count(DType::Float32) / r.size,
                         turn_of(*v) == 0 ? Form::Tensor : Form::TensorInPlace, false);
      }
      // Two more combinations at the large count, one per transport.
      check_all_gather(r, r.variants.front(), DType::Float32, large_count(DType::Float32) / r.size,
                       Form::ListScattered, false);
      check_all_gather(r, r.variants.back(), DType::Int8, large_count(DType::Int8) / r.size,
                       Form::Uneven, false);
    });
  }
}

// ---- reduce_scatter.

Issued start_reduce_scatter(Rank& r, const Variant& v, DType dtype, ReduceOp op, size_t n,
                            Form form) {
  const size_t p = v.pg->size();
  const size_t me = v.pg->rank();
  const std::vector<size_t> counts =
      is_uneven(form) ? uneven_counts(v.pg->size(), n) : std::vector<size_t>(p, n);
  const std::string where =
      r.where(v, fmt::format("reduce_scatter ({})", form_name(form)), dtype, describe(op), n,
              fmt::format("counts [{}]", fmt::join(counts, ",")));
  // Element k of block q is element dense[q] + k of the reduction, wherever the block lies.
  const Reduction red(dtype, op, v.pg->size(), r.salt());
  const std::vector<size_t> dense = block_offsets(counts, 0);
  const size_t gap = is_scattered(form) ? 1 : 0;
  const std::vector<size_t> offsets = block_offsets(counts, gap);
  const uint64_t salt = r.salt();
  BufferPtr input = make_buffer(v, dtype, offsets.back());
  input->fill([&](size_t i) { return sentinel(dtype, salt, i); });
  for (size_t q = 0; q < p; ++q) {
    input->fill(offsets[q], counts[q],
                [&](size_t k) { return red.input(v.pg->rank(), dense[q] + k); });
  }
  const bool in_place = is_in_place(form);
  BufferPtr result =
      in_place ? input
               : make_buffer(v, dtype, counts[me], *std::max_element(counts.begin(), counts.end()));
  if (!in_place) result->fill([&](size_t i) { return sentinel(dtype, salt + 1, i); });
  const size_t at = in_place ? offsets[me] : 0;
  const Tensor output = result->tensor(at, counts[me]);
  std::shared_ptr<Work> work;
  if (is_list(form)) {
    std::vector<Tensor> inputs;
    for (size_t q = 0; q < p; ++q) inputs.push_back(input->tensor(offsets[q], counts[q]));
    work = v.pg->reduce_scatter(output, inputs, op);
  } else if (is_uneven(form)) {
    work = v.pg->reduce_scatter_uneven(output, input->tensor(), counts, op);
  } else {
    work = v.pg->reduce_scatter_tensor(output, input->tensor(), op);
  }
  return {
      work, where,
      [&r, rank = v.pg->rank(), where, red, input, result, counts, dense, offsets, at, in_place] {
        const size_t mine = dense[rank];
        r.report.expect(
            where, in_place ? "output (this rank's block of the input)" : "output", *result, at,
            counts[rank], [&](size_t k) { return red.expected(mine + k); },
            [&](size_t k) { return red.inputs(mine + k); });
        // In place, only this rank's block is specified afterwards: the rest may be scratch.
        if (in_place) return;
        for (size_t q = 0; q < counts.size(); ++q) {
          r.report.expect(where, fmt::format("input block {} (must be unchanged)", q), *input,
                          offsets[q], counts[q],
                          [&](size_t k) { return red.input(rank, dense[q] + k); });
        }
      }};
}

void check_reduce_scatter(Rank& r, const Variant& v, DType dtype, ReduceOp op, size_t n,
                          Form form) {
  finish(start_reduce_scatter(r, v, dtype, op, n, form));
}

TEST_CASE("reduce_scatter equals the reference in list, tensor, in-place and uneven forms",
          "[conformance][reduce_scatter]") {
  for (int size : world_sizes()) {
    run_world(size, {"ring", "halving_doubling"}, [](Rank& r) {
      const Form forms[] = {
          Form::List,   Form::ListScattered, Form::ListInPlace, Form::ListScatteredInPlace,
          Form::Tensor, Form::TensorInPlace, Form::Uneven,      Form::UnevenInPlace};
      for (const Variant* v : pick(r, {"ring", "halving_doubling"})) {
        // Every form for every combination would be five times the work for the same reduction
        // code: one form per (dtype, op, count) and transport, turning, so that each form meets
        // every dtype and op.
        size_t turn = 4 * turn_of(*v);
        for (DType dtype : kAllDTypes) {
          for (ReduceOp op : all_ops()) {
            if (!op_defined(dtype, op)) continue;
            for (size_t n : small_counts()) {
              ++turn;
              for (size_t k = 0; k < std::size(forms); ++k) {
                if (in_turn(turn, k, std::size(forms))) {
                  check_reduce_scatter(r, *v, dtype, op, n, forms[k]);
                }
              }
            }
          }
        }
        check_reduce_scatter(r, *v, DType::Float32, ReduceOp::Sum,
                             large_count(DType::Float32) / r.size,
                             turn_of(*v) == 0 ? Form::Tensor : Form::TensorInPlace);
        // An inexact factor (see the all_reduce test case): exact to check with two ranks.
        if (r.size > 2) continue;
        for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                            DType::Float8E4M3, DType::Float8E5M2}) {
          check_reduce_scatter(r, *v, dtype, ReduceOp::premul_sum(1.0 / 3), 1031, Form::Tensor);
        }
      }
      check_reduce_scatter(r, r.variants.back(), DType::Float16, ReduceOp::Max,
                           large_count(DType::Float16) / r.size, Form::Uneven);
    });
  }
}

// ---- gather and scatter.

Issued start_gather(Rank& r, const Variant& v, DType dtype, size_t n, int root, Form form) {
  const size_t p = v.pg->size();
  const std::string where = r.where(v, fmt::format("gather ({})", form_name(form)), dtype, "-", n,
                                    fmt::format("root {}", root));
  const uint64_t salt = r.salt();
  const bool on_root = v.pg->rank() == root;
  const size_t gap = is_scattered(form) ? 1 : 0;
  const std::vector<size_t> offsets = block_offsets(std::vector<size_t>(p, n), gap);
  const size_t me = v.pg->rank();
  auto mine = [dtype, salt, me](size_t i) { return pattern(dtype, salt, me, i); };
  BufferPtr output = make_buffer(v, dtype, on_root ? offsets.back() : 0, offsets.back());
  output->fill([&](size_t i) { return sentinel(dtype, salt, i); });
  BufferPtr own = make_buffer(v, dtype, n);
  own->fill(mine);
  // In place on root: root's input is its own block of the output.
  const bool in_place = on_root && is_in_place(form);
  if (in_place) output->fill(offsets[me], n, mine);
  const Tensor input = in_place ? output->tensor(offsets[me], n) : own->tensor();
  std::shared_ptr<Work> work;
  if (is_list(form)) {
    std::vector<Tensor> outputs;
    for (size_t q = 0; on_root && q < p; ++q) outputs.push_back(output->tensor(offsets[q], n));
    work = v.pg->gather(outputs, input, root);
  } else {
    work = v.pg->gather_into_tensor(on_root ? output->tensor() : Tensor{}, input, root);
  }
  return {
      work, where,
      [&r, rank = v.pg->rank(), where, output, own, offsets, gap, n, on_root, dtype, salt, mine] {
        r.report.expect(where, "input (must be unchanged)", *own, mine);
        if (!on_root) return;
        for (size_t q = 0; q + 1 < offsets.size(); ++q) {
          r.report.expect(where, fmt::format("output block {}", q), *output, offsets[q], n,
                          [&](size_t i) { return pattern(dtype, salt, q, i); });
          if (gap == 0) continue;
          const size_t at = offsets[q] + n;
          r.report.expect(where, fmt::format("gap after block {} (must be untouched)", q), *output,
                          at, gap, [&](size_t i) { return sentinel(dtype, salt, at + i); });
        }
      }};
}

void check_gather(Rank& r, const Variant& v, DType dtype, size_t n, int root, Form form) {
  finish(start_gather(r, v, dtype, n, root, form));
}

Issued start_scatter(Rank& r, const Variant& v, DType dtype, size_t n, int root, Form form) {
  const size_t p = v.pg->size();
  const std::string where = r.where(v, fmt::format("scatter ({})", form_name(form)), dtype, "-", n,
                                    fmt::format("root {}", root));
  const uint64_t salt = r.salt();
  const bool on_root = v.pg->rank() == root;
  const size_t gap = is_scattered(form) ? 1 : 0;
  const std::vector<size_t> offsets = block_offsets(std::vector<size_t>(p, n), gap);
  // Element i of the block root sends to rank q.
  auto sent = [dtype, salt, root](size_t q, size_t i) { return pattern(dtype, salt, root, i, q); };
  BufferPtr input = make_buffer(v, dtype, on_root ? offsets.back() : 0, offsets.back());
  input->fill([&](size_t i) { return sentinel(dtype, salt, i); });
  for (size_t q = 0; on_root && q < p; ++q) {
    input->fill(offsets[q], n, [&](size_t i) { return sent(q, i); });
  }
  // In place on root: root's output is its own block of the input.
  const bool in_place = on_root && is_in_place(form);
  BufferPtr result = in_place ? input : make_buffer(v, dtype, n);
  if (!in_place) result->fill([&](size_t i) { return sentinel(dtype, salt + 1, i); });
  const size_t at = in_place ? offsets[v.pg->rank()] : 0;
  const Tensor output = result->tensor(at, n);
  std::shared_ptr<Work> work;
  if (is_list(form)) {
    std::vector<Tensor> inputs;
    for (size_t q = 0; on_root && q < p; ++q) inputs.push_back(input->tensor(offsets[q], n));
    work = v.pg->scatter(output, inputs, root);
  } else {
    work = v.pg->scatter_from_tensor(output, on_root ? input->tensor() : Tensor{}, root);
  }
  return {work, where,
          [&r, rank = v.pg->rank(), where, input, result, offsets, at, n, on_root, in_place, sent] {
            r.report.expect(where, in_place ? "output (root's block of the input)" : "output",
                            *result, at, n, [&](size_t i) { return sent(rank, i); });
            for (size_t q = 0; on_root && q + 1 < offsets.size(); ++q) {
              r.report.expect(where, fmt::format("input block {} (must be unchanged)", q), *input,
                              offsets[q], n, [&](size_t i) { return sent(q, i); });
            }
          }};
}

void check_scatter(Rank& r, const Variant& v, DType dtype, size_t n, int root, Form form) {
  finish(start_scatter(r, v, dtype, n, root, form));
}

TEST_CASE("gather and scatter move every block to and from every root in list and tensor forms",
          "[conformance][gather_scatter]") {
  for (int size : world_sizes()) {
    run_world(size, {"linear"}, [](Rank& r) {
      const Form forms[] = {Form::List,        Form::ListScattered,
                            Form::ListInPlace, Form::ListScatteredInPlace,
                            Form::Tensor,      Form::TensorInPlace};
      const std::vector<int> roots = roots_of(r.size);
      for (const Variant* v : pick(r, {"linear"})) {
        // Two of the six forms per (dtype, count) and transport, and one root, all turning.
        size_t turn = turn_of(*v);
        for (DType dtype : kAllDTypes) {
          for (size_t n : small_counts()) {
            ++turn;
            for (size_t f = 0; f < std::size(forms); ++f) {
              if (!in_turn(2 * turn, f, std::size(forms), 2)) continue;
              for (size_t k = 0; k < roots.size(); ++k) {
                if (!in_turn(turn + f, k, roots.size())) continue;
                check_gather(r, *v, dtype, n, roots[k], forms[f]);
                check_scatter(r, *v, dtype, n, roots[(k + 1) % roots.size()], forms[f]);
              }
            }
          }
        }
        const size_t large = large_count(DType::Float32) / r.size;
        const int root = roots[turn_of(*v) % roots.size()];
        check_gather(r, *v, DType::Float32, large, root, Form::Tensor);
        check_scatter(r, *v, DType::Float32, large, root, Form::Tensor);
      }
      const size_t large = large_count(DType::Int8) / r.size;
      check_gather(r, r.variants.front(), DType::Int8, large, roots.back(), Form::ListScattered);
      check_scatter(r, r.variants.back(), DType::Int8, large, roots.back(), Form::ListScattered);
    });
  }
}

// ---- all_to_all and barrier.

// Elements rank `from` sends to rank `to` in the split forms: none for some pairs, uneven for
// the others; symmetric (what a sends b, b sends a) for the in-place form, which needs equal
// input and output splits.
size_t split(size_t from, size_t to, size_t n, bool symmetric) {
  if (symmetric) return (from + to) % 3 == 2 ? 0 : n + (from * to + from + to) % 4;
  if ((from + 2 * to) % 3 == 2) return 0;
  return n + (from * 5 + to) % 4;
}

Issued start_all_to_all(Rank& r, const Variant& v, DType dtype, size_t n, Form form) {
  const size_t p = v.pg->size();
  const size_t me = v.pg->rank();
  std::vector<size_t> input_splits(p, n), output_splits(p, n);
  if (is_uneven(form)) {
    for (size_t j = 0; j < p; ++j) {
      input_splits[j] = split(me, j, n, is_in_place(form));
      output_splits[j] = split(j, me, n, is_in_place(form));
    }
  }
  const std::string where =
      r.where(v, fmt::format("all_to_all ({})", form_name(form)), dtype, "-", n,
              fmt::format("input_splits [{}] output_splits [{}]", fmt::join(input_splits, ","),
                          fmt::join(output_splits, ",")));
  const uint64_t salt = r.salt();
  const std::vector<size_t> in_offsets = block_offsets(input_splits, 0);
  const std::vector<size_t> out_offsets = block_offsets(output_splits, 0);
  // split() is at most n + 3: a bound on every rank's total, the same on all of them.
  const size_t at_most = p * (n + 3);
  BufferPtr input = make_buffer(v, dtype, in_offsets.back(), at_most);
  for (size_t j = 0; j < p; ++j) {
    input->fill(in_offsets[j], input_splits[j],
                [&](size_t k) { return pattern(dtype, salt, me, k, j); });
  }
  const bool in_place = is_in_place(form);
  BufferPtr result = in_place ? input : make_buffer(v, dtype, out_offsets.back(), at_most);
  if (!in_place) result->fill([&](size_t i) { return sentinel(dtype, salt, i); });
  auto work = is_uneven(form)
                  ? v.pg->all_to_all(result->tensor(), input->tensor(), output_splits, input_splits)
                  : v.pg->all_to_all(result->tensor(), input->tensor());
  return {work, where,
          [&r, where, input, result, input_splits, output_splits, in_offsets, out_offsets, in_place,
           dtype, salt, me] {
            for (size_t j = 0; j < output_splits.size(); ++j) {
              r.report.expect(where, fmt::format("output block {}", j), *result, out_offsets[j],
                              output_splits[j],
                              [&](size_t k) { return pattern(dtype, salt, j, k, me); });
            }
            if (in_place) return;
            for (size_t j = 0; j < input_splits.size(); ++j) {
              r.report.expect(where, fmt::format("input block {} (must be unchanged)", j), *input,
                              in_offsets[j], input_splits[j],
                              [&](size_t k) { return pattern(dtype, salt, me, k, j); });
            }
          }};
}

void check_all_to_all(Rank& r, const Variant& v, DType dtype, size_t n, Form form) {
  finish(start_all_to_all(r, v, dtype, n, form));
}

// Every rank counts itself in at the store before the barrier; after it, all must have.
void check_barrier(Rank& r, const Variant& v, TCPStore& store, int round) {
  const std::string where =
      r.where(v, "barrier", DType::Float32, "-", 0, fmt::format("round {}", round));
  const std::string key = fmt::format("conformance/barrier/{}/{}/{}", v.algo, v.shm, round);
  store.add(key, 1);
  wait_for(v.pg->barrier(), where);
  const int64_t entered = store.add(key, 0);
  if (entered < v.pg->size()) {
    r.report.add(fmt::format("{}: left the barrier when {} of {} ranks had entered it", where,
                             entered, v.pg->size()));
  }
}

TEST_CASE("all_to_all exchanges every block even, in place and with splits; barrier waits for all",
          "[conformance][all_to_all]") {
  for (int size : world_sizes()) {
    run_world(size, {"pairwise", "dissemination"}, [](Rank& r) {
      const Form forms[] = {Form::Tensor, Form::TensorInPlace, Form::Uneven, Form::UnevenInPlace};
      for (const Variant* v : pick(r, {"pairwise"})) {
        // Two of the four forms per (dtype, count) and transport, turning.
        size_t turn = turn_of(*v);
        for (DType dtype : kAllDTypes) {
          for (size_t n : small_counts()) {
            ++turn;
            for (size_t k = 0; k < std::size(forms); ++k) {
              if (in_turn(2 * turn, k, std::size(forms), 2)) {
                check_all_to_all(r, *v, dtype, n, forms[k]);
              }
            }
          }
        }
        check_all_to_all(r, *v, DType::Float32, large_count(DType::Float32) / r.size,
                         turn_of(*v) == 0 ? Form::Tensor : Form::TensorInPlace);
      }
      check_all_to_all(r, r.variants.back(), DType::UInt8, large_count(DType::UInt8) / r.size,
                       Form::Uneven);
      TCPStore store({.host = r.host, .port = r.port});
      for (const Variant* v : pick(r, {"dissemination"})) {
        for (int round = 0; round < 3; ++round) check_barrier(r, *v, store, round);
      }
    });
  }
}

// ---- send/recv and coalescing.

// Several tags between each rank and its ring neighbours, received in a different order than
// sent: matching is by (peer, tag), in posting order within a tag.
void check_send_recv(Rank& r, const Variant& v, DType dtype, size_t n) {
  const int next = (v.pg->rank() + 1) % v.pg->size();
  const int prev = (v.pg->rank() + v.pg->size() - 1) % v.pg->size();
  const std::string where =
      r.where(v, "send/recv", dtype, "-", n, fmt::format("to {} from {}", next, prev));
  const uint64_t salt = r.salt();
  // Message m goes with kTags[m]; the receiver posts them in kRecvOrder.
  static constexpr uint64_t kTags[] = {3, 1, 3, 2, uint64_t{1} << 40, 0};
  static constexpr size_t kRecvOrder[] = {1, 0, 5, 3, 2, 4};
  constexpr size_t kMessages = std::size(kTags);
  std::vector<Buffer> sent, received;
  for (size_t m = 0; m < kMessages; ++m) {
    sent.emplace_back(v.arena.get(), dtype, n);
    sent.back().fill([&](size_t i) { return pattern(dtype, salt, v.pg->rank(), i, m); });
    received.emplace_back(v.arena.get(), dtype, n);
    received.back().fill([&](size_t i) { return sentinel(dtype, salt, i); });
  }
  std::vector<std::shared_ptr<Work>> works;
  for (size_t m = 0; m < kMessages; ++m) {
    works.push_back(v.pg->send(sent[m].tensor(), next, kTags[m]));
  }
  for (size_t m : kRecvOrder) works.push_back(v.pg->recv(received[m].tensor(), prev, kTags[m]));
  for (auto& work : works) wait_for(work, where);
  for (size_t m = 0; m < kMessages; ++m) {
    r.report.expect(where, fmt::format("message {} (tag {})", m, kTags[m]), received[m],
                    [&](size_t i) { return pattern(dtype, salt, prev, i, m); });
    r.report.expect(where, fmt::format("sent message {} (must be unchanged)", m), sent[m],
                    [&](size_t i) { return pattern(dtype, salt, v.pg->rank(), i, m); });
  }
}

// A large message each way between pairs (0, 1), (2, 3), ...: the lower rank sends first, so
// that no send waits on a receive that is queued behind another send.
void check_send_recv_large(Rank& r, const Variant& v) {
  const int peer = v.pg->rank() ^ 1;
  if (peer >= v.pg->size()) {
    r.salt();  // keep the salts in step with the other ranks
    return;
  }
  const DType dtype = DType::Float32;
  const size_t n = large_count(dtype);
  const std::string where =
      r.where(v, "send/recv (large)", dtype, "-", n, fmt::format("peer {}", peer));
  const uint64_t salt = r.salt();
  Buffer out(v.arena.get(), dtype, n), in(v.arena.get(), dtype, n);
  out.fill([&](size_t i) { return pattern(dtype, salt, v.pg->rank(), i); });
  in.fill([&](size_t i) { return sentinel(dtype, salt, i); });
  if (v.pg->rank() < peer) {
    auto sent = v.pg->send(out.tensor(), peer, 9);
    auto received = v.pg->recv(in.tensor(), peer, 9);
    wait_for(sent, where);
    wait_for(received, where);
  } else {
    auto received = v.pg->recv(in.tensor(), peer, 9);
    auto sent = v.pg->send(out.tensor(), peer, 9);
    wait_for(received, where);
    wait_for(sent, where);
  }
  r.report.expect(where, "received", in, [&](size_t i) { return pattern(dtype, salt, peer, i); });
}

// Point to point interleaved with a collective: they run in issue order on every rank.
void check_send_recv_around_collective(Rank& r, const Variant& v) {
  const int next = (v.pg->rank() + 1) % v.pg->size();
  const int prev = (v.pg->rank() + v.pg->size() - 1) % v.pg->size();
  const std::string where = r.where(v, "send, all_reduce, recv", DType::Int32, "sum", 7);
  const uint64_t salt = r.salt();
  Buffer out(v.arena.get(), DType::Int32, 7), in(v.arena.get(), DType::Int32, 7);
  out.fill([&](size_t i) { return pattern(DType::Int32, salt, v.pg->rank(), i); });
  const Reduction red(DType::Int32, ReduceOp::Sum, v.pg->size(), salt);
  Buffer reduced(v.arena.get(), DType::Int32, 7);
  reduced.fill([&](size_t i) { return red.input(v.pg->rank(), i); });
  const uint64_t first = v.pg->sequence_number();
  auto sent = v.pg->send(out.tensor(), next, 5);
  auto all = v.pg->all_reduce(reduced.tensor());
  auto received = v.pg->recv(in.tensor(), prev, 5);
  wait_for(sent, where);
  wait_for(all, where);
  wait_for(received, where);
  if (v.pg->sequence_number() != first + 1) {
    r.report.add(fmt::format("{}: sequence number {} after one collective from {}", where,
                             v.pg->sequence_number(), first));
  }
  r.report.expect(where, "received", in,
                  [&](size_t i) { return pattern(DType::Int32, salt, prev, i); });
  r.report.expect(where, "all_reduce", reduced, [&](size_t i) { return red.expected(i); });
}

// One coalesced unit of several collectives (and send/recv) in every form a group may stage.
void check_coalesced(Rank& r, const Variant& v, size_t n) {
  const size_t p = v.pg->size();
  const int last = v.pg->size() - 1;
  const std::string where = r.where(v, "coalesced", DType::Float32, "mixed", n);
  const uint64_t salt = r.salt();
  const Reduction sum_f32(DType::Float32, ReduceOp::Sum, v.pg->size(), salt);
  const Reduction max_i32(DType::Int32, ReduceOp::Max, v.pg->size(), salt + 1);
  const Reduction avg_f16(DType::Float16, ReduceOp::Avg, v.pg->size(), salt + 2);
  const Reduction prod_f64(DType::Float64, ReduceOp::Prod, v.pg->size(), salt + 3);

  Buffer a(v.arena.get(), DType::Float32, n);
  a.fill([&](size_t i) { return sum_f32.input(v.pg->rank(), i); });
  Buffer b_in(v.arena.get(), DType::Int32, n), b_out(v.arena.get(), DType::Int32, n);
  b_in.fill([&](size_t i) { return max_i32.input(v.pg->rank(), i); });
  Buffer c(v.arena.get(), DType::Int64, n);
  c.fill([&](size_t i) {
    return v.pg->rank() == last ? pattern(DType::Int64, salt, last, i)
                                : sentinel(DType::Int64, salt, i);
  });
  const std::vector<size_t> gather_offsets = block_offsets(std::vector<size_t>(p, n), 1);
  Buffer d_in(v.arena.get(), DType::BFloat16, n),
      d_out(v.arena.get(), DType::BFloat16, gather_offsets.back());
  d_in.fill([&](size_t i) { return pattern(DType::BFloat16, salt, v.pg->rank(), i); });
  std::vector<Tensor> d_list;
  for (size_t q = 0; q < p; ++q) d_list.push_back(d_out.tensor(gather_offsets[q], n));
  Buffer e_in(v.arena.get(), DType::Float16, p * n), e_out(v.arena.get(), DType::Float16, n);
  e_in.fill([&](size_t i) { return avg_f16.input(v.pg->rank(), i); });
  Buffer f_in(v.arena.get(), DType::UInt8, p * n), f_out(v.arena.get(), DType::UInt8, p * n);
  f_in.fill([&](size_t i) { return pattern(DType::UInt8, salt, v.pg->rank(), i % n, i / n); });
  Buffer g(v.arena.get(), DType::Float64, n);
  g.fill([&](size_t i) { return prod_f64.input(v.pg->rank(), i); });
  Buffer h_out(v.arena.get(), DType::Int8, n), h_in(v.arena.get(), DType::Int8, n);
  h_out.fill([&](size_t i) { return pattern(DType::Int8, salt, v.pg->rank(), i); });

  std::vector<std::shared_ptr<Work>> works;
  const uint64_t first = v.pg->sequence_number();
  v.pg->start_coalescing();
  works.push_back(v.pg->all_reduce(a.tensor()));
  works.push_back(v.pg->all_reduce(b_in.tensor(), b_out.tensor(), ReduceOp::Max));
  works.push_back(v.pg->broadcast(c.tensor(), last));
  works.push_back(v.pg->all_gather(d_list, d_in.tensor()));
  works.push_back(v.pg->reduce_scatter_tensor(e_out.tensor(), e_in.tensor(), ReduceOp::Avg));
  works.push_back(v.pg->all_to_all(f_out.tensor(), f_in.tensor()));
  works.push_back(v.pg->reduce(g.tensor(), 0, ReduceOp::Prod));
  if (v.pg->size() > 1) {
    works.push_back(v.pg->send(h_out.tensor(), (v.pg->rank() + 1) % v.pg->size(), 11));
    works.push_back(
        v.pg->recv(h_in.tensor(), (v.pg->rank() + v.pg->size() - 1) % v.pg->size(), 11));
  }
  std::shared_ptr<Work> unit = v.pg->end_coalescing();
  wait_for(unit, where);
  // Seven collectives; send and recv are not numbered.
  if (v.pg->sequence_number() != first + 7) {
    r.report.add(fmt::format("{}: sequence number {} after 7 collectives from {}", where,
                             v.pg->sequence_number(), first));
  }
  for (size_t k = 0; k < works.size(); ++k) {
    if (!works[k]->is_completed() || !works[k]->is_success()) {
      r.report.add(
          fmt::format("{}: operation {} not complete and successful when the unit is", where, k));
    }
  }
  r.report.expect(where, "all_reduce sum float32", a,
                  [&](size_t i) { return sum_f32.expected(i); });
  r.report.expect(where, "all_reduce max int32", b_out,
                  [&](size_t i) { return max_i32.expected(i); });
  r.report.expect(where, "broadcast int64", c,
                  [&](size_t i) { return pattern(DType::Int64, salt, last, i); });
  for (size_t q = 0; q < p; ++q) {
    r.report.expect(where, fmt::format("all_gather bfloat16 block {}", q), d_out, gather_offsets[q],
                    n, [&](size_t i) { return pattern(DType::BFloat16, salt, q, i); });
  }
  r.report.expect(where, "reduce_scatter avg float16", e_out,
                  [&](size_t i) { return avg_f16.expected(v.pg->rank() * n + i); });
  for (size_t j = 0; j < p; ++j) {
    r.report.expect(where, fmt::format("all_to_all uint8 block {}", j), f_out, j * n, n,
                    [&](size_t i) { return pattern(DType::UInt8, salt, j, i, v.pg->rank()); });
  }
  if (v.pg->rank() == 0) {
    r.report.expect(where, "reduce prod float64 on root 0", g,
                    [&](size_t i) { return prod_f64.expected(i); });
  }
  if (v.pg->size() > 1) {
    const int prev = (v.pg->rank() + v.pg->size() - 1) % v.pg->size();
    r.report.expect(where, "recv int8", h_in,
                    [&](size_t i) { return pattern(DType::Int8, salt, prev, i); });
  }
}

// Every rank receives from both neighbours before it sends to them, in one coalesced unit: legal
// in a group (NCCL's batch_isend_irecv), a deadlock if the sends and receives ran one by one.
void check_coalesced_receives_first(Rank& r, const Variant& v, size_t n) {
  const int p = v.pg->size();
  const int next = (v.pg->rank() + 1) % p;
  const int prev = (v.pg->rank() + p - 1) % p;
  const std::string where = r.where(v, "coalesced recv before send", DType::Int32, "-", n);
  const uint64_t salt = r.salt();
  Buffer from_prev(v.arena.get(), DType::Int32, n), from_next(v.arena.get(), DType::Int32, n);
  Buffer to_next(v.arena.get(), DType::Int32, n), to_prev(v.arena.get(), DType::Int32, n);
  to_next.fill([&](size_t i) { return pattern(DType::Int32, salt, v.pg->rank(), i, 1); });
  to_prev.fill([&](size_t i) { return pattern(DType::Int32, salt, v.pg->rank(), i, 2); });
  v.pg->start_coalescing();
  v.pg->recv(from_prev.tensor(), prev, 21);
  v.pg->recv(from_next.tensor(), next, 22);
  v.pg->send(to_next.tensor(), next, 21);
  v.pg->send(to_prev.tensor(), prev, 22);
  wait_for(v.pg->end_coalescing(), where);
  r.report.expect(where, "from the previous rank", from_prev,
                  [&](size_t i) { return pattern(DType::Int32, salt, prev, i, 1); });
  r.report.expect(where, "from the next rank", from_next,
                  [&](size_t i) { return pattern(DType::Int32, salt, next, i, 2); });
}

TEST_CASE("send/recv match by peer and tag in posting order; coalesced units complete together",
          "[conformance][p2p]") {
  for (int size : world_sizes()) {
    run_world(size, {"ring", "recursive_doubling"}, [](Rank& r) {
      // Point to point does not depend on the algorithm: the ring variants, one per transport.
      for (const Variant* v : pick(r, {"ring"})) {
        if (r.size > 1) {
          // Half the counts per dtype and transport, turning.
          size_t turn = turn_of(*v);
          for (DType dtype : kAllDTypes) {
            for (size_t n : small_counts()) {
              if (in_turn(++turn, 0, 2)) check_send_recv(r, *v, dtype, n);
            }
          }
          check_send_recv_large(r, *v);
          check_send_recv_around_collective(r, *v);
        }
      }
      for (const Variant& v : r.variants) {
        size_t turn = turn_of(v);
        for (size_t n : small_counts()) {
          if (in_turn(++turn, 0, 2)) check_coalesced(r, v, n);
        }
        // Nothing coalesced: a Work that is already complete.
        v.pg->start_coalescing();
        wait_for(v.pg->end_coalescing(), r.where(v, "coalesced (empty)", DType::Float32, "-", 0));
      }
      for (const Variant* v : pick(r, {"ring"})) {
        check_coalesced(r, *v, large_count(DType::Float32) / 4);
        if (r.size > 1) {
          check_coalesced_receives_first(r, *v, 5);
          check_coalesced_receives_first(r, *v, large_count(DType::Int32));
        }
      }
    });
  }
}

// ---- Many collectives in flight.

// A batch of collectives of every kind issued back to back before any is waited for, the forms
// the group stages through its own buffers among them: they run in issue order and stay apart
// (tags, scratch and staging buffers of one never meet another's).
std::vector<Issued> start_batch(Rank& r, const Variant& v, size_t n) {
  const int last = v.pg->size() - 1;
  std::vector<Issued> batch;
  batch.push_back(start_all_reduce(r, v, DType::Float32, ReduceOp::Sum, n, true));
  batch.push_back(start_all_gather(r, v, DType::BFloat16, n, Form::ListScattered, false));
  batch.push_back(start_reduce_scatter(r, v, DType::Int32, ReduceOp::BXor, n, Form::ListScattered));
  batch.push_back(start_all_gather(r, v, DType::Int8, n, Form::ListScatteredInPlace, true));
  batch.push_back(start_reduce(r, v, DType::Float64, ReduceOp::Max, n, last, false));
  batch.push_back(start_broadcast(r, v, DType::UInt8, n, v.pg->size() / 2));
  batch.push_back(start_gather(r, v, DType::Float16, n, 0, Form::ListScattered));
  batch.push_back(start_scatter(r, v, DType::Int64, n, last, Form::ListScattered));
  batch.push_back(start_all_to_all(r, v, DType::Bool, n, Form::Uneven));
  batch.push_back(
      start_reduce_scatter(r, v, DType::Float16, ReduceOp::Avg, n, Form::UnevenInPlace));
  batch.push_back(start_all_reduce(r, v, DType::Int64, ReduceOp::Prod, n, false));
  batch.push_back(start_all_gather(r, v, DType::Float32, n, Form::Uneven, false));
  batch.push_back(start_all_to_all(r, v, DType::Float32, n, Form::TensorInPlace));
  batch.push_back(start_reduce(r, v, DType::BFloat16, ReduceOp::PremulSum, n, 0, true));
  return batch;
}

TEST_CASE("collectives issued back to back before any wait run in order and stay apart",
          "[conformance][async]") {
  for (int size : world_sizes()) {
    run_world(size, {"auto"}, [](Rank& r) {
      for (const Variant& v : r.variants) {
        std::vector<size_t> counts = {7, 1031};
        if (turn_of(v) == 1) counts.push_back(large_count(DType::Float32) / 16);
        for (size_t n : counts) {
          // Two batches in flight; the last one issued is waited for first.
          std::vector<Issued> all = start_batch(r, v, n);
          for (Issued& issued : start_batch(r, v, n)) all.push_back(std::move(issued));
          for (auto it = all.rbegin(); it != all.rend(); ++it) finish(*it);
        }
      }
      // Two groups at once, their calls interleaved: each runs on its own, in its own order.
      std::vector<Issued> shm_off = start_batch(r, r.variants.front(), 1031);
      std::vector<Issued> shm_on = start_batch(r, r.variants.back(), 1031);
      for (size_t k = 0; k < shm_off.size(); ++k) {
        finish(shm_on[shm_on.size() - 1 - k]);
        finish(shm_off[k]);
      }
    });
  }
}

// ---- Every algorithm name, and zero elements.

// Every collective on zero elements, with null data (legal when count is 0).
void check_zero_sized(Rank& r, const Variant& v, DType dtype) {
  const size_t p = v.pg->size();
  {
    const Tensor none{nullptr, 0, dtype, suite_device()};
    const std::vector<Tensor> nones(p, none);
    const std::vector<size_t> zeros(p, 0);
    const ReduceOp op = dtype == DType::Bool ? ReduceOp::BOr : ReduceOp::Sum;
    const int root = v.pg->size() - 1;
    const bool on_root = v.pg->rank() == root;
    auto where = [&](std::string_view collective) {
      return r.where(v, collective, dtype, describe(op), 0, "null data");
    };
    wait_for(v.pg->all_reduce(none, op), where("all_reduce (in place)"));
    wait_for(v.pg->all_reduce(none, none, op), where("all_reduce"));
    wait_for(v.pg->reduce(none, root, op), where("reduce (in place)"));
    wait_for(v.pg->reduce(none, none, root, op), where("reduce"));
    wait_for(v.pg->broadcast(none, root), where("broadcast"));
    wait_for(v.pg->all_gather(nones, none), where("all_gather (list)"));
    wait_for(v.pg->all_gather_into_tensor(none, none), where("all_gather_into_tensor"));
    wait_for(v.pg->all_gather_uneven(none, none, zeros), where("all_gather_uneven"));
    wait_for(v.pg->reduce_scatter(none, nones, op), where("reduce_scatter (list)"));
    wait_for(v.pg->reduce_scatter_tensor(none, none, op), where("reduce_scatter_tensor"));
    wait_for(v.pg->reduce_scatter_uneven(none, none, zeros, op), where("reduce_scatter_uneven"));
    wait_for(v.pg->gather(on_root ? nones : std::vector<Tensor>{}, none, root),
             where("gather (list)"));
    wait_for(v.pg->gather_into_tensor(none, none, root), where("gather_into_tensor"));
    wait_for(v.pg->scatter(none, on_root ? nones : std::vector<Tensor>{}, root),
             where("scatter (list)"));
    wait_for(v.pg->scatter_from_tensor(none, none, root), where("scatter_from_tensor"));
    wait_for(v.pg->all_to_all(none, none), where("all_to_all"));
    wait_for(v.pg->all_to_all(none, none, zeros, zeros), where("all_to_all (splits)"));
    if (v.pg->size() > 1) {
      auto sent = v.pg->send(none, (v.pg->rank() + 1) % v.pg->size(), 4);
      auto received = v.pg->recv(none, (v.pg->rank() + v.pg->size() - 1) % v.pg->size(), 4);
      wait_for(sent, where("send"));
      wait_for(received, where("recv"));
    }
    v.pg->start_coalescing();
    v.pg->all_reduce(none, op);
    v.pg->all_gather(nones, none);
    v.pg->all_to_all(none, none);
    wait_for(v.pg->end_coalescing(), where("coalesced"));
  }
}

// Each collective once, on a small count: under a name that does not implement a collective the
// backend must ignore the name for it and run the planner's choice (planner.h).
void check_each_collective(Rank& r, const Variant& v) {
  const int last = v.pg->size() - 1;
  check_all_reduce(r, v, DType::Float32, ReduceOp::Sum, 1031, true);
  check_all_reduce(r, v, DType::Int8, ReduceOp::Max, 7, false);
  check_reduce(r, v, DType::Float64, ReduceOp::Sum, 1031, last, true);
  check_reduce(r, v, DType::UInt8, ReduceOp::BOr, 7, v.pg->size() / 2, false);
  check_broadcast(r, v, DType::Int64, 1031, v.pg->size() / 2);
  check_all_gather(r, v, DType::Float16, 1031, Form::Tensor, false);
  check_all_gather(r, v, DType::Int32, 7, Form::ListScattered, true);
  check_all_gather(r, v, DType::Bool, 7, Form::Uneven, false);
  check_reduce_scatter(r, v, DType::Float32, ReduceOp::Sum, 1031, Form::Tensor);
  check_reduce_scatter(r, v, DType::Int64, ReduceOp::Prod, 7, Form::ListScattered);
  check_gather(r, v, DType::Float64, 1031, last, Form::Tensor);
  check_scatter(r, v, DType::BFloat16, 7, 0, Form::ListScattered);
  check_all_to_all(r, v, DType::BFloat16, 7, Form::Uneven);
  check_all_to_all(r, v, DType::Int32, 1031, Form::TensorInPlace);
  check_all_to_all(r, v, DType::UInt8, 7, Form::UnevenInPlace);
  wait_for(v.pg->barrier(), r.where(v, "barrier", DType::Float32, "-", 0));
  if (v.algo == "auto" || v.algo.empty()) {
    // Past the planner's crossovers: auto switches to the bandwidth algorithms.
    check_all_reduce(r, v, DType::Float32, ReduceOp::Sum, large_count(DType::Float32), true);
    check_all_gather(r, v, DType::Float32, large_count(DType::Float32) / v.pg->size(),
                     Form::TensorInPlace, false);
  }
}

// Each variant once, and a group whose ranks run in the reverse of the world's order (group ranks
// need not follow world ranks), over each transport.
void check_every_variant(Rank& r) {
  size_t turn = 0;
  for (const Variant& v : r.variants) {
    check_each_collective(r, v);
    check_zero_sized(r, v, kAllDTypes[turn++ % std::size(kAllDTypes)]);
  }
  std::vector<int> reversed(r.size);
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  for (const std::string shm : {"0", "1"}) {
    NewGroupOptions options;
    options.name = "reversed-shm" + shm;
    options.backend_settings = {{"shm", shm}};
    const Variant v{"auto", shm, r.world->new_group(reversed, options), nullptr};
    if (v.pg->rank() != r.size - 1 - r.rank) {
      r.report.add(
          fmt::format("rank {}/{}: rank {} in the reversed group", r.rank, r.size, v.pg->rank()));
    }
    check_each_collective(r, v);
  }
}

TEST_CASE("every algorithm name runs every collective, also on zero elements with null data",
          "[conformance][algorithms]") {
  for (int size : world_sizes()) {
    // Falling back is the planner's business, not the transport's: sockets only, which are
    // cheaper to set up than shared memory (the families above run each implementing algorithm
    // over both transports).
    run_world(size, kAllAlgorithms, check_every_variant, {"0"});
  }
}

// ---- WEFT_DEBUG=detail.

// Runs `call`; under WEFT_DEBUG=detail a Desync it throws is recorded, and the rank goes on (every
// rank saw the same fingerprints, so none posted the collective and the group is still in step).
template <typename F>
void without_desync(Rank& r, std::string_view what, F&& call) {
  try {
    call();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Desync) throw;
    r.report.add(fmt::format("rank {}/{} {}: a legal call was taken for a desync: {}", r.rank,
                             r.size, what, e.what()));
  }
}

// Every collective in every form under WEFT_DEBUG=detail, where each call first compares a
// fingerprint of itself across ranks: calls that differ per rank only as the API allows (uneven
// counts, rooted lists, splits, ignored outputs) must run, and a real mismatch must be refused.
void check_debug_detail(Rank& r, const Variant& v) {
  const size_t n = 7;
  const int middle = v.pg->size() / 2;
  const Form forms[] = {
      Form::List,   Form::ListScattered, Form::ListInPlace, Form::ListScatteredInPlace,
      Form::Tensor, Form::TensorInPlace, Form::Uneven,      Form::UnevenInPlace};
  for (Form form : forms) {
    const std::string name(form_name(form));
    without_desync(r, "all_gather " + name,
                   [&] { check_all_gather(r, v, DType::Int32, n, form, false); });
    if (is_list(form)) {
      without_desync(r, "all_gather of uneven sizes " + name,
                     [&] { check_all_gather(r, v, DType::Int32, n, form, true); });
    }
    without_desync(r, "reduce_scatter " + name,
                   [&] { check_reduce_scatter(r, v, DType::Float32, ReduceOp::Sum, n, form); });
    if (!is_uneven(form)) {
      without_desync(r, "gather " + name,
                     [&] { check_gather(r, v, DType::UInt8, n, middle, form); });
      without_desync(r, "scatter " + name,
                     [&] { check_scatter(r, v, DType::UInt8, n, middle, form); });
    }
    if (!is_list(form)) {
      without_desync(r, "all_to_all " + name,
                     [&] { check_all_to_all(r, v, DType::Int64, n, form); });
    }
  }
  for (bool in_place : {true, false}) {
    without_desync(r, "all_reduce",
                   [&] { check_all_reduce(r, v, DType::BFloat16, ReduceOp::Max, n, in_place); });
    without_desync(r, "reduce",
                   [&] { check_reduce(r, v, DType::Int8, ReduceOp::Sum, n, middle, in_place); });
  }
  without_desync(r, "broadcast",
                 [&] { check_broadcast(r, v, DType::Float64, n, v.pg->size() - 1); });
  without_desync(r, "coalesced", [&] { check_coalesced(r, v, n); });
  without_desync(r, "zero-sized", [&] { check_zero_sized(r, v, DType::Int32); });
  if (v.pg->size() == 1) return;

  // A real mismatch: every rank passes a different count. A group of its own, with a short
  // timeout, so that a mismatch that is not refused fails fast instead of hanging the suite.
  std::vector<int> everyone(v.pg->size());
  std::iota(everyone.begin(), everyone.end(), 0);
  NewGroupOptions options;
  options.name = "mismatch";
  options.timeout = seconds(5);
  if (!v.algo.empty()) options.backend_settings = {{"algo", v.algo}, {"shm", v.shm}};  // tcp
  auto group = r.world->new_group(everyone, options);
  Buffer x(DType::Float32, 5 + v.pg->rank());
  x.fill([](size_t i) { return float_bits(DType::Float32, static_cast<double>(i)); });
  const std::string where =
      r.where(v, "all_reduce (counts differ per rank)", DType::Float32, "sum", x.count());
  try {
    group->all_reduce(x.tensor())->wait();
    r.report.add(where + ": completed; expected Error(Desync)");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Desync) {
      r.report.add(
          fmt::format("{}: {} instead of Desync: {}", where, error_code_name(e.code()), e.what()));
    }
  }
}

TEST_CASE("under WEFT_DEBUG=detail every legal call runs and a mismatched one is a Desync",
          "[conformance][debug]") {
  for (int size : world_sizes_among({1, 2, 3, 5})) {
    run_world(
        size, {"auto"}, [](Rank& r) { check_debug_detail(r, r.variants.front()); }, {"1"}, true);
  }
}

// ---- Argument errors.

// Runs `call`, which must throw Error(InvalidArgument) whose message names `argument`.
template <typename F>
void expect_invalid(Rank& r, std::string_view what, std::string_view argument, F&& call) {
  const std::string where = fmt::format("rank {}/{} {}", r.rank, r.size, what);
  try {
    call();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::InvalidArgument) {
      r.report.add(fmt::format("{}: {} instead of InvalidArgument: {}", where,
                               error_code_name(e.code()), e.what()));
    } else if (std::string_view detail = e.what();
               detail.substr(std::min(detail.find("InvalidArgument:"), detail.size()))
                   .find(argument) == std::string_view::npos) {
      r.report.add(
          fmt::format("{}: the message does not name \"{}\": {}", where, argument, e.what()));
    }
    return;
  } catch (const std::exception& e) {
    r.report.add(fmt::format("{}: not a weft::Error: {}", where, e.what()));
    return;
  }
  // The call was issued on this rank alone: the group cannot be trusted afterwards.
  throw std::runtime_error(
      fmt::format("{}: no error (expected InvalidArgument naming \"{}\")", where, argument));
}

// Under symmetric_mode(): a tensor that starts inside a variant's symmetric buffer and ends past
// it is refused with InvalidArgument naming the rank, the group and the op, whether the collective
// has a zero-copy path (all_reduce) or not (reduce), and the group goes on.
void check_straddling(Rank& r, const Variant& v) {
  const SymmetricBuffer& buffer = v.arena->buffer();
  // Two floats: the first in the buffer's last four bytes, the second past its end.
  const Tensor straddling{static_cast<unsigned char*>(buffer.data()) + buffer.size() - 4, 2,
                          DType::Float32, Device::cpu()};
  const std::vector<std::pair<std::string, std::function<std::shared_ptr<Work>()>>> calls = {
      {"all_reduce", [&] { return v.pg->all_reduce(straddling); }},
      {"reduce", [&] { return v.pg->reduce(straddling, 0); }}};
  for (const auto& [op, call] : calls) {
    const std::string where =
        r.where(v, op, DType::Float32, "sum", 2, "straddling the symmetric buffer's end");
    try {
      call()->wait();
      r.report.add(fmt::format("{}: no error (expected InvalidArgument)", where));
    } catch (const Error& e) {
      const std::string what = e.what();
      const std::string names =
          fmt::format("rank {}/{} group \"{}\" {}", v.pg->rank(), v.pg->size(), v.pg->name(), op);
      if (e.code() != ErrorCode::InvalidArgument || what.find("straddles") == std::string::npos ||
          what.find(names) == std::string::npos) {
        r.report.add(
            fmt::format("{}: expected InvalidArgument naming \"{}\" and saying it straddles, "
                        "got {}: {}",
                        where, names, error_code_name(e.code()), what));
      }
    }
  }
  check_all_reduce(r, v, DType::Float32, ReduceOp::Sum, 1031, false);
}

TEST_CASE("in symmetric mode a tensor straddling a symmetric buffer's end is InvalidArgument",
          "[conformance][symmetric]") {
  if (!symmetric_mode()) {
    WARN("skipped: runs under WEFT_TEST_SYMMETRIC=1 (weft-conformance --symmetric) only");
    return;
  }
  for (int size : world_sizes_among({1, 2, 3})) {
    run_world(size, {"auto"}, [](Rank& r) {
      for (const Variant& v : r.variants) check_straddling(r, v);
    });
  }
}

TEST_CASE("argument errors are InvalidArgument naming the argument, and issue nothing",
          "[conformance][errors]") {
  for (int size : world_sizes_among({1, 2, 3})) {
    run_world(size, {"auto"}, [](Rank& r) {
      const Variant& v = r.variants.front();
      ProcessGroup& pg = *v.pg;
      const size_t p = r.size;
      const int root = r.size - 1;
      const bool on_root = r.rank == root;
      const uint64_t before = pg.sequence_number();
      Buffer x(DType::Float32, 4 * p), y(DType::Float32, 3), z(DType::Int32, 4 * p);
      std::vector<Tensor> blocks;
      for (size_t q = 0; q < p; ++q) blocks.push_back(x.tensor(4 * q, 4));

      // Sizes.
      expect_invalid(r, "all_reduce with a shorter output", "output",
                     [&] { pg.all_reduce(x.tensor(0, 4), y.tensor()); });
      if (on_root) {
        expect_invalid(r, "reduce with a shorter output on root", "output",
                       [&] { pg.reduce(x.tensor(0, 4), y.tensor(), root); });
      }
      expect_invalid(r, "all_gather_into_tensor with a wrong output size", "output",
                     [&] { pg.all_gather_into_tensor(x.tensor(), y.tensor()); });
      expect_invalid(r, "all_gather with input not its entry's size", "input",
                     [&] { pg.all_gather(blocks, y.tensor()); });
      expect_invalid(r, "reduce_scatter_tensor with a wrong input size", "input",
                     [&] { pg.reduce_scatter_tensor(y.tensor(), x.tensor()); });
      expect_invalid(r, "all_gather_uneven with an output not the sum of counts", "output", [&] {
        pg.all_gather_uneven(x.tensor(), x.tensor(0, 1), std::vector<size_t>(p, 1));
      });
      expect_invalid(r, "reduce_scatter_uneven with an output not counts[rank]", "output", [&] {
        pg.reduce_scatter_uneven(y.tensor(), x.tensor(0, p), std::vector<size_t>(p, 1));
      });
      expect_invalid(r, "all_to_all with input splits not summing to the input", "input", [&] {
        pg.all_to_all(x.tensor(), x.tensor(), std::vector<size_t>(p, 4), std::vector<size_t>(p, 3));
      });
      if (r.size > 1) {
        expect_invalid(r, "all_to_all with input not a multiple of the size", "input",
                       [&] { pg.all_to_all(x.tensor(), x.tensor(0, 4 * p - 1)); });
      }
      if (r.size > 1) {
        expect_invalid(r, "send of a null tensor with elements", "tensor", [&] {
          pg.send(Tensor{nullptr, 3, DType::Float32, suite_device()}, (r.rank + 1) % r.size);
        });
      }
      // dtype mismatch.
      expect_invalid(r, "all_reduce of float32 into int32", "output",
                     [&] { pg.all_reduce(x.tensor(), z.tensor()); });

      // Roots and peers out of range.
      for (int bad : {-1, r.size}) {
        expect_invalid(r, fmt::format("reduce to root {}", bad), "root",
                       [&] { pg.reduce(x.tensor(), bad); });
        expect_invalid(r, fmt::format("broadcast from root {}", bad), "root",
                       [&] { pg.broadcast(x.tensor(), bad); });
        expect_invalid(r, fmt::format("gather to root {}", bad), "root",
                       [&] { pg.gather_into_tensor(x.tensor(), x.tensor(0, 4), bad); });
        expect_invalid(r, fmt::format("scatter from root {}", bad), "root",
                       [&] { pg.scatter(x.tensor(0, 4), blocks, bad); });
        expect_invalid(r, fmt::format("send to {}", bad), "dst", [&] { pg.send(y.tensor(), bad); });
        expect_invalid(r, fmt::format("recv from {}", bad), "src",
                       [&] { pg.recv(y.tensor(), bad); });
      }
      // To this rank itself: legal (c10d's habit), matched on this rank, numbered nothing.
      {
        std::vector<int32_t> mine = {1, -2, 3}, back(3, 0);
        Buffer sent_buffer(DType::Int32, 3), back_buffer(DType::Int32, 3);  // on the suite's device
        sent_buffer.fill([&](size_t i) { return static_cast<uint32_t>(mine[i]); });
        back_buffer.fill([](size_t) { return uint64_t{0}; });
        auto sent = pg.send(sent_buffer.tensor(), r.rank, 7);
        pg.recv(back_buffer.tensor(), r.rank, 7)->wait();
        sent->wait();
        for (size_t i = 0; i < back.size(); ++i) back[i] = static_cast<int32_t>(back_buffer.get(i));
        if (back != mine) {
          r.report.add(fmt::format("rank {} send/recv to itself gave [{}], not [{}]", r.rank,
                                   fmt::join(back, ", "), fmt::join(mine, ", ")));
        }
      }

      // Ops a dtype cannot take.
      for (DType dtype : kAllDTypes) {
        Buffer t(dtype, 4 * p), u(dtype, 4);
        for (ReduceOp op : all_ops()) {
          if (op_defined(dtype, op)) continue;
          const std::string what = fmt::format("{} on {}", describe(op), dtype_name(dtype));
          const std::string names = std::string(reduce_op_name(op));
          expect_invalid(r, "all_reduce " + what, names, [&] { pg.all_reduce(t.tensor(), op); });
          expect_invalid(r, "reduce " + what, names, [&] { pg.reduce(t.tensor(), 0, op); });
          expect_invalid(r, "reduce_scatter_tensor " + what, names,
                         [&] { pg.reduce_scatter_tensor(u.tensor(), t.tensor(), op); });
          expect_invalid(r, "reduce_scatter_uneven " + what, names, [&] {
            pg.reduce_scatter_uneven(u.tensor(), t.tensor(), std::vector<size_t>(p, 4), op);
          });
        }
      }

      // Lists and counts of the wrong length.
      std::vector<Tensor> longer = blocks, shorter = blocks;
      longer.push_back(y.tensor());
      shorter.pop_back();
      expect_invalid(r, "all_gather with one output too many", "outputs",
                     [&] { pg.all_gather(longer, x.tensor(0, 4)); });
      expect_invalid(r, "reduce_scatter with one input too few", "inputs",
                     [&] { pg.reduce_scatter(x.tensor(0, 4), shorter); });
      expect_invalid(r, "all_gather_uneven with counts one too long", "counts", [&] {
        pg.all_gather_uneven(x.tensor(), x.tensor(0, 4), std::vector<size_t>(p + 1, 4));
      });
      expect_invalid(r, "reduce_scatter_uneven with counts one too short", "counts", [&] {
        pg.reduce_scatter_uneven(x.tensor(0, 4), x.tensor(), std::vector<size_t>(p - 1, 4));
      });
      expect_invalid(r, "all_to_all with input_splits one too long", "input_splits", [&] {
        pg.all_to_all(x.tensor(), x.tensor(), std::vector<size_t>(p, 4),
                      std::vector<size_t>(p + 1, 4));
      });
      if (on_root) {
        expect_invalid(r, "gather with one output too many on root", "outputs",
                       [&] { pg.gather(longer, x.tensor(0, 4), root); });
        expect_invalid(r, "scatter with one input too few on root", "inputs",
                       [&] { pg.scatter(x.tensor(0, 4), shorter, root); });
      } else {
        expect_invalid(r, "gather with outputs off root", "outputs",
                       [&] { pg.gather(blocks, x.tensor(0, 4), root); });
        expect_invalid(r, "scatter with inputs off root", "inputs",
                       [&] { pg.scatter(x.tensor(0, 4), blocks, root); });
      }

      // Nothing was issued: the sequence number stands and the group still works.
      if (pg.sequence_number() != before) {
        r.report.add(
            fmt::format("rank {}/{}: refused calls moved the sequence number from {} to {}", r.rank,
                        r.size, before, pg.sequence_number()));
      }
      check_all_reduce(r, v, DType::Float32, ReduceOp::Sum, 7, true);
      TCPStore store({.host = r.host, .port = r.port});
      check_barrier(r, v, store, 0);
    });
  }
}

}  // namespace

namespace conformance {

std::vector<UnsupportedNote>& unsupported_notes() {
  static std::vector<UnsupportedNote> notes;
  return notes;
}

}  // namespace conformance
}  // namespace weft
