// tests/hosts/fault_worker.cc: one rank of the fault tests across namespace hosts
// (tests/hosts/fault_kill_test.py), written against the public API only.
//
//   fault_worker MODE [--iterations N] [--mib M]
//
// MODE says what the job does after init_process_group() (env://, torchrun's variables):
//   allreduce  N all_reduces of M MiB of float32 over the world (TCP between hosts)
//   symmetric  the same with the data in a symmetric buffer of the world (zero-copy on each host,
//              hierarchically across hosts: docs/symmetric-memory.md)
//   host       split() by host, then N all_reduces of M MiB on the host's group (shared memory)
//   split      N rounds of split() into evens and odds, then new_group() of the world backwards,
//              each new group checked by one all_reduce and destroyed
// FAULT_WORKER_HOLD=PHASE in the environment makes this rank stop before PHASE ("rendezvous", or
// "split": the second one) and wait to be killed, so that the test kills it while the others are
// inside that phase.
//
// Every step is a line on stdout, flushed, for the test to wait on ("phase rendezvous",
// "iteration 3 start", "holding split", "done"). Results are checked element by element against
// a closed form. A weft::Error ends the program with exit 3 after the line
// "ERROR <Code>: <message>"; a wrong element with exit 5 after "MISMATCH ...".
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/process_group.h"
#include "weft/symmetric_buffer.h"
#include "weft/work.h"

namespace {

struct Args {
  std::string mode;
  int iterations = 5;
  size_t mib = 64;
  std::string hold;
};

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "fault_worker: %s\nusage: fault_worker allreduce|symmetric|host|split "
               "[--iterations N] "
               "[--mib M]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  if (argc < 2) usage("no mode");
  Args args;
  args.mode = argv[1];
  if (const char* hold = std::getenv("FAULT_WORKER_HOLD")) args.hold = hold;
  if (args.mode != "allreduce" && args.mode != "symmetric" && args.mode != "host" &&
      args.mode != "split") {
    usage("unknown mode");
  }
  for (int i = 2; i < argc; i += 2) {
    if (i + 1 >= argc) usage("a flag without its value");
    std::string flag = argv[i];
    if (flag == "--iterations") {
      args.iterations = std::atoi(argv[i + 1]);
    } else if (flag == "--mib") {
      args.mib = static_cast<size_t>(std::atoll(argv[i + 1]));
    } else {
      usage("unknown flag");
    }
  }
  return args;
}

// Stops here until killed: the test kills this rank while the others are inside `phase`.
void hold_if(const Args& args, const std::string& phase) {
  if (args.hold != phase) return;
  say("holding " + phase);
  for (;;) pause();
}

// Rank r of `group` contributes (r + 1) * (iteration + 1) + i % 7 at index i: the sum over P
// ranks is (iteration + 1) * P (P + 1) / 2 + P * (i % 7), exact in float32 for these sizes.
void checked_all_reduce(weft::ProcessGroup& group, std::span<float> data, int iteration) {
  const int rank = group.rank();
  const int size = group.size();
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<float>((rank + 1) * (iteration + 1) + static_cast<int>(i % 7));
  }
  group.all_reduce(weft::Tensor::of(data.data(), data.size()))->wait();
  for (size_t i = 0; i < data.size(); ++i) {
    const float want = static_cast<float>((iteration + 1) * size * (size + 1) / 2 +
                                          size * static_cast<int>(i % 7));
    if (data[i] != want) {
      say(fmt::format("MISMATCH rank {}/{} group \"{}\" iteration {}: element {} is {}, not {}",
                      rank, size, group.name(), iteration, i, data[i], want));
      std::exit(5);
    }
  }
}

void run_all_reduces(weft::ProcessGroup& group, const Args& args, bool symmetric = false) {
  const size_t count = args.mib * 1024 * 1024 / sizeof(float);
  std::vector<float> memory(symmetric ? 0 : count);
  std::shared_ptr<weft::SymmetricBuffer> buffer;
  std::span<float> data(memory);
  if (symmetric) {
    buffer = group.allocate_symmetric(count * sizeof(float));
    data = std::span<float>(static_cast<float*>(buffer->data()), count);
  }
  for (int it = 0; it < args.iterations; ++it) {
    say(fmt::format("iteration {} start", it));
    checked_all_reduce(group, data, it);
    say(fmt::format("iteration {} ok", it));
  }
}

// The ranks that share this rank's host name form one group (shared memory between them).
std::shared_ptr<weft::ProcessGroup> split_by_host(weft::ProcessGroup& world) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::vector<weft::Bytes> names = world.all_gather_object(weft::Bytes(host, host + strlen(host)));
  int color = 0;
  while (names[color] != names[world.rank()]) ++color;
  return world.split(color, world.rank(), {.name = fmt::format("host{}", color)});
}

void run_splits(weft::ProcessGroup& world, const Args& args) {
  std::vector<float> data(1024);
  const int rank = world.rank();
  const int size = world.size();
  for (int round = 0; round < args.iterations; ++round) {
    say(fmt::format("phase split {}", round));
    if (round == 1) hold_if(args, "split");
    auto half = world.split(rank % 2, rank, {.name = fmt::format("half{}", round)});
    checked_all_reduce(*half, data, round);
    half->destroy();
    std::vector<int> backwards;
    for (int r = size - 1; r >= 0; --r) backwards.push_back(r);
    auto reversed = world.new_group(backwards, {.name = fmt::format("backwards{}", round)});
    checked_all_reduce(*reversed, data, round);
    reversed->destroy();
    say(fmt::format("split {} ok", round));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    say("phase rendezvous");
    hold_if(args, "rendezvous");
    auto world = weft::init_process_group();
    say(fmt::format("phase ready rank {}/{}", world->rank(), world->size()));
    if (args.mode == "allreduce" || args.mode == "symmetric") {
      run_all_reduces(*world, args, args.mode == "symmetric");
    } else if (args.mode == "host") {
      auto host = split_by_host(*world);
      say(fmt::format("phase host group {}/{}", host->rank(), host->size()));
      run_all_reduces(*host, args);
      host->destroy();
    } else {
      run_splits(*world, args);
    }
    // Rank 0 may host the store: everyone leaves together. A barrier of the backend, not the
    // store's monitored_barrier, so that a rank lost meanwhile fails it at once (PeerLost).
    world->barrier()->wait();
    world->destroy();
    say("done");
  } catch (const weft::Error& e) {
    say(fmt::format("ERROR {}: {}", weft::error_code_name(e.code()), e.what()));
    return 3;
  }
  return 0;
}
