// examples/embed.cc: weft's C++ API as a program that embeds it uses it: join the job, reduce,
// gather, and overlap communication with computation.
//
//   weftrun --nproc-per-node 2 --standalone build/examples/embed
//   c++ -std=c++20 embed.cc $(pkg-config --cflags --libs weft)   # against an installed weft
//
// Each rank checks every element it receives against values it computes itself and prints one
// line; any failure prints the weft::Error's message (rank, group, op, sequence number, what went
// wrong) and exits 1. Only the public headers are used.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "weft/error.h"
#include "weft/process_group.h"
#include "weft/tensor.h"
#include "weft/work.h"

namespace {

// Throws when a received value is not the expected one, naming the step, index and both values.
void expect(bool ok, const char* step, size_t index, double got, double expected) {
  if (!ok) {
    throw std::runtime_error(std::string(step) + ": element " + std::to_string(index) + " is " +
                             std::to_string(got) + ", expected " + std::to_string(expected));
  }
}

// Stands in for the computation a trainer overlaps with its gradient all_reduce: a dot product
// of two local vectors, whose value is known in closed form so the example can check it.
double local_compute(size_t n) {
  std::vector<double> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<double>(i % 8);
    b[i] = 2.0;
  }
  double dot = 0;
  for (size_t i = 0; i < n; ++i) dot += a[i] * b[i];
  return dot;
}

}  // namespace

int main() {
  try {
    // 1. Join the job. With no options, init_process_group() reads the launcher's environment
    //    (weftrun, torchrun, srun, mpirun: docs/launching.md), meets the other ranks through
    //    the job's store and connects the default backend. It returns the "world" group.
    std::shared_ptr<weft::ProcessGroup> world = weft::init_process_group();
    const int rank = world->rank();
    const int size = world->size();

    // 2. all_reduce, in place. Collectives take a weft::Tensor: a borrowed view (pointer, count,
    //    dtype), never a copy. Every collective is asynchronous and returns a Work at once;
    //    ->wait() right away makes it synchronous, and throws weft::Error if it failed.
    std::vector<float> grad(1000);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(rank) + 0.25f * i;
    world->all_reduce(weft::Tensor::of(grad.data(), grad.size()), weft::ReduceOp::Sum)->wait();
    for (size_t i = 0; i < grad.size(); ++i) {
      // Sums of quarters stay exact in float32 at these sizes, so == is the right test.
      const float expected = static_cast<float>(size * (size - 1) / 2) + size * 0.25f * i;
      expect(grad[i] == expected, "all_reduce", i, grad[i], expected);
    }

    // 3. all_gather_into_tensor: every rank contributes one block; the output holds size()
    //    blocks, rank-major (rank r's block at r * block.size()).
    std::vector<int64_t> block(256), gathered(256 * size);
    for (size_t j = 0; j < block.size(); ++j) block[j] = int64_t{rank} * 1000 + j;
    world
        ->all_gather_into_tensor(weft::Tensor::of(gathered.data(), gathered.size()),
                                 weft::Tensor::of(block.data(), block.size()))
        ->wait();
    for (size_t k = 0; k < gathered.size(); ++k) {
      const int64_t expected = int64_t(k / block.size()) * 1000 + int64_t(k % block.size());
      expect(gathered[k] == expected, "all_gather_into_tensor", k, gathered[k], expected);
    }

    // 4. Overlap: issue a large all_reduce, compute while it runs on the backend's thread, then
    //    wait. Until the Work completes, weft owns `big`: do not read or write it meanwhile.
    std::vector<float> big(size_t{1} << 21);  // 8 MiB
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(rank + i % 16);
    const auto start = std::chrono::steady_clock::now();
    std::shared_ptr<weft::Work> work =
        world->all_reduce(weft::Tensor::of(big.data(), big.size()), weft::ReduceOp::Sum);
    const double dot = local_compute(size_t{1} << 20);  // runs while the all_reduce does
    const auto computed = std::chrono::steady_clock::now();
    work->wait();  // the group's timeout (WEFT_TIMEOUT, 300 s) bounds the wait
    const auto finished = std::chrono::steady_clock::now();
    // sum over i < 2^20 of (i % 8) * 2 = 2^20 / 8 * (0 + 1 + ... + 7) * 2
    const double expected_dot = double(size_t{1} << 17) * 28 * 2;
    expect(dot == expected_dot, "local_compute", 0, dot, expected_dot);
    for (size_t i = 0; i < big.size(); ++i) {
      const float expected = static_cast<float>(size * (size - 1) / 2 + size * (i % 16));
      expect(big[i] == expected, "overlapped all_reduce", i, big[i], expected);
    }

    using ms = std::chrono::duration<double, std::milli>;
    std::printf(
        "rank %d/%d: all_reduce, all_gather_into_tensor and an 8 MiB all_reduce ok; "
        "%.1f ms of compute overlapped, %.1f ms more waiting\n",
        rank, size, ms(computed - start).count(), ms(finished - computed).count());
    std::fflush(stdout);

    // 5. Leave together: without a launcher's store, rank 0 hosts the store the other ranks'
    //    groups use. Destroying the group (here: dropping the last reference) waits for what
    //    was issued and closes its connections.
    world->barrier()->wait();
    return 0;
  } catch (const weft::Error& e) {
    // e.code() says what to do (error.h): fix the call, retry, or rebuild the group.
    std::fprintf(stderr, "embed: %s\n", e.what());
  } catch (const std::exception& e) {  // the checks above

    std::fprintf(stderr, "embed: %s\n", e.what());
  }
  return 1;
}
