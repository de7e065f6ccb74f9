// Symmetric buffers and zero-copy collectives (weft/symmetric_buffer.h, collectives/symmetric.h)
// over the tcp backend's shared memory, on real processes: every dtype and op of all_reduce on 1
// to 8 ranks at offsets off the 8-byte and cache-line grid, in and out of place, sizes 0 to several
// MiB; reduce_scatter, all_gather and broadcast; two groups' buffers at once; and the failure
// rules: a tensor that straddles a buffer's end, a buffer released while in use, ranks that
// disagree, a rank killed with SIGKILL before it posts and one killed mid-reduction (PeerLost
// within 5 s, and nothing left in /dev/shm), a group that cannot share memory.
//
// Every result is checked element by element against a reference computed here from a closed
// form f(rank, i), never with weft's reduce code. Values are small multiples of 1/2 (floating
// sums), {-1, 1/2, 1, 2} (products), so every result is exact in every dtype whatever order the
// ranks reduce in; integers wrap as runtime/reduce.h specifies, computed here modulo 2^bits.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/half.h"
#include "weft/process_group.h"
#include "weft/symmetric_buffer.h"
#include "weft/tcp_store.h"

#include "tests/support/multiproc.h"

namespace weft {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

std::shared_ptr<ProcessGroup> join(uint16_t port, int rank, int size,
                                   milliseconds timeout = seconds(30),
                                   std::map<std::string, std::string> settings = {}) {
  ProcessGroupOptions options;
  options.url = fmt::format("tcp://127.0.0.1:{}", port);
  options.rank = rank;
  options.world_size = size;
  options.timeout = timeout;
  // WEFT_TEST_BACKEND=ucx runs the same cases over the UCX backend paired with host memory
  // (backends/common/host_memory_transport.h); tcp otherwise.
  const char* backend = std::getenv("WEFT_TEST_BACKEND");
  options.backend = backend != nullptr && *backend != '\0' ? backend : "tcp";
  options.backend_settings = std::move(settings);
  return init_process_group(options);
}

// A client of the group's store (rank 0 hosts it), for the tests' own hand-offs between ranks.
std::unique_ptr<TCPStore> side_store(uint16_t port) {
  return std::make_unique<TCPStore>(
      TCPStoreOptions{.host = "127.0.0.1", .port = port, .timeout = seconds(20)});
}

// Rank 0 hosts the store, so it leaves last: rank 1 destroys its group (which may still talk to
// the store) and then says so; rank 0 waits for that. (The other ranks are dead in these tests.)
void leave_before_the_store(std::shared_ptr<ProcessGroup>& pg, TCPStore& side, int rank) {
  if (rank == 1) {
    pg.reset();
    side.set("test/left/1", "1");
  } else if (rank == 0) {
    side.wait({"test/left/1"}, seconds(20));
  }
}

// ---- The reference.

bool is_float(DType d) {
  return d == DType::Float32 || d == DType::Float64 || d == DType::Float16 ||
         d == DType::BFloat16 || d == DType::Float8E4M3 || d == DType::Float8E5M2;
}

// Rank r's input element i, as a double (floating dtypes) or an integer (the others). fp8 holds
// integers exactly only up to 16 (e4m3fn) or 8 (e5m2): its inputs are integers in [-2, 2] or
// [-1, 1], so that sums over up to 5 ranks, and halves of them (premul_sum(0.5)), stay exact.
double float_input(int r, size_t i, ReduceOp op, DType d) {
  if (op == ReduceOp::Prod) {
    static constexpr double kFactors[] = {-1.0, 0.5, 1.0, 2.0};
    return kFactors[(r + i) % 4];
  }
  if (d == DType::Float8E4M3) return static_cast<double>((r * 7 + i * 3) % 5) - 2.0;
  if (d == DType::Float8E5M2) return static_cast<double>((r * 7 + i * 3) % 3) - 1.0;
  return (static_cast<double>((r * 7 + i * 3) % 11) - 5.0) * 0.5;
}
int64_t int_input(int r, size_t i, DType d, ReduceOp op) {
  // A non-canonical true byte from rank 1 on: one rank's input is its result, copied as it is
  // (the conformance suite's convention too).
  if (d == DType::Bool) return (r + i) % 3 == 0 ? (r == 0 ? 1 : 2) : 0;
  if (op == ReduceOp::Prod) return static_cast<int64_t>((r + i) % 3) + 1;
  if (op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor) {
    return static_cast<int64_t>((r * 2654435761u + i * 40503u) & 0xffffffffu) - 0x7fffffff;
  }
  const int64_t v = static_cast<int64_t>((r * 7 + i * 3) % 11);
  return is_unsigned_integral(d) ? v : v - 5;
}

// Writes `value` (a double for floating dtypes, else an integer) as one element of `d` at p.
void store_float(std::byte* p, DType d, double value) {
  switch (d) {
    case DType::Float32: {
      const float f = static_cast<float>(value);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::Float64:
      std::memcpy(p, &value, 8);
      return;
    case DType::Float16: {
      const uint16_t h = float_to_half(static_cast<float>(value));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::Float8E4M3: {
      const uint8_t b = float_to_e4m3fn(static_cast<float>(value));
      std::memcpy(p, &b, 1);
      return;
    }
    case DType::Float8E5M2: {
      const uint8_t b = float_to_e5m2(static_cast<float>(value));
      std::memcpy(p, &b, 1);
      return;
    }
    default: {
      const uint16_t b = float_to_bf16(static_cast<float>(value));
      std::memcpy(p, &b, 2);
      return;
    }
  }
}
void store_int(std::byte* p, DType d, int64_t value) {
  const uint64_t bits = static_cast<uint64_t>(value);
  std::memcpy(p, &bits, dtype_size(d));  // little endian: the low bytes, i.e. modulo 2^bits
}

// Sign-extends (or not) the low bytes of `value` as `d` does: the wrapped value.
int64_t wrap(int64_t value, DType d) {
  switch (d) {
    case DType::Int8:
      return static_cast<int8_t>(value);
    case DType::UInt8:
      return static_cast<uint8_t>(value);
    case DType::Int32:
      return static_cast<int32_t>(value);
    case DType::UInt32:
      return static_cast<uint32_t>(value);
    default:
      return value;
  }
}

// The reduction over `ranks` of element i, written as `d` into `out`.
void reference(std::byte* out, DType d, ReduceOp op, int ranks, size_t i) {
  if (is_float(d)) {
    double acc = 0;
    for (int r = 0; r < ranks; ++r) {
      double v = float_input(r, i, op, d);
      if (op == ReduceOp::PremulSum) v *= op.factor;
      if (r == 0) {
        acc = v;
      } else if (op == ReduceOp::Prod) {
        acc *= v;
      } else if (op == ReduceOp::Min) {
        acc = std::min(acc, v);
      } else if (op == ReduceOp::Max) {
        acc = std::max(acc, v);
      } else {
        acc += v;
      }
    }
    if (op == ReduceOp::Avg) {
      // IEEE division of the exact sum, rounded once in the dtype's arithmetic type.
      acc = d == DType::Float64
                ? acc / ranks
                : static_cast<double>(static_cast<float>(acc) / static_cast<float>(ranks));
    }
    store_float(out, d, acc);
    return;
  }
  if (d == DType::Bool) {
    bool acc = false;
    for (int r = 0; r < ranks; ++r) {
      const bool v = int_input(r, i, d, op) != 0;
      if (r == 0) {
        acc = v;
      } else if (op == ReduceOp::Prod || op == ReduceOp::Min || op == ReduceOp::BAnd) {
        acc = acc && v;
      } else if (op == ReduceOp::BXor) {
        acc = acc != v;
      } else {
        acc = acc || v;
      }
    }
    store_int(out, d, acc ? 1 : 0);
    return;
  }
  const bool is_unsigned = is_unsigned_integral(d);
  int64_t acc = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t v = wrap(int_input(r, i, d, op), d);
    if (r == 0) {
      acc = v;
    } else if (op == ReduceOp::Prod) {
      acc = wrap(static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v)), d);
    } else if (op == ReduceOp::Min) {
      acc = is_unsigned ? static_cast<int64_t>(std::min<uint64_t>(acc, v)) : std::min(acc, v);
    } else if (op == ReduceOp::Max) {
      acc = is_unsigned ? static_cast<int64_t>(std::max<uint64_t>(acc, v)) : std::max(acc, v);
    } else if (op == ReduceOp::BAnd) {
      acc &= v;
    } else if (op == ReduceOp::BOr) {
      acc |= v;
    } else if (op == ReduceOp::BXor) {
      acc ^= v;
    } else {
      acc = wrap(static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v)), d);
    }
  }
  if (op == ReduceOp::Avg) acc = acc / ranks;  // truncating toward zero; sums here never wrap
  store_int(out, d, acc);
}

void fill_input(std::byte* p, DType d, ReduceOp op, int rank, size_t count) {
  const size_t element = dtype_size(d);
  for (size_t i = 0; i < count; ++i) {
    if (is_float(d)) {
      store_float(p + i * element, d, float_input(rank, i, op, d));
    } else {
      store_int(p + i * element, d, int_input(rank, i, d, op));
    }
  }
}

// The ops defined on `d` (runtime/reduce.h).
std::vector<ReduceOp> ops_for(DType d) {
  if (is_float(d)) {
    return {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min,
            ReduceOp::Max, ReduceOp::Avg,  ReduceOp::premul_sum(0.5)};
  }
  if (d == DType::Bool) {
    return {ReduceOp::Sum,  ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
            ReduceOp::BAnd, ReduceOp::BOr,  ReduceOp::BXor};
  }
  return {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
          ReduceOp::Avg, ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor};
}

// Checks every element of `got` against the reference; throws naming the first wrong one.
void check_reduced(const std::byte* got, DType d, ReduceOp op, int ranks, size_t count, int rank,
                   const std::string& what) {
  const size_t element = dtype_size(d);
  std::byte want[8];
  for (size_t i = 0; i < count; ++i) {
    reference(want, d, op, ranks, i);
    if (std::memcmp(got + i * element, want, element) != 0) {
      uint64_t g = 0, w = 0;
      std::memcpy(&g, got + i * element, element);
      std::memcpy(&w, want, element);
      RANK_CHECK(false, "rank {} {} {} {} count {}: element {} is {:#x}, expected {:#x}", rank,
                 what, dtype_name(d), describe(op), count, i, g, w);
    }
  }
}

// A fresh job id per test, so that the /dev/shm check sees only this test's segments (other
// tests and builds on the machine make their own).
std::string unique_job(const char* what) {
  return fmt::format("symtest{}{}{}", what, ::getpid(),
                     Clock::now().time_since_epoch().count() % 1000000);
}

std::vector<std::string> shm_entries(const std::string& job) {
  std::vector<std::string> found;
  const std::string prefix = "weft-" + job + "-";
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* entry = ::readdir(dir)) {
      if (std::string(entry->d_name).starts_with(prefix)) found.push_back(entry->d_name);
    }
    ::closedir(dir);
  }
  return found;
}

// ---- all_reduce, every dtype and op.

void all_reduce_every_dtype_and_op(int ranks) {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(
      ranks,
      [&](int rank) {
        auto pg = join(port, rank, ranks);
        // 1000 elements at most (8 bytes each), twice (in and out), plus misalignment slack.
        auto buffer = pg->allocate_symmetric(16 * 1024 + 64);
        RANK_CHECK(buffer->size() == 16 * 1024 + 64);
        RANK_CHECK(reinterpret_cast<uintptr_t>(buffer->data()) % 4096 == 0);
        auto* base = static_cast<std::byte*>(buffer->data());
        size_t round = 0;
        for (DType d : kAllDTypes) {
          const size_t element = dtype_size(d);
          for (ReduceOp op : ops_for(d)) {
            for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
              // Off the 8-byte and line grid on odd rounds (3 elements in: the reduce kernels
              // need element alignment only, as C++ does), in place on every other one.
              const size_t offset = round % 2 == 1 ? 3 * element : 8 * (round % 5);
              const bool in_place = round % 4 < 2;
              ++round;
              std::byte* in = base + offset;
              std::byte* out = in_place ? in : base + 8 * 1024 + offset;
              fill_input(in, d, op, rank, count);
              if (!in_place) std::memset(out, 0xa5, count * element);
              Tensor input = buffer->view(d, offset, count);
              Tensor output = buffer->view(d, static_cast<size_t>(out - base), count);
              pg->all_reduce(input, output, op)->wait();
              check_reduced(out, d, op, ranks, count, rank,
                            in_place ? "all_reduce in place" : "all_reduce");
              if (!in_place && count > 0) {
                // Out of place leaves the input as it was.
                std::vector<std::byte> again(count * element);
                fill_input(again.data(), d, op, rank, count);
                RANK_CHECK(std::memcmp(again.data(), in, again.size()) == 0,
                           "rank {} {} {}: the input changed", rank, dtype_name(d), describe(op));
              }
            }
          }
        }
      },
      seconds(120));
}

TEST_CASE("symmetric all_reduce matches the reference for every dtype and op on 1 to 4 ranks",
          "[symmetric][multiproc]") {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    DYNAMIC_SECTION(ranks << " ranks") { all_reduce_every_dtype_and_op(ranks); }
  }
}

TEST_CASE("symmetric all_reduce matches the reference for every dtype and op on 5 to 8 ranks",
          "[symmetric][multiproc][slow]") {
  for (int ranks = 5; ranks <= 8; ++ranks) {
    DYNAMIC_SECTION(ranks << " ranks") { all_reduce_every_dtype_and_op(ranks); }
  }
}

TEST_CASE("symmetric all_reduce of 4 MiB sums float32 and bfloat16 exactly on 2, 3 and 8 ranks",
          "[symmetric][multiproc]") {
  for (int ranks : {2, 3, 8}) {
    DYNAMIC_SECTION(ranks << " ranks") {
      const uint16_t port = test::free_port();
      test::run_ranks_ok(
          ranks,
          [&](int rank) {
            auto pg = join(port, rank, ranks);
            const size_t count = (size_t{1} << 20) + 13;  // 4 MiB of float32, odd on purpose
            auto buffer = pg->allocate_symmetric(count * 4 + 4);
            for (DType d : {DType::Float32, DType::BFloat16}) {
              for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
                auto* at = static_cast<std::byte*>(buffer->data()) + 4;  // off the 8-byte grid
                fill_input(at, d, op, rank, count);
                pg->all_reduce(buffer->view(d, 4, count), op)->wait();
                check_reduced(at, d, op, ranks, count, rank, "large all_reduce");
              }
            }
          },
          seconds(120));
    }
  }
}

// ---- The bounce all_reduce: ordinary buffers on one host, through the group's bounce region.

// How many of this process's collectives the flight recorder saw run with `algorithm` (a dump
// into a directory of its own, removed after).
int recorded_with(const std::string& algorithm, int rank) {
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("weft-symtest-trace-{}-{}", ::getpid(), rank);
  std::filesystem::create_directories(dir);
  const auto was = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  const std::vector<std::string> files = dump_trace("symmetric_test: which algorithms ran");
  std::filesystem::current_path(was);
  int found = 0;
  for (const std::string& name : files) {
    const std::filesystem::path file =
        std::filesystem::path(name).is_absolute() ? std::filesystem::path(name) : dir / name;
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    const std::string json = text.str();
    const std::string key = fmt::format("\"algorithm\": \"{}\"", algorithm);
    for (size_t at = json.find(key); at != std::string::npos; at = json.find(key, at + 1)) {
      ++found;
    }
  }
  std::filesystem::remove_all(dir);
  return found;
}

TEST_CASE(
    "bounce all_reduce, reduce_scatter and all_gather of ordinary buffers match the reference for "
    "every dtype and op",
    "[symmetric][bounce][multiproc]") {
  // From 64 KiB of input, all_reduce, reduce_scatter and all_gather of a group on one host go
  // through the bounce region, in chunks (backends/common/transport_backend.cc): just below (the
  // message path), at the bound, and past a chunk, off the 8-byte grid, in place and out of place,
  // on 2 to 4 ranks (4 on this machine's 2 cores: the barriers sleep).
  for (int ranks : {2, 3, 4}) {
    DYNAMIC_SECTION(ranks << " ranks") {
      const uint16_t port = test::free_port();
      test::run_ranks_ok(
          ranks,
          [&](int rank) {
            auto pg = join(port, rank, ranks);
            int bounced = 0;
            size_t round = 0;
            for (DType d : kAllDTypes) {
              const size_t element = dtype_size(d);
              const size_t at_bound = 64 * 1024 / element;
              for (ReduceOp op : ops_for(d)) {
                for (size_t count : {at_bound - 1, at_bound, (size_t{1} << 20) / element + 13}) {
                  const bool in_place = round++ % 2 == 0;
                  std::vector<std::byte> memory(2 * count * element + 64);
                  std::byte* in = memory.data() + 3 * element;
                  std::byte* out = in_place ? in : in + count * element + element;
                  fill_input(in, d, op, rank, count);
                  if (!in_place) std::memset(out, 0xa5, count * element);
                  pg->all_reduce(Tensor{in, count, d, Device{}}, Tensor{out, count, d, Device{}},
                                 op)
                      ->wait();
                  check_reduced(out, d, op, ranks, count, rank,
                                in_place ? "bounce all_reduce in place" : "bounce all_reduce");
                  if (!in_place) {
                    std::vector<std::byte> again(count * element);
                    fill_input(again.data(), d, op, rank, count);
                    RANK_CHECK(std::memcmp(again.data(), in, again.size()) == 0,
                               "rank {} {} {}: the input changed", rank, dtype_name(d),
                               describe(op));
                  }
                  if (count >= at_bound) ++bounced;
                }
              }
            }
            // reduce_scatter: the bound is on its whole input (P blocks).
            for (DType d : kAllDTypes) {
              const size_t element = dtype_size(d);
              const size_t per_rank = 64 * 1024 / element / ranks;
              for (ReduceOp op : ops_for(d)) {
                // The last: 2 MiB and a bit of input, two chunks of the region's 2 MiB halves.
                for (size_t count :
                     {per_rank - 1, per_rank + 1, (size_t{2} << 20) / element / ranks + 13}) {
                  const bool in_place = round++ % 2 == 0;
                  const size_t whole = ranks * count;
                  std::vector<std::byte> memory((whole + count + 8) * element);
                  std::byte* in = memory.data() + 3 * element;
                  std::byte* out =
                      in_place ? in + rank * count * element : in + whole * element + element;
                  fill_input(in, d, op, rank, whole);
                  pg->reduce_scatter_tensor(Tensor{out, count, d, Device{}},
                                            Tensor{in, whole, d, Device{}}, op)
                      ->wait();
                  std::byte want[8];
                  for (size_t j = 0; j < count; ++j) {
                    reference(want, d, op, ranks, rank * count + j);
                    RANK_CHECK(std::memcmp(out + j * element, want, element) == 0,
                               "rank {} bounce reduce_scatter {} {} count {} in_place {}: "
                               "element {}",
                               rank, dtype_name(d), describe(op), count, in_place, j);
                  }
                  if (whole * element >= 64 * 1024) ++bounced;
                }
              }
            }
            // all_gather: the bound is on each rank's block, and 256 KiB on 2 ranks (which read
            // each other's input straight where they fit the cores, as here; 3 and 4 ranks stage
            // it). Past it by more than one 256 KiB chunk and a bit.
            for (DType d : kAllDTypes) {
              const size_t element = dtype_size(d);
              const size_t bound = (ranks == 2 ? 256 * 1024 : 64 * 1024) / element;
              for (size_t count : {bound - 1, bound, bound + (size_t{300} << 10) / element + 13}) {
                const bool in_place = round++ % 2 == 0;
                const size_t whole = ranks * count;
                std::vector<std::byte> memory((whole + count + 8) * element);
                std::byte* out = memory.data() + 3 * element;
                std::byte* in = in_place ? out + rank * count * element : out + whole * element;
                std::memset(out, 0xa5, whole * element);
                fill_input(in, d, ReduceOp::Sum, rank, count);
                pg->all_gather_into_tensor(Tensor{out, whole, d, Device{}},
                                           Tensor{in, count, d, Device{}})
                    ->wait();
                std::vector<std::byte> want(count * element);
                for (int q = 0; q < ranks; ++q) {
                  fill_input(want.data(), d, ReduceOp::Sum, q, count);
                  const std::byte* got = out + q * count * element;
                  for (size_t j = 0; j < count; ++j) {
                    RANK_CHECK(
                        std::memcmp(got + j * element, want.data() + j * element, element) == 0,
                        "rank {} bounce all_gather {} count {} in_place {}: block {} "
                        "element {}",
                        rank, dtype_name(d), count, in_place, q, j);
                  }
                }
                if (count >= bound) ++bounced;
              }
            }
            // Every call at or above the bound went through the bounce region, none below.
            const int seen = recorded_with("bounce", rank);
            RANK_CHECK(seen == bounced, "rank {}: {} collectives bounced, {} expected", rank, seen,
                       bounced);
          },
          seconds(120));
    }
  }
}

// ---- The other zero-copy collectives.

TEST_CASE("symmetric reduce_scatter, all_gather and broadcast match the reference on 1 to 5 ranks",
          "[symmetric][multiproc]") {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    DYNAMIC_SECTION(ranks << " ranks") {
      const uint16_t port = test::free_port();
      test::run_ranks_ok(ranks, [&](int rank) {
        auto pg = join(port, rank, ranks);
        const size_t n = 20000;  // per rank
        auto buffer = pg->allocate_symmetric(2 * ranks * n * 8 + 64);
        auto* base = static_cast<std::byte*>(buffer->data());
        for (DType d : {DType::Float32, DType::Int64, DType::Float16, DType::UInt8}) {
          const size_t element = dtype_size(d);
          const size_t block = n * element;
          for (bool in_place : {false, true}) {
            // reduce_scatter: input P blocks one element in (off the 8-byte grid for the narrow
            // types); rank r's block i is f(r, i) over the whole input.
            for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
              const size_t in_at = element;
              fill_input(base + in_at, d, op, rank, ranks * n);
              const size_t out_at =
                  in_place ? in_at + rank * block : in_at + ranks * block + 7 * element;
              pg->reduce_scatter_tensor(buffer->view(d, out_at, n),
                                        buffer->view(d, in_at, ranks * n), op)
                  ->wait();
              // The reference of element j of block `rank` is that of index rank * n + j.
              std::byte want[8];
              for (size_t j = 0; j < n; ++j) {
                reference(want, d, op, ranks, rank * n + j);
                RANK_CHECK(std::memcmp(base + out_at + j * element, want, element) == 0,
                           "rank {} reduce_scatter {} {} in_place {} element {}", rank,
                           dtype_name(d), describe(op), in_place, j);
              }
            }
            // all_gather: rank r contributes f(r, i), i < n.
            const size_t out_at = 5 * element;
            const size_t in_at =
                in_place ? out_at + rank * block : out_at + ranks * block + 3 * element;
            fill_input(base + in_at, d, ReduceOp::Sum, rank, n);
            pg->all_gather_into_tensor(buffer->view(d, out_at, ranks * n),
                                       buffer->view(d, in_at, n))
                ->wait();
            for (int r = 0; r < ranks; ++r) {
              std::vector<std::byte> want(block);
              fill_input(want.data(), d, ReduceOp::Sum, r, n);
              RANK_CHECK(std::memcmp(base + out_at + r * block, want.data(), block) == 0,
                         "rank {} all_gather {} in_place {}: block {} differs", rank, dtype_name(d),
                         in_place, r);
            }
            // broadcast from the last rank: its input at offset 0 (in place) or from ordinary
            // memory (out of place is spelled with the root's tensor outside the buffer).
            const int root = ranks - 1;
            std::vector<std::byte> ordinary(block);
            const size_t data_at = 9 * element;
            std::byte* data = base + data_at;
            if (rank == root) {
              fill_input(in_place ? data : ordinary.data(), d, ReduceOp::Sum, 1000, n);
            } else {
              std::memset(data, 0x5a, block);
            }
            if (rank == root && !in_place) {
              // Out of place: the root copies its ordinary input in first (the group's API has
              // no out-of-place broadcast), then broadcasts in place.
              std::memcpy(data, ordinary.data(), block);
            }
            pg->broadcast(buffer->view(d, data_at, n), root)->wait();
            std::vector<std::byte> want(block);
            fill_input(want.data(), d, ReduceOp::Sum, 1000, n);
            RANK_CHECK(std::memcmp(data, want.data(), block) == 0, "rank {} broadcast {}", rank,
                       dtype_name(d));
          }
        }
      });
    }
  }
}

// reduce, every dtype and op, roots turning: the root's output in the inputs' buffer (each rank
// writes its slice of it), in place, and in ordinary memory (the root reduces alone); off the
// 8-byte grid on every other round. Off the root nothing but the input is passed, and nothing in
// the buffer but the inputs is touched.
TEST_CASE("symmetric reduce matches the reference for every dtype, op and root on 1 to 5 ranks",
          "[symmetric][multiproc]") {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    DYNAMIC_SECTION(ranks << " ranks") {
      const uint16_t port = test::free_port();
      test::run_ranks_ok(ranks, [&](int rank) {
        auto pg = join(port, rank, ranks);
        auto buffer = pg->allocate_symmetric(2 * 20000 * 8 + 64);
        auto* base = static_cast<std::byte*>(buffer->data());
        size_t round = 0;
        for (DType d : kAllDTypes) {
          const size_t element = dtype_size(d);
          for (ReduceOp op : ops_for(d)) {
            for (size_t count : {size_t{0}, size_t{7}, size_t{1000}, size_t{20000}}) {
              const int root = static_cast<int>(round % ranks);
              const int placement = static_cast<int>(round % 3);  // buffer, in place, ordinary
              const size_t in_at = round % 2 == 1 ? 3 * element : 0;
              ++round;
              const size_t out_at = 20000 * 8 + in_at;
              std::byte* in = base + in_at;
              fill_input(in, d, op, rank, count);
              std::memset(base + out_at, 0xa5, count * element);
              std::vector<std::byte> ordinary(count * element, std::byte{0xa5});
              const Tensor input = buffer->view(d, in_at, count);
              const std::string what = fmt::format("reduce root {} placement {}", root, placement);
              if (placement == 1) {
                pg->reduce(input, root, op)->wait();
              } else {
                const Tensor output = placement == 0
                                          ? buffer->view(d, out_at, count)
                                          : Tensor{ordinary.data(), count, d, Device::cpu()};
                pg->reduce(input, output, root, op)->wait();
              }
              const std::byte* out = placement == 0   ? base + out_at
                                     : placement == 1 ? in
                                                      : ordinary.data();
              if (rank == root) {
                check_reduced(out, d, op, ranks, count, rank, what);
              }
              if ((rank != root || placement != 1) && count > 0) {  // memcmp takes no null
                std::vector<std::byte> again(count * element);
                fill_input(again.data(), d, op, rank, count);
                RANK_CHECK(std::memcmp(again.data(), in, again.size()) == 0,
                           "rank {} {} {} {}: the input changed", rank, what, dtype_name(d),
                           describe(op));
              }
              if (rank != root || placement != 0) {
                for (size_t i = 0; i < count * element; ++i) {
                  RANK_CHECK(base[out_at + i] == std::byte{0xa5},
                             "rank {} {} {} {}: byte {} after the inputs was written", rank, what,
                             dtype_name(d), describe(op), i);
                }
              }
            }
          }
        }
      });
    }
  }
}

// Byte j of element k of the block rank `from` sends rank `to`: distinct for every (from, to, k).
std::byte sent_byte(int from, int to, size_t k, size_t j) {
  return static_cast<std::byte>((from * 31 + to * 7 + k * 13 + j * 5 + 1) & 0xff);
}

// all_to_all of `splits` (splits[from][to] elements) with this rank's input at `in_at` and its
// output at `out_at` of the buffer (the same place: in place), checked block by block.
void all_to_all_and_check(ProcessGroup& pg, SymmetricBuffer& buffer, DType d, size_t in_at,
                          size_t out_at, const std::vector<std::vector<size_t>>& splits,
                          const std::string& what) {
  const int rank = pg.rank();
  const int ranks = pg.size();
  const size_t element = dtype_size(d);
  auto* base = static_cast<std::byte*>(buffer.data());
  std::vector<size_t> send(ranks), recv(ranks);
  for (int q = 0; q < ranks; ++q) {
    send[q] = splits[rank][q];
    recv[q] = splits[q][rank];
  }
  size_t at = in_at;
  for (int q = 0; q < ranks; ++q) {
    for (size_t b = 0; b < send[q] * element; ++b) {
      base[at + b] = sent_byte(rank, q, b / element, b % element);
    }
    at += send[q] * element;
  }
  size_t in_count = 0, out_count = 0;
  for (int q = 0; q < ranks; ++q) {
    in_count += send[q];
    out_count += recv[q];
  }
  if (out_at != in_at) std::memset(base + out_at, 0xa5, out_count * element);
  pg.all_to_all(buffer.view(d, out_at, out_count), buffer.view(d, in_at, in_count), recv, send)
      ->wait();
  at = out_at;
  for (int q = 0; q < ranks; ++q) {
    for (size_t b = 0; b < recv[q] * element; ++b) {
      RANK_CHECK(base[at + b] == sent_byte(q, rank, b / element, b % element),
                 "rank {} {} {}: block from rank {} byte {} is {:#x}, expected {:#x}", rank, what,
                 dtype_name(d), q, b, static_cast<int>(base[at + b]),
                 static_cast<int>(sent_byte(q, rank, b / element, b % element)));
    }
    at += recv[q] * element;
  }
}

TEST_CASE(
    "symmetric all_to_all matches the reference on 1 to 5 ranks, in place or not, and uneven "
    "splits take the message path on every rank",
    "[symmetric][multiproc]") {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    DYNAMIC_SECTION(ranks << " ranks") {
      const uint16_t port = test::free_port();
      test::run_ranks_ok(ranks, [&](int rank) {
        auto pg = join(port, rank, ranks);
        const size_t most = 5 * 1010 * 8;  // one rank's input or output, at most
        auto buffer = pg->allocate_symmetric(2 * most + 64);
        for (DType d : {DType::Float32, DType::Int64, DType::UInt8, DType::BFloat16}) {
          const size_t element = dtype_size(d);
          for (size_t n : {size_t{0}, size_t{1}, size_t{1000}}) {
            const std::vector<std::vector<size_t>> even(ranks, std::vector<size_t>(ranks, n));
            // Off the 8-byte grid for the narrow types (one element in).
            all_to_all_and_check(*pg, *buffer, d, element, most + 3 * element, even,
                                 fmt::format("even n {}", n));
            all_to_all_and_check(*pg, *buffer, d, element, element, even,
                                 fmt::format("even in place n {}", n));
            // Uneven: n + (3 from + to) % 3, some blocks empty.
            std::vector<std::vector<size_t>> uneven(ranks, std::vector<size_t>(ranks));
            for (int f = 0; f < ranks; ++f) {
              for (int t = 0; t < ranks; ++t) uneven[f][t] = (f + t) % 4 == 3 ? 0 : n + (f + t) % 3;
            }
            all_to_all_and_check(*pg, *buffer, d, 0, most, uneven, fmt::format("uneven n {}", n));
            if (ranks >= 3 && n >= 2) {
              // Rank 0 sends and receives n everywhere, so its own splits look even; ranks 1 and
              // P-1 do not. Every rank must still take the message path (before, rank 0 alone
              // went zero-copy and waited for the others in its barrier).
              std::vector<std::vector<size_t>> deceptive = even;
              deceptive[1][ranks - 1] = n - 2;
              deceptive[ranks - 1][ranks - 1] = n + 2;
              all_to_all_and_check(*pg, *buffer, d, 0, most, deceptive,
                                   fmt::format("even on rank 0 only, n {}", n));
            }
          }
        }
      });
    }
  }
}

TEST_CASE("two groups' symmetric buffers are used at once, each with its own group",
          "[symmetric][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(4, [&](int rank) {
    auto world = join(port, rank, 4);
    auto pair = world->split(rank / 2, rank);  // {0, 1} and {2, 3}
    auto a = world->allocate_symmetric(4096);
    auto b = pair->allocate_symmetric(8192);
    auto c = world->allocate_symmetric(4096);
    RANK_CHECK(a->id() == 0 && b->id() == 0 && c->id() == 1);
    RANK_CHECK(a->data() != b->data() && a->data() != c->data());
    for (int round = 0; round < 20; ++round) {
      auto* x = static_cast<int64_t*>(a->data());
      auto* y = static_cast<int64_t*>(b->data());
      auto* z = static_cast<int64_t*>(c->data());
      for (int i = 0; i < 500; ++i) {
        x[i] = rank * 1000 + i + round;
        y[i] = rank * 10 + i;
        z[i] = rank + round;
      }
      auto w1 = world->all_reduce(a->view<int64_t>(0, 500));
      auto w2 = pair->all_reduce(b->view<int64_t>(0, 500));
      auto w3 = world->all_reduce(c->view<int64_t>(0, 500), ReduceOp::Max);
      w1->wait();
      w2->wait();
      w3->wait();
      const int low = rank / 2 * 2;
      for (int i = 0; i < 500; ++i) {
        RANK_CHECK(x[i] == 6000 + 4 * (i + round), "rank {} x[{}] = {}", rank, i, x[i]);
        RANK_CHECK(y[i] == (2 * low + 1) * 10 + 2 * i, "rank {} y[{}] = {}", rank, i, y[i]);
        RANK_CHECK(z[i] == 3 + round, "rank {} z[{}] = {}", rank, i, z[i]);
      }
    }
  });
}

// ---- Refusals and failures.

TEST_CASE("a tensor that straddles a symmetric buffer's end is refused with InvalidArgument",
          "[symmetric][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2);
    auto buffer = pg->allocate_symmetric(4000);
    bool refused = false;
    try {
      buffer->view<float>(999, 2);  // [3996, 4004): past the end
    } catch (const Error& e) {
      refused = e.code() == ErrorCode::InvalidArgument;
    }
    RANK_CHECK(refused, "view past the end was not refused");
    // A hand-made tensor that starts inside and ends past the buffer: the call fails.
    Tensor straddling = Tensor::of(static_cast<float*>(buffer->data()) + 999, 2);
    try {
      pg->all_reduce(straddling)->wait();
      RANK_CHECK(false, "all_reduce of a straddling tensor succeeded");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::InvalidArgument, "{}", e.what());
      const std::string what = e.what();
      RANK_CHECK(what.find("straddles") != std::string::npos, "{}", what);
      RANK_CHECK(what.find(fmt::format("rank {}/2", rank)) != std::string::npos, "{}", what);
    }
    // The message path too (reduce has no zero-copy path): it would read past the mapping.
    try {
      pg->reduce(straddling, 0)->wait();
      RANK_CHECK(false, "reduce of a straddling tensor succeeded");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::InvalidArgument, "{}", e.what());
      const std::string what = e.what();
      RANK_CHECK(what.find("straddles") != std::string::npos, "{}", what);
      RANK_CHECK(
          what.find(fmt::format("rank {}/2 group \"world\" reduce", rank)) != std::string::npos,
          "{}", what);
    }
    // The group goes on.
    auto* f = static_cast<float*>(buffer->data());
    f[0] = 1.0f + rank;
    pg->all_reduce(buffer->view<float>(0, 1))->wait();
    RANK_CHECK(f[0] == 3.0f, "{}", f[0]);
  });
}

TEST_CASE("releasing a symmetric buffer while a collective uses it is refused, not a crash",
          "[symmetric][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2);
    auto buffer = pg->allocate_symmetric(1 << 20);
    auto* f = static_cast<float*>(buffer->data());
    for (int i = 0; i < 1000; ++i) f[i] = static_cast<float>(rank + i);
    // Rank 1 posts only once rank 0 has tried the release: until then rank 0's call waits for it.
    auto side = side_store(port);
    if (rank == 1) side->wait({"test/release_tried"}, seconds(20));
    // Twelve queued collectives hold the buffer; the refusal names the oldest eight, then counts.
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 12; ++i) works.push_back(pg->all_reduce(buffer->view<float>(0, 1000)));
    if (rank == 0) {
      bool refused = false;
      try {
        buffer->release();
      } catch (const Error& e) {
        const std::string what = e.what();
        refused = e.code() == ErrorCode::InvalidArgument &&
                  what.find("all_reduce #1,") != std::string::npos &&
                  what.find("all_reduce #8 and 4 more") != std::string::npos &&
                  what.find("all_reduce #9") == std::string::npos;
        RANK_CHECK(refused, "{}", e.what());
      }
      RANK_CHECK(refused, "release() while in use was not refused");
      RANK_CHECK(buffer->data() != nullptr);
    }
    if (rank == 0) {
      // Dropping the handle while the collective runs keeps the memory mapped until it is done
      // (rank 1 reads and writes rank 0's block meanwhile).
      std::weak_ptr<SymmetricBuffer> weak = buffer;
      buffer.reset();
      RANK_CHECK(!weak.expired(), "the running all_reduce does not hold the buffer");
      side->set("test/release_tried", "1");
      for (auto& w : works) w->wait();
      return;
    }
    for (auto& w : works) w->wait();
    // Twelve in-place sums of rank + i over two ranks: 2^11 (1 + 2i), exact in float32.
    for (int i = 0; i < 1000; ++i) {
      RANK_CHECK(f[i] == 2048.0f * static_cast<float>(1 + 2 * i), "rank {} f[{}] = {}", rank, i,
                 f[i]);
    }
    buffer->release();
    RANK_CHECK(buffer->data() == nullptr);
    buffer->release();  // idempotent
    bool refused = false;
    try {
      buffer->view<float>(0, 1);
    } catch (const Error& e) {
      refused = e.code() == ErrorCode::InvalidArgument;
    }
    RANK_CHECK(refused, "a view of a released buffer was not refused");
  });
}

TEST_CASE("ranks whose tensors lie at different offsets fail with Desync naming the other",
          "[symmetric][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2);
    auto buffer = pg->allocate_symmetric(4096);
    try {
      pg->all_reduce(buffer->view<float>(rank * 16, 10))->wait();
      RANK_CHECK(false, "a mismatched all_reduce succeeded");
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_CHECK(e.code() == ErrorCode::Desync, "{}", what);
      RANK_CHECK(what.find(fmt::format("rank {} runs", 1 - rank)) != std::string::npos, "{}", what);
      RANK_CHECK(what.find("all_reduce #1") != std::string::npos, "{}", what);
    }
  });
}

TEST_CASE(
    "a rank that passes ordinary memory while the others pass symmetric memory makes them "
    "time out at the group's deadline, naming it",
    "[symmetric][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2, seconds(2));
    auto buffer = pg->allocate_symmetric(4096);
    std::vector<float> ordinary(10, 1.0f);
    Tensor t = rank == 0 ? buffer->view<float>(0, 10) : Tensor::of(ordinary.data(), 10);
    const auto start = Clock::now();
    try {
      pg->all_reduce(t)->wait();
      RANK_CHECK(false, "a mixed all_reduce succeeded");
    } catch (const Error& e) {
      const std::string what = e.what();
      // Rank 0 times out in its barrier; rank 1 times out on its messages, or learns that rank
      // 0's group broke first.
      RANK_CHECK(e.code() == ErrorCode::Timeout || (rank == 1 && e.code() == ErrorCode::PeerLost),
                 "{}", what);
      RANK_CHECK(what.find(fmt::format("rank {}/2 group \"world\" all_reduce #1", rank)) !=
                     std::string::npos,
                 "{}", what);
      if (rank == 0) {
        RANK_CHECK(what.find("rank(s) 1 had not arrived") != std::string::npos, "{}", what);
      }
    }
    const auto waited = Clock::now() - start;
    RANK_CHECK(waited >= milliseconds(1900) && waited < seconds(10), "waited {} ms",
               std::chrono::duration_cast<milliseconds>(waited).count());
  });
}

TEST_CASE(
    "killing a rank during a zero-copy all_reduce fails the others with PeerLost and leaves "
    "nothing in /dev/shm",
    "[symmetric][multiproc][faults]") {
  const std::string job = unique_job("kill");
  ::setenv("WEFT_JOB_ID", job.c_str(), 1);
  const uint16_t port = test::free_port();
  const int ranks = 3;
  auto results = test::run_ranks(ranks, [&](int rank) {
    auto pg = join(port, rank, ranks);
    auto buffer = pg->allocate_symmetric(8 << 20);
    auto* f = static_cast<float*>(buffer->data());
    for (size_t i = 0; i < (2u << 20); ++i) f[i] = 1.0f;
    pg->all_reduce(buffer->view<float>(0, 2u << 20))->wait();  // a first one that succeeds
    RANK_CHECK(f[0] == 3.0f);
    // Rank 2 dies once the others have posted the second all_reduce (so they wait for it in its
    // barrier).
    auto side = side_store(port);
    if (rank == 2) {
      side->wait({"test/posted/0", "test/posted/1"}, seconds(20));
      ::raise(SIGKILL);
    }
    const auto start = Clock::now();
    try {
      auto work = pg->all_reduce(buffer->view<float>(0, 2u << 20));
      side->set(fmt::format("test/posted/{}", rank), "1");
      work->wait();
      RANK_CHECK(false, "rank {}: all_reduce succeeded without rank 2", rank);
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_CHECK(e.code() == ErrorCode::PeerLost, "{}", what);
      RANK_CHECK(what.find("rank 2") != std::string::npos, "{}", what);
      RANK_CHECK(what.find("all_reduce #2") != std::string::npos, "{}", what);
    }
    RANK_CHECK(Clock::now() - start < seconds(5), "PeerLost took more than 5 s");
    leave_before_the_store(pg, *side, rank);
  });
  ::unsetenv("WEFT_JOB_ID");
  for (const auto& r : results) {
    if (r.rank == 2) {
      CHECK(r.signal == SIGKILL);
    } else {
      INFO(test::describe_failures(results));
      CHECK(r.exit_code == 0);
    }
  }
  const std::vector<std::string> left = shm_entries(job);
  INFO(fmt::format("left in /dev/shm: {}", fmt::join(left, ", ")));
  CHECK(left.empty());
}

TEST_CASE(
    "killing a rank during a bounce all_reduce or all_gather of ordinary buffers fails the others "
    "with PeerLost and leaves nothing in /dev/shm",
    "[symmetric][bounce][multiproc][faults]") {
  // all_reduce on 3 ranks; all_gather on 2, which read each other's input straight (cross-memory
  // attach) where their ranks fit the cores, as here.
  for (const bool gather : {false, true}) {
    DYNAMIC_SECTION((gather ? "all_gather" : "all_reduce")) {
      const std::string op = gather ? "all_gather" : "all_reduce";
      const std::string job = unique_job("bouncekill");
      ::setenv("WEFT_JOB_ID", job.c_str(), 1);
      const uint16_t port = test::free_port();
      const int ranks = gather ? 2 : 3;
      const int victim = ranks - 1;
      auto results = test::run_ranks(ranks, [&](int rank) {
        auto pg = join(port, rank, ranks);
        // 8 MiB: eight chunks of the bounce region.
        std::vector<float> data(size_t{2} << 20, 1.0f), gathered(ranks * data.size());
        auto run = [&] {
          return gather ? pg->all_gather_into_tensor(Tensor::of(gathered.data(), gathered.size()),
                                                     Tensor::of(data.data(), data.size()))
                        : pg->all_reduce(Tensor::of(data.data(), data.size()));
        };
        run()->wait();  // makes the region
        if (gather) {
          RANK_CHECK(gathered[0] == 1.0f && gathered.back() == 1.0f);
        } else {
          RANK_CHECK(data[0] == 3.0f && data.back() == 3.0f);
        }
        auto side = side_store(port);
        if (rank == victim) {
          std::vector<std::string> posted;
          for (int r = 0; r < victim; ++r) posted.push_back(fmt::format("test/posted/{}", r));
          side->wait(posted, seconds(20));
          ::raise(SIGKILL);
        }
        const auto start = Clock::now();
        try {
          auto work = run();
          side->set(fmt::format("test/posted/{}", rank), "1");
          work->wait();
          RANK_CHECK(false, "rank {}: {} succeeded without rank {}", rank, op, victim);
        } catch (const Error& e) {
          const std::string what = e.what();
          RANK_CHECK(e.code() == ErrorCode::PeerLost, "{}", what);
          RANK_CHECK(what.find(fmt::format("rank {}", victim)) != std::string::npos, "{}", what);
          RANK_CHECK(what.find(op + " #2") != std::string::npos, "{}", what);
          RANK_CHECK(what.find("bounce " + op) != std::string::npos, "{}", what);
        }
        RANK_CHECK(Clock::now() - start < seconds(5), "PeerLost took more than 5 s");
        // On 2 ranks rank 0, the store's host, is the only one left.
        if (ranks > 2) leave_before_the_store(pg, *side, rank);
      });
      ::unsetenv("WEFT_JOB_ID");
      for (const auto& r : results) {
        if (r.rank == victim) {
          CHECK(r.signal == SIGKILL);
        } else {
          INFO(test::describe_failures(results));
          CHECK(r.exit_code == 0);
        }
      }
      const std::vector<std::string> left = shm_entries(job);
      INFO(fmt::format("left in /dev/shm: {}", fmt::join(left, ", ")));
      CHECK(left.empty());
    }
  }
}

TEST_CASE(
    "a rank that comes to a symmetric allocation after its leader gave up fails with the "
    "leader's reason, not a missing segment",
    "[symmetric][multiproc][faults]") {
  // Rank 2 never allocates, so rank 0 (the host's leader) publishes the segment's name, times
  // out waiting for the acknowledgements and removes the segment. Rank 1 comes only then: it
  // finds the name but no segment, and must say why (the leader's Timeout), not "shm_open
  // failed: No such file or directory". (The same race, a rank dying, is a PeerLost.)
  const std::string job = unique_job("gaveup");
  ::setenv("WEFT_JOB_ID", job.c_str(), 1);
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int rank) {
    auto pg = join(port, rank, 3, seconds(1));
    auto side = side_store(port);
    if (rank == 0) {
      try {
        pg->allocate_symmetric(4096);
        RANK_CHECK(false, "the allocation succeeded without rank 2");
      } catch (const Error& e) {
        RANK_CHECK(e.code() == ErrorCode::Timeout, "{}", e.what());
      }
      side->set("test/failed/0", "1");
      side->wait({"test/left/1", "test/left/2"}, seconds(20));
      return;
    }
    side->wait({rank == 1 ? "test/failed/0" : "test/left/1"}, seconds(20));
    if (rank == 1) {
      try {
        pg->allocate_symmetric(4096);
        RANK_CHECK(false, "the allocation succeeded after the leader gave up");
      } catch (const Error& e) {
        const std::string what = e.what();
        RANK_CHECK(e.code() == ErrorCode::Timeout, "{}", what);
        RANK_CHECK(what.find("rank 0 gave up on symmetric buffer #0 before this rank mapped it") !=
                       std::string::npos,
                   "{}", what);
        RANK_CHECK(what.find("No such file") == std::string::npos, "{}", what);
      }
    }
    pg.reset();
    side->set(fmt::format("test/left/{}", rank), "1");
  });
  ::unsetenv("WEFT_JOB_ID");
  const std::vector<std::string> left = shm_entries(job);
  INFO(fmt::format("left in /dev/shm: {}", fmt::join(left, ", ")));
  CHECK(left.empty());
}

// What the killed rank leaves for the parent and the survivors, in memory shared across the fork:
// steady_clock is CLOCK_MONOTONIC, one clock for every process on the host.
struct KillRecord {
  std::atomic<int64_t> killed_at{0};   // steady_clock nanoseconds just before raise(SIGKILL)
  std::atomic<uint64_t> entered{0};    // the killed rank's all_reduces begun (1, 2, ...)
  std::atomic<uint64_t> kill_call{0};  // the all_reduce it dies in, drawn at random
};

TEST_CASE(
    "killing a rank in the middle of zero-copy all_reduces fails the others with PeerLost within "
    "5 s and leaves nothing in /dev/shm",
    "[symmetric][multiproc][faults]") {
  // Large all_reduces back to back (32 MiB of floats on 3 ranks: about 10 ms each here, nearly
  // all of it the reduction and copies out), and rank 2 killed by a thread after a random delay:
  // it dies inside one of them, almost always while the others reduce their slices or wait in the
  // second barrier (the barriers themselves take microseconds).
  void* shared = ::mmap(nullptr, sizeof(KillRecord), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(shared != MAP_FAILED);
  auto* record = new (shared) KillRecord;
  const std::string job = unique_job("midkill");
  ::setenv("WEFT_JOB_ID", job.c_str(), 1);
  const uint16_t port = test::free_port();
  const int ranks = 3;
  const size_t count = size_t{8} << 20;
  auto results = test::run_ranks(
      ranks,
      [&](int rank) {
        auto pg = join(port, rank, ranks);
        auto buffer = pg->allocate_symmetric(2 * count * sizeof(float));
        auto* in = static_cast<float*>(buffer->data());
        float* out = in + count;
        for (size_t i = 0; i < count; ++i) in[i] = 1.0f;
        const Tensor input = buffer->view<float>(0, count);
        const Tensor output = buffer->view<float>(count, count);
        const auto start = Clock::now();
        uint64_t completed = 0;
        if (rank == 2) {
          std::random_device seed;
          record->kill_call = 2 + seed() % 8;
        }
        while (Clock::now() - start < seconds(20)) {
          if (rank == 2) record->entered = completed + 1;
          try {
            auto work = pg->all_reduce(input, output);
            // Rank 2 dies in a call drawn at random, once it has posted it: the others are then
            // in the call (or about to enter it) with rank 2's part outstanding.
            if (rank == 2 && completed + 1 == record->kill_call) {
              record->killed_at = Clock::now().time_since_epoch().count();
              ::raise(SIGKILL);
            }
            work->wait();
          } catch (const Error& e) {
            const auto failed = Clock::now();
            const std::string what = e.what();
            RANK_CHECK(rank != 2, "rank 2 failed before it was killed: {}", what);
            RANK_CHECK(e.code() == ErrorCode::PeerLost, "{}", what);
            RANK_CHECK(what.find("rank 2") != std::string::npos, "{}", what);
            // Where this rank waited: the second barrier when rank 2 died reducing; the next
            // call's first when it died waiting in its second, after arriving there.
            RANK_CHECK(what.find("symmetric barrier (leave)") != std::string::npos ||
                           what.find("symmetric barrier (enter)") != std::string::npos,
                       "{}", what);
            RANK_CHECK(what.find(fmt::format("rank {}/3 group \"world\" all_reduce #", rank)) !=
                           std::string::npos,
                       "{}", what);
            const int64_t killed_at = record->killed_at;
            RANK_CHECK(killed_at != 0, "failed before rank 2 was killed: {}", what);
            const auto after = failed.time_since_epoch() - Clock::duration(killed_at);
            RANK_CHECK(after < seconds(5), "PeerLost {} ms after the kill: {}",
                       std::chrono::duration_cast<milliseconds>(after).count(), what);
            // Rank 2 died inside the call this rank fails in, or (in the instant between two)
            // just before entering it.
            const uint64_t theirs = record->entered;
            RANK_CHECK(completed + 1 == theirs || completed == theirs,
                       "this rank failed in all_reduce {}, rank 2 died in {}", completed + 1,
                       theirs);
            leave_before_the_store(pg, *side_store(port), rank);
            return;
          }
          ++completed;
          RANK_CHECK(out[0] == 3.0f && out[count - 1] == 3.0f, "rank {} call {}: {} {}", rank,
                     completed, out[0], out[count - 1]);
        }
        RANK_CHECK(false, "rank {}: {} all_reduces in 20 s and no PeerLost", rank, completed);
      },
      seconds(60));
  ::unsetenv("WEFT_JOB_ID");
  INFO(fmt::format("rank 2 killed in all_reduce {} (entered {})\n{}", record->kill_call.load(),
                   record->entered.load(), test::describe_failures(results)));
  for (const auto& r : results) {
    if (r.rank == 2) {
      CHECK(r.signal == SIGKILL);
    } else {
      CHECK(r.exit_code == 0);
    }
  }
  CHECK(record->entered.load() > 1);  // it died mid-loop, not in the first call
  const std::vector<std::string> left = shm_entries(job);
  INFO(fmt::format("left in /dev/shm: {}", fmt::join(left, ", ")));
  CHECK(left.empty());
  ::munmap(shared, sizeof(KillRecord));
}

TEST_CASE("a group without shared memory refuses allocate_symmetric with Unsupported saying why",
          "[symmetric][multiproc]") {
  const uint16_t port = test::free_port();
  const char* backend = std::getenv("WEFT_TEST_BACKEND");
  const bool ucx = backend != nullptr && std::string_view(backend) == "ucx";
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2, seconds(30), {{ucx ? "host_memory" : "shm", "0"}});
    try {
      pg->allocate_symmetric(4096);
      RANK_CHECK(false, "allocate_symmetric succeeded without shared memory");
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_CHECK(e.code() == ErrorCode::Unsupported, "{}", what);
      RANK_CHECK(what.find(fmt::format("rank {}/2 group \"world\" allocate_symmetric", rank)) !=
                     std::string::npos,
                 "{}", what);
      RANK_CHECK(what.find(ucx ? "host memory is off for this group (the setting host_memory=0)"
                               : "shared memory is off") != std::string::npos,
                 "{}", what);
    }
    // Collectives go on over TCP.
    int64_t x = rank + 1;
    pg->all_reduce(Tensor::of(&x, 1))->wait();
    RANK_CHECK(x == 3);
  });
}

}  // namespace
}  // namespace weft
