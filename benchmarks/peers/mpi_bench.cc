// mpi_bench: the MPI library's collectives, in the format gloo_bench and weft's own figures use.
// Run under the library's launcher; what carries the bytes is the launcher's choice:
//
//   mpirun -n 4 mpi_bench                                   # Open MPI's default: shared memory
//   mpirun -n 4 --mca pml ob1 --mca btl self,vader mpi_bench   # shared memory, said outright
//   mpirun -n 4 --mca pml ob1 --mca btl self,tcp mpi_bench     # TCP on loopback only
//
// (as root add --allow-run-as-root; with more ranks than cores add --oversubscribe.)
//
// Ops: MPI_Allreduce (in place, MPI_IN_PLACE, as Gloo's are), MPI_Allgather,
// MPI_Reduce_scatter_block, MPI_Bcast (root 0), MPI_Alltoall, MPI_Barrier, all on MPI_COMM_WORLD
// with MPI_FLOAT / MPI_SUM; the library picks the algorithm (Open MPI: coll/tuned's decision
// rules), printed as algo=library.
//
// Timing: MPI_Barrier, then --iters calls back to back; each rank's mean per op, the slowest
// rank's printed (MPI_Reduce with MPI_MAX). Buffers are allocated once for the largest size and
// touched before any timing. With --check (the default) one more call follows the timed ones on
// freshly filled inputs and NaN-filled outputs; wrong= counts the elements, summed over ranks,
// that differ from the closed-form value (peer_common.h).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "peer_common.h"

namespace {

using Clock = std::chrono::steady_clock;
using peers::Op;

void run_op(Op op, const peers::Shape& s, std::span<float> in, std::span<float> out) {
  const int count = static_cast<int>(s.block);
  switch (op) {
    case Op::AllReduce:
      MPI_Allreduce(MPI_IN_PLACE, in.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case Op::AllGather:
      MPI_Allgather(in.data(), count, MPI_FLOAT, out.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case Op::ReduceScatter:
      MPI_Reduce_scatter_block(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case Op::Broadcast:
      MPI_Bcast(in.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    case Op::AllToAll:
      MPI_Alltoall(in.data(), count, MPI_FLOAT, out.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case Op::Barrier:
      MPI_Barrier(MPI_COMM_WORLD);
      break;
  }
}

// The MCA selection as the launcher passed it down (mpirun --mca X Y sets OMPI_MCA_X in each
// rank's environment); unset means Open MPI chose by priority.
std::string transport_line() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "(default)");
  };
  return fmt::format("pml {}, btl {} (OMPI_MCA_pml / OMPI_MCA_btl)", env("OMPI_MCA_pml"),
                     env("OMPI_MCA_btl"));
}

constexpr const char* kUsage = "usage: mpirun -n N mpi_bench [flags]\n";

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);

  peers::Options o;
  try {
    o = peers::parse_common(argc, argv, [&](std::string_view flag, const char*) -> int {
      if (flag == "--help" || flag == "-h") {
        if (rank == 0) std::fputs(kUsage, stdout), std::fputs(peers::kCommonUsage, stdout);
        MPI_Finalize();
        std::exit(0);
      }
      return 0;
    });
  } catch (const std::exception& e) {
    if (rank == 0)
      std::fprintf(stderr, "mpi_bench: %s\n%s%s", e.what(), kUsage, peers::kCommonUsage);
    MPI_Finalize();
    return 2;
  }

  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    // The string is several lines, and the length Open MPI gives counts the terminating NUL.
    std::string library(version, static_cast<size_t>(len));
    library.resize(std::min(library.size(), library.find_first_of(std::string_view("\r\n\0", 3))));
    while (!library.empty() && library.back() == ' ') library.pop_back();
    peers::print_header("mpi", library, transport_line(), size, o);
  }

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
      std::span<float> in = std::span<float>(in_storage).first(s.in_elems);
      std::span<float> out = std::span<float>(out_storage).first(s.out_elems);
      peers::touch(op, rank, in, out);
      for (int i = 0; i < o.warmup; ++i) run_op(op, s, in, out);
      MPI_Barrier(MPI_COMM_WORLD);
      auto start = Clock::now();
      for (int i = 0; i < o.iters; ++i) run_op(op, s, in, out);
      double mine = std::chrono::duration<double>(Clock::now() - start).count() / o.iters;
      double slowest = 0;
      MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

      long long wrong = -1;
      int bad_runs = 0;  // checked runs with any wrong element (rank 0 counts them)
      if (o.check) {
        wrong = 0;
        for (int run = 0; run < o.check_runs; ++run) {
          long long mine_wrong = 0, found = 0;
          if (op != Op::Barrier) {
            peers::fill_input(op, rank, in);
            peers::poison(out);
            MPI_Barrier(MPI_COMM_WORLD);
            run_op(op, s, in, out);
            bool in_place = op == Op::AllReduce || op == Op::Broadcast;
            peers::Wrong mine = peers::count_wrong(op, rank, size, s, in_place ? in : out);
            mine_wrong = mine.count;
            if (mine.count > 0) {
              std::fprintf(stderr, "mpi_bench: rank %d/%d %s bytes=%zu checked run %d: %s\n", rank,
                           size, peers::op_name(op), s.bytes, run, mine.describe().c_str());
            }
          }
          MPI_Reduce(&mine_wrong, &found, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
          wrong += found;
          bad_runs += found > 0 ? 1 : 0;
          if (op == Op::Barrier) break;
        }
      }
      if (rank == 0) {
        if (o.check && o.check_runs > 1 && op != Op::Barrier) {
          fmt::print("# mpi {} bytes={}: {} of {} checked runs had wrong elements\n",
                     peers::op_name(op), s.bytes, bad_runs, o.check_runs);
        }
        fmt::print("{}\n", peers::result_line("mpi", op, size, op == Op::Barrier ? 0 : s.bytes,
                                              slowest, wrong, "algo=library"));
        std::fflush(stdout);
      }
      if (op == Op::Barrier) break;  // sizes mean nothing to a barrier
    }
  }
  MPI_Finalize();
  return 0;
}
