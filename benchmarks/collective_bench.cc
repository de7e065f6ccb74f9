// collective_bench: one collective, a few sizes, N iterations; prints time per op and bus
// bandwidth on rank 0. The simple driver until weft-perf exists. Launch under weftrun:
//
//   weftrun --nproc-per-node 4 --standalone collective_bench --op all_reduce --sizes 8,1M,16M
//
// Output, one line per size (the same keys as benchmarks/peers' harnesses, so that one script
// reads both):
//   peer=weft op=all_reduce ranks=4 bytes=1048576 time_us=123.4 algbw=8.50 busbw=12.75 wrong=0
//
// Sizes count the full array as nccl-tests does: for all_gather, reduce_scatter and all_to_all,
// P blocks. GB/s = 1e9 bytes/s. busbw = algbw x (all_reduce 2(P-1)/P; all_gather, reduce_scatter,
// all_to_all (P-1)/P; broadcast, reduce 1). Time is the slowest rank's mean over the iterations.
// --check verifies every element of the last iteration against values computed here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/process_group.h"

namespace {

using Clock = std::chrono::steady_clock;

size_t parse_size(const std::string& text) {
  size_t idx = 0;
  double value = std::stod(text, &idx);
  std::string unit = text.substr(idx);
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1024.0;
  if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  return static_cast<size_t>(value * scale);
}

std::vector<size_t> parse_sizes(const std::string& text) {
  std::vector<size_t> sizes;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    sizes.push_back(parse_size(text.substr(start, end - start)));
    start = end + 1;
  }
  return sizes;
}

double bus_factor(const std::string& op, int p) {
  if (op == "all_reduce") return 2.0 * (p - 1) / p;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return double(p - 1) / p;
  return 1.0;
}

// Small integers: fp32 sums stay exact.
float value(int rank, size_t i) { return float((rank + 1) * 3 + int(i % 13)); }

struct Bench {
  weft::ProcessGroup& pg;
  std::string op;
  size_t count;  // float32 elements of the full array
  std::vector<float> in, out;

  std::shared_ptr<weft::Work> issue() {
    using weft::Tensor;
    const size_t p = pg.size();
    const size_t block = count / p;
    if (op == "all_reduce")
      return pg.all_reduce(Tensor::of(in.data(), count), Tensor::of(out.data(), count));
    if (op == "all_gather") {
      return pg.all_gather_into_tensor(Tensor::of(out.data(), block * p),
                                       Tensor::of(in.data(), block));
    }
    if (op == "reduce_scatter") {
      return pg.reduce_scatter_tensor(Tensor::of(out.data(), block),
                                      Tensor::of(in.data(), block * p));
    }
    if (op == "broadcast") return pg.broadcast(Tensor::of(out.data(), count), 0);
    if (op == "reduce")
      return pg.reduce(Tensor::of(in.data(), count), Tensor::of(out.data(), count), 0);
    if (op == "all_to_all") {
      return pg.all_to_all(Tensor::of(out.data(), block * p), Tensor::of(in.data(), block * p));
    }
    if (op == "barrier") return pg.barrier();
    throw weft::Error(weft::ErrorCode::InvalidArgument, "collective_bench: unknown --op " + op);
  }

  void fill() {
    const int rank = pg.rank();
    for (size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i);
    if (op == "broadcast") {
      for (size_t i = 0; i < out.size(); ++i) out[i] = rank == 0 ? value(0, i) : -1.0f;
    } else {
      std::fill(out.begin(), out.end(), -1.0f);
    }
  }

  // Elements of this rank's output that differ from the expected values.
  size_t wrong() const {
    const int p = pg.size(), rank = pg.rank();
    const size_t block = count / p;
    auto sum_over_ranks = [&](size_t i) {
      float s = 0;
      for (int r = 0; r < p; ++r) s += value(r, i);
      return s;
    };
    size_t bad = 0;
    if (op == "all_reduce" || (op == "reduce" && rank == 0)) {
      for (size_t i = 0; i < count; ++i) bad += out[i] != sum_over_ranks(i);
    } else if (op == "all_gather") {
      for (size_t i = 0; i < block * p; ++i) bad += out[i] != value(int(i / block), i % block);
    } else if (op == "reduce_scatter") {
      for (size_t i = 0; i < block; ++i) bad += out[i] != sum_over_ranks(rank * block + i);
    } else if (op == "broadcast") {
      for (size_t i = 0; i < count; ++i) bad += out[i] != value(0, i);
    } else if (op == "all_to_all") {
      for (size_t i = 0; i < block * p; ++i) {
        bad += out[i] != value(int(i / block), rank * block + i % block);
      }
    }
    return bad;
  }
};

int usage() {
  std::fprintf(stderr,
               "usage: collective_bench [--op all_reduce|all_gather|reduce_scatter|broadcast|"
               "reduce|all_to_all|barrier] [--sizes 8,1M,16M] [--iters 20] [--warmup 5] "
               "[--no-check]\n(launch under weftrun, torchrun, srun or mpirun)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string op = "all_reduce";
  std::vector<size_t> sizes = {8, 1 << 20, 16 << 20};
  int iters = 20, warmup = 5;
  bool check = true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    try {
      if (arg == "--op") {
        op = next();
      } else if (arg == "--sizes") {
        sizes = parse_sizes(next());
      } else if (arg == "--iters") {
        iters = std::stoi(next());
      } else if (arg == "--warmup") {
        warmup = std::stoi(next());
      } else if (arg == "--no-check") {
        check = false;
      } else {
        return usage();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "collective_bench: %s\n", e.what());
      return usage();
    }
  }
  try {
    auto pg = weft::init_process_group();
    const int p = pg->size();
    for (size_t bytes : sizes) {
      size_t count = std::max<size_t>(bytes / sizeof(float), 1);
      if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") {
        count = std::max<size_t>(count / p, 1) * p;
      }
      Bench bench{*pg, op, count, std::vector<float>(count), std::vector<float>(count)};
      bench.fill();
      for (int i = 0; i < warmup; ++i) bench.issue()->wait();
      pg->barrier()->wait();
      // Each iteration timed too, for the spread (this rank's view): small collectives on a
      // shared machine are often bimodal, and the mean alone hides it.
      std::vector<double> each_us(static_cast<size_t>(std::max(iters, 1)));
      const auto start = Clock::now();
      auto last = start;
      for (int i = 0; i < iters; ++i) {
        bench.issue()->wait();
        const auto now = Clock::now();
        each_us[i] = std::chrono::duration<double, std::micro>(now - last).count();
        last = now;
      }
      double mean_us =
          std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
      std::sort(each_us.begin(), each_us.begin() + std::max(iters, 1));
      auto percentile = [&](double q) {
        return each_us[std::min<size_t>(static_cast<size_t>(q * iters), iters - 1)];
      };
      // The slowest rank's time is the collective's.
      pg->all_reduce(weft::Tensor::of(&mean_us, 1), weft::ReduceOp::Max)->wait();
      int64_t wrong = 0;
      if (check) {
        bench.fill();
        bench.issue()->wait();
        wrong = static_cast<int64_t>(bench.wrong());
        pg->all_reduce(weft::Tensor::of(&wrong, 1))->wait();
      }
      const size_t real_bytes = count * sizeof(float);
      const double algbw = op == "barrier" ? 0 : real_bytes / (mean_us * 1e-6) / 1e9;
      if (pg->rank() == 0) {
        std::printf(
            "peer=weft op=%s ranks=%d bytes=%zu time_us=%.2f algbw=%.2f busbw=%.2f wrong=%lld "
            "p50_us=%.2f p99_us=%.2f\n",
            op.c_str(), p, real_bytes, mean_us, algbw, algbw * bus_factor(op, p),
            static_cast<long long>(wrong), percentile(0.5), percentile(0.99));
        std::fflush(stdout);
      }
    }
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
