// rank_program: the program weftrun_test launches. Each rank rendezvouses from its environment,
// checks what it got against the launcher's variables, passes a store barrier, prints lines, and
// then does what its flags say:
//   --lines N             print "rank R of W: line I" for I < N on stdout (default 1)
//   --exit-rank R --exit-code C   rank R exits with code C after printing
//   --kill-rank R         rank R sends itself SIGKILL after printing
//   --hang                every rank that does not fail waits (for a key nobody sets) instead of
//                         exiting, so the launcher has to stop it
//   --ignore-sigterm      ignore SIGTERM, so the launcher has to escalate to SIGKILL
//   --abort-on-sigterm    abort() on SIGTERM: a rank that dies of its own signal while stopped
//   --dump-request        the exiting rank (--exit-rank) first asks the job to dump its flight
//                         recorders, as a rank that timed out does (docs/flight-recorder.md)
//   --shm-stall R         before printing, every rank but R starts shared-memory set-up with
//                         every peer while R takes TCP only, so the others wait in set-up, their
//                         segments created and not yet unlinked, until they are stopped
// Otherwise every rank prints "rank R ok" and exits 0. A failed check exits 10.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "weft/error.h"
#include "weft/rendezvous.h"

#include "backends/tcp/routed_transport.h"

namespace {

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : -1;
}

[[noreturn]] void check_failed(const char* what, int got, int expected) {
  std::fprintf(stderr, "rank_program: %s is %d, expected %d\n", what, got, expected);
  std::exit(10);
}

void abort_now(int) { std::abort(); }

}  // namespace

int main(int argc, char** argv) {
  int lines = 1, exit_rank = -1, exit_code = 0, kill_rank = -1, shm_stall = -1;
  bool hang = false;
  bool dump_request = false;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : -1; };
    if (std::strcmp(argv[i], "--lines") == 0) {
      lines = next();
    } else if (std::strcmp(argv[i], "--exit-rank") == 0) {
      exit_rank = next();
    } else if (std::strcmp(argv[i], "--exit-code") == 0) {
      exit_code = next();
    } else if (std::strcmp(argv[i], "--kill-rank") == 0) {
      kill_rank = next();
    } else if (std::strcmp(argv[i], "--hang") == 0) {
      hang = true;
    } else if (std::strcmp(argv[i], "--ignore-sigterm") == 0) {
      signal(SIGTERM, SIG_IGN);
    } else if (std::strcmp(argv[i], "--abort-on-sigterm") == 0) {
      signal(SIGTERM, abort_now);
    } else if (std::strcmp(argv[i], "--dump-request") == 0) {
      dump_request = true;
    } else if (std::strcmp(argv[i], "--shm-stall") == 0) {
      shm_stall = next();
    } else {
      std::fprintf(stderr, "rank_program: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  try {
    weft::Rendezvous rdzv = weft::rendezvous();
    if (rdzv.rank != env_int("RANK")) check_failed("rank", rdzv.rank, env_int("RANK"));
    if (rdzv.world_size != env_int("WORLD_SIZE")) {
      check_failed("world_size", rdzv.world_size, env_int("WORLD_SIZE"));
    }
    if (rdzv.local_rank != env_int("LOCAL_RANK")) {
      check_failed("local_rank", rdzv.local_rank, env_int("LOCAL_RANK"));
    }
    // Under weftrun the launcher hosts the store: no rank may.
    if (rdzv.server != nullptr) check_failed("hosting the store", 1, 0);

    weft::Store& store = *rdzv.store;
    if (store.add("program/arrived", 1) == rdzv.world_size) store.set("program/go", "1");
    store.wait({"program/go"});

    const int r = rdzv.rank;
    std::unique_ptr<weft::tcp::RoutedTransport> transport;
    if (shm_stall >= 0) {
      // Breaks RoutedTransport's rule that every rank agrees on shm_between, on purpose: the
      // others wait for rank shm_stall's shared-memory record, which never comes.
      weft::tcp::RoutedTransport::Options options;
      options.key_prefix = "program/transport";
      options.timeout = std::chrono::seconds(60);
      options.shm_between = [&](int, int) { return r != shm_stall; };
      transport = weft::tcp::RoutedTransport::connect(store, r, rdzv.world_size, options);
    }
    for (int i = 0; i < lines; ++i) std::printf("rank %d of %d: line %d\n", r, rdzv.world_size, i);
    std::fprintf(stderr, "rank %d: on stderr\n", r);
    std::fflush(stdout);
    std::fflush(stderr);
    if (r == exit_rank) {
      if (dump_request) {
        const int64_t n = store.add("weft/trace/requests", 1);
        store.set("weft/trace/request/" + std::to_string(n), "file rank_program --dump-request");
      }
      std::exit(exit_code);
    }
    if (r == kill_rank) raise(SIGKILL);
    if (hang) {
      std::printf("rank %d waiting\n", r);
      std::fflush(stdout);
      store.wait({"program/never"}, std::chrono::seconds(60));
      return 11;
    }
    std::printf("rank %d ok\n", r);
    return 0;
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "rank_program: %s\n", e.what());
    return 12;
  }
}
