// gloo_bench: Gloo's collectives over its TCP transport on loopback, one process per rank, in the
// format mpi_bench and weft's own figures use, so the three can be read side by side.
//
//   gloo_bench --spawn 4 [--op all_reduce] [--sizes 8,1M,16M,64M] [--iters 20] [--warmup 5]
//   RANK=r WORLD_SIZE=n gloo_bench --store-dir /shared/empty/dir ...   # any launcher
//
// Ranks rendezvous through gloo::rendezvous::FileStore in a directory (with --spawn, a fresh one
// under $TMPDIR that is removed afterwards), then connect a full mesh of TCP pairs on 127.0.0.1.
// Debian's Gloo (libgloo 0.0~git20220518.5b14351) has no shared-memory transport, so TCP is all
// it can do on one machine.
//
// Each op tries every Gloo algorithm that implements it and reports the fastest, naming it in
// algo=; a '#' line before it lists every candidate's time and wrong count:
//   all_reduce:     new_ring, new_bcube (gloo::allreduce with Algorithm RING / BCUBE), ring,
//                   ring_chunked, halving_doubling, bcube (the AllreduceRing.. classes); in place.
//   all_gather:     new (gloo::allgather), ring (AllgatherRing).
//   reduce_scatter: halving_doubling (ReduceScatterHalvingDoubling, the only one); in place, the
//                   rank's block left at the front of its buffer.
//   broadcast:      new (gloo::broadcast), one_to_all (BroadcastOneToAll); root 0, in place.
//   all_to_all:     new (gloo::alltoall).
//   barrier:        new (gloo::barrier), all_to_all, all_to_one (BarrierAllToAll / AllToOne).
// --algo NAME[,NAME..] keeps only the named candidates (an op with none of them keeps all).
//
// Timing: barrier, then --iters runs back to back; each rank's mean per op, the slowest rank's
// printed. The buffers are allocated once for the largest size and touched before any timing;
// an algorithm's own scratch (the classes allocate it in their constructor) is built before its
// warmup. With --check (the default) one more run follows each candidate's timed runs, on
// freshly filled inputs and NaN-filled outputs, and wrong= is the number of elements, summed over
// ranks, that differ from the closed-form value (peer_common.h); --check-runs N checks N runs.
// Gloo's reduce_scatter returns wrong values at random (about one run in 20 to 40 at 2 ranks and
// 16 MiB or more): ReduceScatterHalvingDoubling sends from the caller's buffer without waiting for
// the send to finish, then every rank but 0 copies its result over the front of that buffer. The
// count is printed as found (README.md, Known problems).
#include <gloo/allgather.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/broadcast.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/config.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "peer_common.h"
#include "runtime/cpu_binding.h"

namespace {

using Clock = std::chrono::steady_clock;
using peers::Op;

struct GlooOptions {
  int spawn = 0;          // 0: one rank per process from RANK / WORLD_SIZE
  std::string store_dir;  // FileStore directory; --spawn makes one when empty
  std::string hostname = "127.0.0.1";
  std::set<std::string> algos;  // empty: every candidate
  std::chrono::seconds timeout{120};
  std::chrono::seconds deadline{1800};  // --spawn: kill every rank past this
};

// Tags keep the harness's own statistics apart from the measured collectives' traffic, should a
// rank ever run ahead into the next call.
constexpr uint32_t kBenchTag = 0;
constexpr uint32_t kStatsTag = 1;

// One rank's view of the group.
class Group {
 public:
  Group(int rank, int size, const GlooOptions& g) : rank_(rank), size_(size) {
    gloo::transport::tcp::attr attr;
    attr.hostname = g.hostname;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(g.store_dir);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(g.timeout);
    context->connectFullMesh(store, device_);
    context_ = context;
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::shared_ptr<gloo::Context>& context() const { return context_; }

  void barrier() {
    gloo::BarrierOptions opts(context_);
    opts.setTag(kStatsTag);
    gloo::barrier(opts);
  }

  double max(double value) {
    return reduce(value, [](double a, double b) { return a > b ? a : b; });
  }
  double sum(double value) {
    return reduce(value, [](double a, double b) { return a + b; });
  }

 private:
  template <typename F>
  double reduce(double value, F f) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(&value, 1);
    opts.setReduceFunction([f](void* out, const void* a, const void* b, size_t n) {
      auto* o = static_cast<double*>(out);
      const auto* x = static_cast<const double*>(a);
      const auto* y = static_cast<const double*>(b);
      for (size_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    });
    opts.setTag(kStatsTag);
    gloo::allreduce(opts);
    return value;
  }

  int rank_;
  int size_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
};

// The buffers every candidate of one (op, size) works on.
struct Buffers {
  std::span<float> in;
  std::span<float> out;  // empty for in-place ops
};

// One algorithm, built (its scratch allocated, its slots taken) and ready to run repeatedly.
struct Candidate {
  std::string name;
  std::function<void()> run;
  bool result_in_input = false;  // in-place: the result is read from Buffers::in
};

using Builder = std::function<Candidate()>;

void sum_floats(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<float*>(out);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

// The builders of every Gloo algorithm for `op`, in the order they run. Builders, not built
// candidates, so that only one algorithm's scratch is alive at a time (at 64 MiB the class-based
// all_reduce algorithms each allocate one or two more buffers of the full size).
std::vector<std::pair<std::string, Builder>> builders_for(Op op, Group& group, Buffers b,
                                                          const peers::Shape& s) {
  const auto& ctx = group.context();
  const int count = static_cast<int>(s.block);
  float* in = b.in.data();
  float* out = b.out.data();
  std::vector<std::pair<std::string, Builder>> list;
  auto add = [&](std::string name, bool in_place, auto make_run) {
    list.emplace_back(name, [name, in_place, make_run]() {
      return Candidate{name, make_run(), in_place};
    });
  };
  switch (op) {
    case Op::AllReduce: {
      for (auto [name, algorithm] :
           {std::pair{"new_ring", gloo::AllreduceOptions::Algorithm::RING},
            std::pair{"new_bcube", gloo::AllreduceOptions::Algorithm::BCUBE}}) {
        add(name, true, [ctx, in, s, algorithm = algorithm]() -> std::function<void()> {
          return [ctx, in, s, algorithm]() {
            gloo::AllreduceOptions opts(ctx);
            opts.setAlgorithm(algorithm);
            opts.setOutput(in, s.block);
            opts.setReduceFunction(sum_floats);
            opts.setTag(kBenchTag);
            gloo::allreduce(opts);
          };
        });
      }
      auto legacy = [&](const char* name, auto tag) {
        using Algorithm = typename decltype(tag)::type;
        add(name, true, [ctx, in, count]() -> std::function<void()> {
          auto algorithm = std::make_shared<Algorithm>(ctx, std::vector<float*>{in}, count);
          return [algorithm]() { algorithm->run(); };
        });
      };
      legacy("ring", std::type_identity<gloo::AllreduceRing<float>>{});
      legacy("ring_chunked", std::type_identity<gloo::AllreduceRingChunked<float>>{});
      legacy("halving_doubling", std::type_identity<gloo::AllreduceHalvingDoubling<float>>{});
      legacy("bcube", std::type_identity<gloo::AllreduceBcube<float>>{});
      break;
    }
    case Op::AllGather:
      add("new", false, [ctx, in, out, s]() -> std::function<void()> {
        return [ctx, in, out, s]() {
          gloo::AllgatherOptions opts(ctx);
          opts.setInput(in, s.block);
          opts.setOutput(out, s.out_elems);
          opts.setTag(kBenchTag);
          gloo::allgather(opts);
        };
      });
      add("ring", false, [ctx, in, out, count]() -> std::function<void()> {
        auto algorithm = std::make_shared<gloo::AllgatherRing<float>>(
            ctx, std::vector<const float*>{in}, out, count);
        return [algorithm]() { algorithm->run(); };
      });
      break;
    case Op::ReduceScatter: {
      const int total = static_cast<int>(s.in_elems);
      std::vector<int> recv_elems(static_cast<size_t>(group.size()), count);
      add("halving_doubling", true, [ctx, in, total, recv_elems]() -> std::function<void()> {
        auto algorithm = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(
            ctx, std::vector<float*>{in}, total, recv_elems);
        return [algorithm]() { algorithm->run(); };
      });
      break;
    }
    case Op::Broadcast:
      add("new", true, [ctx, in, s]() -> std::function<void()> {
        return [ctx, in, s]() {
          gloo::BroadcastOptions opts(ctx);
          opts.setOutput(in, s.block);
          opts.setRoot(0);
          opts.setTag(kBenchTag);
          gloo::broadcast(opts);
        };
      });
      add("one_to_all", true, [ctx, in, s]() -> std::function<void()> {
        auto algorithm =
            std::make_shared<gloo::BroadcastOneToAll<float>>(ctx, std::vector<float*>{in}, s.block);
        return [algorithm]() { algorithm->run(); };
      });
      break;
    case Op::AllToAll:
      add("new", false, [ctx, in, out, s]() -> std::function<void()> {
        return [ctx, in, out, s]() {
          gloo::AlltoallOptions opts(ctx);
          opts.setInput(in, s.in_elems);
          opts.setOutput(out, s.out_elems);
          opts.setTag(kBenchTag);
          gloo::alltoall(opts);
        };
      });
      break;
    case Op::Barrier:
      add("new", true, [ctx]() -> std::function<void()> {
        return [ctx]() {
          gloo::BarrierOptions opts(ctx);
          opts.setTag(kBenchTag);
          gloo::barrier(opts);
        };
      });
      add("all_to_all", true, [ctx]() -> std::function<void()> {
        auto algorithm = std::make_shared<gloo::BarrierAllToAll>(ctx);
        return [algorithm]() { algorithm->run(); };
      });
      add("all_to_one", true, [ctx]() -> std::function<void()> {
        auto algorithm = std::make_shared<gloo::BarrierAllToOne>(ctx);
        return [algorithm]() { algorithm->run(); };
      });
      break;
  }
  return list;
}

struct Measured {
  std::string name;
  double seconds = 0;  // mean per op, slowest rank
  int64_t wrong = -1;  // summed over ranks and checked runs; -1: not checked
  int bad_runs = 0;    // checked runs with any wrong element
};

Measured measure(Group& group, const peers::Options& o, Op op, const peers::Shape& s, Buffers b,
                 Candidate& c) {
  // Fresh inputs for each candidate: in-place sums grow by a factor of P per run otherwise.
  peers::touch(op, group.rank(), b.in, b.out);
  for (int i = 0; i < o.warmup; ++i) c.run();
  group.barrier();
  auto start = Clock::now();
  for (int i = 0; i < o.iters; ++i) c.run();
  double mine = std::chrono::duration<double>(Clock::now() - start).count() / o.iters;
  Measured m{c.name, group.max(mine), -1, 0};
  if (o.check && op != Op::Barrier) {
    double wrong = 0, bad_runs = 0;
    for (int run = 0; run < o.check_runs; ++run) {
      peers::fill_input(op, group.rank(), b.in);
      peers::poison(b.out);
      group.barrier();
      c.run();
      std::span<const float> result = c.result_in_input ? b.in : b.out;
      peers::Wrong mine = peers::count_wrong(op, group.rank(), group.size(), s, result);
      if (mine.count > 0) {
        std::fprintf(stderr, "gloo_bench: rank %d/%d %s bytes=%zu algo=%s checked run %d: %s\n",
                     group.rank(), group.size(), peers::op_name(op), s.bytes, c.name.c_str(), run,
                     mine.describe().c_str());
      }
      double found = group.sum(static_cast<double>(mine.count));
      wrong += found;
      bad_runs += found > 0 ? 1 : 0;
    }
    m.wrong = static_cast<int64_t>(wrong);
    m.bad_runs = static_cast<int>(bad_runs);
  } else if (o.check) {
    m.wrong = 0;
  }
  return m;
}

void rank_main(int rank, int size, const peers::Options& o, const GlooOptions& g) {
  Group group(rank, size, g);
  if (rank == 0) {
    peers::print_header(
        "gloo",
        fmt::format("Gloo {}.{}.{} (gloo/config.h)", GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR,
                    GLOO_VERSION_PATCH),
        fmt::format("gloo::transport::tcp on {}, full mesh; FileStore rendezvous", g.hostname),
        size, o);
  }
  // One pair of buffers for every (op, size): sized for the largest, touched once here.
  size_t in_max = 1, out_max = 1;
  for (Op op : o.ops) {
    for (size_t bytes : o.sizes) {
      auto s = peers::shape_for(op, bytes, size);
      in_max = std::max(in_max, s.in_elems);
      out_max = std::max(out_max, s.out_elems);
    }
  }
  std::vector<float> in_storage(in_max), out_storage(out_max);
  peers::touch(Op::AllReduce, rank, in_storage, out_storage);

  for (Op op : o.ops) {
    for (size_t bytes : o.sizes) {
      auto s = peers::shape_for(op, bytes, size);
      Buffers b{std::span<float>(in_storage).first(s.in_elems),
                std::span<float>(out_storage).first(s.out_elems)};
      auto all = builders_for(op, group, b, s);
      std::vector<std::pair<std::string, Builder>> chosen;
      for (auto& entry : all) {
        if (g.algos.empty() || g.algos.count(entry.first) != 0) chosen.push_back(entry);
      }
      if (chosen.empty()) chosen = all;
      std::vector<Measured> results;
      for (auto& [name, build] : chosen) {
        Candidate c = build();
        results.push_back(measure(group, o, op, s, b, c));
      }
      const Measured* best = &results.front();
      for (const auto& m : results) {
        if (m.seconds < best->seconds) best = &m;
      }
      if (rank == 0) {
        const bool many_checks = o.check && o.check_runs > 1 && op != Op::Barrier;
        if (results.size() > 1 || many_checks) {
          std::string line = fmt::format("# gloo {} bytes={} candidates:", peers::op_name(op),
                                         op == Op::Barrier ? 0 : s.bytes);
          for (const auto& m : results) {
            line += fmt::format(" {}={:.1f}us/wrong={}", m.name, m.seconds * 1e6,
                                m.wrong < 0 ? std::string("-") : std::to_string(m.wrong));
            if (many_checks) line += fmt::format("/bad_runs={}of{}", m.bad_runs, o.check_runs);
          }
          fmt::print("{}\n", line);
        }
        fmt::print("{}\n", peers::result_line("gloo", op, size, op == Op::Barrier ? 0 : s.bytes,
                                              best->seconds, best->wrong, "algo=" + best->name));
        std::fflush(stdout);
      }
      if (op == Op::Barrier) break;  // sizes mean nothing to a barrier
    }
  }
  group.barrier();
}

// Forks `n` ranks and waits for them; the first to fail (or the deadline) ends the others.
int spawn(int n, const peers::Options& o, GlooOptions g) {
  bool own_dir = g.store_dir.empty();
  if (own_dir) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gloo_bench.XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("gloo_bench: mkdtemp");
      return 1;
    }
    g.store_dir = tmpl;
  }
  // SIGCHLD stays blocked in the parent and is taken with sigtimedwait: the parent sleeps until
  // a child ends or the deadline passes, and never polls.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  std::map<pid_t, int> running;  // pid -> rank
  // Each rank on its share of the cores when they fit, as mpirun and weft's launchers bind theirs
  // in benchmarks/compare.
  const std::vector<weft::CpuInfo> cpus = weft::allowed_cpus();
  for (int rank = 0; rank < n; ++rank) {
    const cpu_set_t mask = weft::cpu_mask(weft::cpu_share(cpus, rank, n));
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("gloo_bench: fork");
      for (auto& [p, r] : running) kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      sigprocmask(SIG_UNBLOCK, &chld, nullptr);
      if (CPU_COUNT(&mask) > 0) sched_setaffinity(0, sizeof mask, &mask);
      int rc = 0;
      try {
        rank_main(rank, n, o, g);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_bench: rank %d/%d: %s\n", rank, n, e.what());
        rc = 1;
      }
      std::fflush(stdout);
      _exit(rc);
    }
    running[pid] = rank;
  }
  int rc = 0;
  auto deadline = Clock::now() + g.deadline;
  while (!running.empty()) {
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      std::string ranks;
      for (auto& [p, r] : running) ranks += fmt::format(" {}", r);
      std::fprintf(stderr, "gloo_bench: deadline of %lld s passed; killing ranks%s\n",
                   static_cast<long long>(g.deadline.count()), ranks.c_str());
      for (auto& [p, r] : running) kill(p, SIGKILL);
      rc = 1;
      for (auto& [p, r] : running) waitpid(p, nullptr, 0);
      break;
    }
    auto secs = std::chrono::duration_cast<std::chrono::seconds>(left);
    timespec ts{static_cast<time_t>(secs.count()),
                static_cast<long>(std::chrono::nanoseconds(left - secs).count())};
    sigtimedwait(&chld, nullptr, &ts);  // EAGAIN at the deadline, EINTR: both loop around
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      int rank = running[pid];
      running.erase(pid);
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        if (WIFSIGNALED(status)) {
          std::fprintf(stderr, "gloo_bench: rank %d killed by signal %d\n", rank, WTERMSIG(status));
        } else {
          std::fprintf(stderr, "gloo_bench: rank %d exited with %d\n", rank, WEXITSTATUS(status));
        }
        if (rc == 0) {
          for (auto& [p, r] : running) kill(p, SIGTERM);
        }
        rc = 1;
      }
    }
  }
  if (own_dir) {
    std::error_code ec;
    std::filesystem::remove_all(g.store_dir, ec);
  }
  return rc;
}

constexpr const char* kUsage =
    "usage: gloo_bench --spawn N [flags]\n"
    "       RANK=r WORLD_SIZE=n gloo_bench --store-dir DIR [flags]\n"
    "  --spawn N            fork N ranks (a fresh FileStore directory unless --store-dir)\n"
    "  --store-dir DIR      FileStore rendezvous directory, empty and shared by all ranks\n"
    "  --hostname H         address of the TCP device (default 127.0.0.1)\n"
    "  --algo LIST          only these candidates (see the file comment), default all\n"
    "  --timeout S          Gloo context timeout (default 120)\n"
    "  --deadline S         --spawn: kill all ranks after S seconds (default 1800)\n";

}  // namespace

int main(int argc, char** argv) {
  GlooOptions g;
  peers::Options o;
  try {
    o = peers::parse_common(argc, argv, [&](std::string_view flag, const char* value) -> int {
      if (flag == "--help" || flag == "-h") {
        std::fputs(kUsage, stdout);
        std::fputs(peers::kCommonUsage, stdout);
        std::exit(0);
      }
      if (value == nullptr) return 0;
      if (flag == "--spawn") {
        g.spawn = std::stoi(value);
      } else if (flag == "--store-dir") {
        g.store_dir = value;
      } else if (flag == "--hostname") {
        g.hostname = value;
      } else if (flag == "--algo") {
        for (const auto& name : peers::split(value, ',')) g.algos.insert(name);
      } else if (flag == "--timeout") {
        g.timeout = std::chrono::seconds(std::stoi(value));
      } else if (flag == "--deadline") {
        g.deadline = std::chrono::seconds(std::stoi(value));
      } else {
        return 0;
      }
      return 2;
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench: %s\n%s%s", e.what(), kUsage, peers::kCommonUsage);
    return 2;
  }
  if (g.spawn > 0) return spawn(g.spawn, o, g);

  const char* rank_env = std::getenv("RANK");
  const char* size_env = std::getenv("WORLD_SIZE");
  if (rank_env == nullptr || size_env == nullptr || g.store_dir.empty()) {
    std::fprintf(stderr, "gloo_bench: give --spawn N, or RANK, WORLD_SIZE and --store-dir\n%s",
                 kUsage);
    return 2;
  }
  int rank = std::atoi(rank_env);
  int size = std::atoi(size_env);
  try {
    rank_main(rank, size, o, g);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench: rank %d/%d: %s\n", rank, size, e.what());
    return 1;
  }
  return 0;
}
