// plugin_overhead_bench: what weft itself costs per operation of a backend plugin, measured with
// a plugin that does no work (tests/plugin/misbehave_plugin.cc in mode "ok": every operation
// completes inside post()). One process, a one-rank group over a HashStore, so nothing but weft's
// path from the caller to the plugin and back is timed.
//
//   plugin_overhead_bench PLUGIN_DIR [BACKEND [ITERATIONS]]
//   plugin_overhead_bench build/tests/plugin misbehave 20000
//
// Prints, per backend, microseconds per operation two ways (medians of 5 rounds):
//   latency     post one all_reduce of one float, wait for it, repeat (a small collective's path)
//   throughput  post ITERATIONS all_reduces, then wait for them all (a stream of posts)
// BACKEND defaults to "misbehave" (callback completion); "misbehave_poll" is the polling build.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/hash_store.h"
#include "weft/process_group.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: plugin_overhead_bench PLUGIN_DIR [BACKEND [ITERATIONS]]\n");
    return 2;
  }
  setenv("WEFT_PLUGIN_PATH", argv[1], 1);
  const std::string backend = argc > 2 ? argv[2] : "misbehave";
  const int iterations = argc > 3 ? std::atoi(argv[3]) : 20000;
  weft::ProcessGroupOptions options;
  options.store = std::make_shared<weft::HashStore>();
  options.rank = 0;
  options.world_size = 1;
  options.backend = "cpu:" + backend;
  options.backend_settings = {{"mode", "ok"}};
  options.timeout = std::chrono::seconds(30);
  auto group = weft::init_process_group(options);
  float x = 1;
  std::vector<double> latency, throughput;
  for (int round = 0; round < 5; ++round) {
    auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) group->all_reduce(weft::Tensor::of(&x, 1))->wait();
    latency.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                      iterations);
    std::vector<std::shared_ptr<weft::Work>> works;
    works.reserve(iterations);
    start = Clock::now();
    for (int i = 0; i < iterations; ++i)
      works.push_back(group->all_reduce(weft::Tensor::of(&x, 1)));
    weft::wait_all(works);
    throughput.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                         iterations);
  }
  std::printf("%s\n", fmt::format("backend={} iterations={} latency_us={:.2f} throughput_us={:.2f}",
                                  backend, iterations, median(latency), median(throughput))
                          .c_str());
  return 0;
}
