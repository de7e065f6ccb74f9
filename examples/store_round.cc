// examples/store_round.cc: every rank meets the others through the store, the way a process
// group will at its start, and times a store-based all-gather of one small record per rank.
//
//   weftrun --nproc-per-node 4 --standalone build/examples/store_round [rounds]
//
// It uses only the public API: rendezvous() from the launcher's environment, then
// set / add / wait / multi_get on the store it returns.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "weft/error.h"
#include "weft/rendezvous.h"

namespace {

std::string key_of(int round, int rank) {
  return "store_round/" + std::to_string(round) + "/" + std::to_string(rank);
}

// A store barrier: every rank adds to the round's counter, then waits for the last one's key.
void barrier(weft::Store& store, int world_size, const std::string& name) {
  if (store.add(name + "/count", 1) == world_size) store.set(name + "/done", "1");
  store.wait({name + "/done"});
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 100;
  try {
    weft::Rendezvous rdzv = weft::rendezvous();
    weft::Store& store = *rdzv.store;
    const int n = rdzv.world_size;

    std::vector<std::string> keys;
    auto start = std::chrono::steady_clock::now();
    for (int round = 0; round < rounds; ++round) {
      store.set(key_of(round, rdzv.rank),
                "rank " + std::to_string(rdzv.rank) + " pid " + std::to_string(getpid()));
      keys.clear();
      for (int r = 0; r < n; ++r) keys.push_back(key_of(round, r));
      auto values = store.multi_get(keys);
      for (int r = 0; r < n; ++r) {
        std::string expected = "rank " + std::to_string(r);
        if (weft::to_string(values[r]).rfind(expected, 0) != 0) {
          std::fprintf(stderr, "round %d: value of rank %d is \"%s\"\n", round, r,
                       weft::to_string(values[r]).c_str());
          return 1;
        }
      }
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                    .count() /
                (rounds > 0 ? rounds : 1);
    std::printf("rank %d/%d (local %d/%d): %d store all-gathers of %d records, %.1f us each\n",
                rdzv.rank, n, rdzv.local_rank, rdzv.local_world_size, rounds, n, us);
    // Nobody leaves while another rank may still read keys from rank 0's store.
    barrier(store, n, "store_round/exit");
    return 0;
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "store_round: %s\n", e.what());
    return 1;
  }
}
