// recorder_bench (built in tests/, as it reaches into runtime/): what the flight recorder costs per
// operation (runtime/flight_recorder.h),
// measured alone, so that the figure is not lost in the noise of a collective's own latency.
// One thread records operations the way a group and its progress thread do: queued (with the
// call's arguments), started, the algorithm, completed; a TraceRef copied as a Collective and a
// Work carry it.
//
//   recorder_bench [OPERATIONS]        (default 5000000)
//
// Prints ns per operation, the median of 5 rounds.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "weft/backend.h"

#include "runtime/flight_recorder.h"

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  const long operations = argc > 1 ? std::atol(argv[1]) : 5'000'000;
  weft::FlightRecorder::GroupInfo info;
  info.name = "world";
  info.id = "world";
  info.size = 2;
  info.global_ranks = {0, 1};
  auto recorder = std::make_shared<weft::FlightRecorder>(info, 2000);
  std::vector<float> data(2);
  weft::Collective c;
  c.kind = weft::CollectiveKind::AllReduce;
  c.inputs.push_back(weft::Tensor::of(data.data(), 2));
  c.outputs.push_back(weft::Tensor::of(data.data(), 2));
  std::vector<double> rounds;
  uint64_t seq = 0;
  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    for (long i = 0; i < operations; ++i) {
      c.seq = ++seq;
      c.trace = weft::TraceRef{recorder, recorder->queued(c, weft::DType::Float32, 0x1234), 1, seq};
      weft::TraceRef work_copy = c.trace;  // what the Work holds
      recorder->started(work_copy);
      recorder->note_algorithm(work_copy.first, "recursive_doubling");
      recorder->finished(work_copy, nullptr);
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    rounds.push_back(ns / static_cast<double>(operations));
  }
  std::sort(rounds.begin(), rounds.end());
  std::printf("recorder_bench operations=%ld ns_per_operation=%.1f (min %.1f, max %.1f)\n",
              operations, rounds[2], rounds.front(), rounds.back());
  return 0;
}
