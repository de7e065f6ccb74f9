// The flight recorder end to end (docs/flight-recorder.md): real ranks (forked processes) fail on
// purpose, every rank dumps, and weft-trace (the installed tool, WEFT_TEST_TRACE_TOOL) names what
// went wrong. Also: weft-trace --store on a live job, the watchdog on a stuck progress thread,
// SIGUSR1 and dump_trace().
//
// As in tests/faults, the parent makes no weft call (config() would be cached and reach every
// child through fork); each rank sets WEFT_TRACE_DIR and WEFT_TRACE_POLL before its first one.
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/process_group.h"
#include "weft/tcp_store.h"

#include "tests/support/multiproc.h"

namespace weft {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A fresh folder for one test's dumps, removed at the end.
struct DumpDir {
  fs::path path;
  DumpDir() {
    std::string pattern = (fs::temp_directory_path() / "weft-trace-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~DumpDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path file(int rank) const { return path / fmt::format("weft-trace-rank{}.json", rank); }
};

// In a rank, before its first weft call.
void trace_into(const DumpDir& dir) {
  setenv("WEFT_TRACE_DIR", dir.path.c_str(), 1);
  setenv("WEFT_TRACE_POLL", "100ms", 1);
}

std::shared_ptr<ProcessGroup> join(uint16_t port, int rank, int size, milliseconds timeout) {
  ProcessGroupOptions options;
  options.url = fmt::format("tcp://127.0.0.1:{}", port);
  options.rank = rank;
  options.world_size = size;
  options.timeout = timeout;
  // WEFT_TEST_BACKEND runs the same cases over another backend (meson: "ucx").
  if (const char* backend = std::getenv("WEFT_TEST_BACKEND"); backend && *backend) {
    options.backend = backend;
  }
  return init_process_group(options);
}

// Waits (in a rank) until the dumps of `ranks` exist: the store's host (rank 0) must outlive the
// requests the others answer through it.
// Dumps are renamed into place, so the folder's IN_MOVED_TO events wake the wait.
void wait_for_dumps(const DumpDir& dir, const std::vector<int>& ranks,
                    milliseconds bound = seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  const int watch = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  RANK_CHECK(watch >= 0, "inotify_init1: {}", std::strerror(errno));
  RANK_CHECK(inotify_add_watch(watch, dir.path.c_str(), IN_MOVED_TO | IN_CREATE) >= 0,
             "inotify_add_watch: {}", std::strerror(errno));
  for (int r : ranks) {
    while (!fs::exists(dir.file(r))) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      RANK_CHECK(left.count() > 0, "no dump from rank {} in {}", r, dir.path.string());
      pollfd event{watch, POLLIN, 0};
      if (poll(&event, 1, static_cast<int>(left.count())) > 0) {
        char drain[4096];
        while (read(watch, drain, sizeof drain) > 0) {
        }
      }
    }
  }
  close(watch);
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Runs weft-trace with `args`; returns its stdout (and its exit status through `status`).
std::string run_tool(const std::string& args, int* status = nullptr) {
  const char* tool = std::getenv("WEFT_TEST_TRACE_TOOL");
  if (tool == nullptr) throw std::runtime_error("WEFT_TEST_TRACE_TOOL is not set (meson sets it)");
  FILE* pipe = popen(fmt::format("{} {}", tool, args).c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  const int raw = pclose(pipe);
  if (status != nullptr) *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return out;
}

// 8 floats, each rank's value rank + 1: the sum is size * (size + 1) / 2.
bool all_reduce_ok(ProcessGroup& pg) {
  std::vector<float> data(8, static_cast<float>(pg.rank() + 1));
  pg.all_reduce(Tensor::of(data.data(), data.size()))->wait();
  const float want = static_cast<float>(pg.size() * (pg.size() + 1) / 2);
  for (float x : data) RANK_CHECK(x == want, "all_reduce gave {}, not {}", x, want);
  return true;
}

TEST_CASE("a rank that skipped an all_reduce: every rank dumps and weft-trace names it") {
  DumpDir dir;
  const uint16_t port = test::free_port();
  auto results = test::run_ranks(4, [&](int rank) {
    trace_into(dir);
    auto pg = join(port, rank, 4, seconds(2));
    bool failed = false;
    for (int i = 0; i < 10 && !failed; ++i) {
      if (rank == 2 && i == 7) continue;  // the bug: rank 2 skips its 8th all_reduce
      try {
        all_reduce_ok(*pg);
      } catch (const Error& e) {
        RANK_CHECK(rank != 2, "rank 2 failed: {}", e.what());
        RANK_CHECK(i == 9, "rank {} failed at call {}: {}", rank, i + 1, e.what());
        failed = true;
      }
    }
    RANK_CHECK(rank == 2 || failed, "rank {} never failed", rank);
    // Rank 2 learns of the others' failure only through the store's dump request.
    wait_for_dumps(dir, rank == 0 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{rank});
    if (rank != 2) {
      json dump = read_json(dir.file(rank));
      RANK_CHECK(dump["reason"].get<std::string>().find("all_reduce #10") != std::string::npos,
                 "rank {} dumped for {}", rank, dump["reason"].dump());
    }
    pg->abort("test over");
  });
  INFO(test::describe_failures(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);

  json rank2 = read_json(dir.file(2));
  CHECK(rank2["format"] == "weft-trace");
  // Its first dump answered the job's request; its abort at the end dumped again.
  INFO(rank2.dump());
  REQUIRE(rank2["earlier_reasons"].size() >= 1);
  CHECK(rank2["earlier_reasons"][0].get<std::string>().starts_with("requested by the job: rank "));
  CHECK(rank2["groups"][0]["last_completed_seq"] == 9);

  int status = -1;
  json answer = json::parse(run_tool("--json " + dir.path.string(), &status));
  CHECK(status == 0);
  CHECK(answer["missing_ranks"].empty());
  REQUIRE(answer["groups"].size() == 1);
  const json& world = answer["groups"][0];
  CHECK(world["name"] == "world");
  REQUIRE(world["behind"].size() == 1);
  CHECK(world["behind"][0]["rank"] == 2);
  CHECK(world["behind"][0]["kind"] == "not_issued");
  CHECK(world["behind"][0]["seq"] == 10);
  CHECK(world["behind"][0]["last_issued_seq"] == 9);
  const std::string verdict = answer["verdict"];
  CHECK(verdict.find("rank 2") != std::string::npos);
  CHECK(verdict.find("#10") != std::string::npos);
  const std::string text = run_tool(dir.path.string());
  CHECK(text.find("verdict: rank 2 (group \"world\") never issued all_reduce #10") !=
        std::string::npos);
}

TEST_CASE("a rank killed -9: the survivors dump on PeerLost and weft-trace names the missing one") {
  DumpDir dir;
  const uint16_t port = test::free_port();
  auto results = test::run_ranks(3, [&](int rank) {
    trace_into(dir);
    auto pg = join(port, rank, 3, seconds(60));
    for (int i = 0; i < 20; ++i) {
      if (rank == 1 && i == 5) raise(SIGKILL);
      try {
        all_reduce_ok(*pg);
      } catch (const Error& e) {
        RANK_CHECK(e.code() == ErrorCode::PeerLost, "rank {}: {}", rank, e.what());
        break;
      }
    }
    wait_for_dumps(dir, rank == 0 ? std::vector<int>{0, 2} : std::vector<int>{rank});
    json dump = read_json(dir.file(rank));
    RANK_CHECK(dump["reason"].get<std::string>().starts_with("PeerLost"), "rank {} dumped for {}",
               rank, dump["reason"].dump());
  });
  INFO(test::describe_failures(results));
  REQUIRE(results[1].signal == SIGKILL);
  REQUIRE(results[0].exit_code == 0);
  REQUIRE(results[2].exit_code == 0);
  CHECK_FALSE(fs::exists(dir.file(1)));

  json answer = json::parse(run_tool("--json " + dir.path.string()));
  CHECK(answer["missing_ranks"] == json::array({1}));
  const json& world = answer["groups"][0];
  CHECK(world["behind"].empty());
  REQUIRE(world["missing"].size() == 1);
  CHECK(world["missing"][0]["rank"] == 1);
  CHECK(answer["verdict"].get<std::string>().find("rank 1") != std::string::npos);
}

TEST_CASE("different collectives at one sequence number: weft-trace names the first mismatch") {
  DumpDir dir;
  const uint16_t port = test::free_port();
  auto results = test::run_ranks(3, [&](int rank) {
    trace_into(dir);
    auto pg = join(port, rank, 3, seconds(2));
    for (int i = 0; i < 3; ++i) all_reduce_ok(*pg);
    std::vector<float> data(8, 1.0f);
    try {
      if (rank == 1) {
        pg->broadcast(Tensor::of(data.data(), data.size()), 0)->wait();
      } else {
        pg->all_reduce(Tensor::of(data.data(), data.size()))->wait();
      }
    } catch (const Error&) {
      // Desync, Timeout or PeerLost: which rank sees which depends on the timing.
    }
    wait_for_dumps(dir, rank == 0 ? std::vector<int>{0, 1, 2} : std::vector<int>{rank});
    pg->abort("test over");
  });
  INFO(test::describe_failures(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);

  json answer = json::parse(run_tool("--json " + dir.path.string()));
  INFO(run_tool(dir.path.string()));
  const json& mismatch = answer["groups"][0]["mismatch"];
  REQUIRE(mismatch["first"].is_object());
  CHECK(mismatch["first"]["seq"] == 4);
  REQUIRE(mismatch["first"]["calls"].size() == 3);
  for (const json& call : mismatch["first"]["calls"]) {
    CHECK(call["op"] == (call["rank"] == 1 ? "broadcast" : "all_reduce"));
  }
  const std::string text = run_tool(dir.path.string());
  CHECK(text.find("desync at #4") != std::string::npos);
}

TEST_CASE("weft-trace --store answers about a live job without disturbing it") {
  DumpDir dir;
  const uint16_t port = test::free_port();
  const fs::path answer_file = dir.path / "answer.json";
  auto results = test::run_ranks(4, [&](int rank) {
    trace_into(dir);
    auto pg = join(port, rank, 4, seconds(30));
    std::thread asker;
    std::atomic<bool> answered{false};
    int rounds = 0;
    int rounds_after = 0;
    for (;;) {
      // Each round: a checked all_reduce, and a max over "stop" so that all ranks stop together.
      std::vector<float> data(1024, static_cast<float>(rank + 1));
      std::vector<float> stop(1, answered && rounds_after > 20 ? 1.0f : 0.0f);
      pg->all_reduce(Tensor::of(data.data(), data.size()))->wait();
      for (float x : data) RANK_CHECK(x == 10.0f, "round {}: {}", rounds, x);
      pg->all_reduce(Tensor::of(stop.data(), 1), ReduceOp::Max)->wait();
      ++rounds;
      if (answered) ++rounds_after;
      if (stop[0] == 1.0f) break;
      if (rank == 0 && rounds == 20) {
        asker = std::thread([&] {
          std::string out = run_tool(fmt::format("--json --timeout 10 --store 127.0.0.1:{}", port));
          std::ofstream(answer_file) << out;
          answered = true;
        });
      }
      RANK_CHECK(rounds < 100000, "never stopped");
    }
    if (asker.joinable()) asker.join();
    // The job answered in the store, not with files.
    RANK_CHECK(!fs::exists(dir.file(rank)), "rank {} wrote a file", rank);
  });
  INFO(test::describe_failures(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);

  json answer = read_json(answer_file);
  CHECK(answer["dumps"].size() == 4);
  CHECK(answer["missing_ranks"].empty());
  const json& world = answer["groups"][0];
  CHECK(world["name"] == "world");
  // A snapshot of a live job may catch a rank a call behind the others (busy between calls):
  // true, and not a fault. What must hold is that every rank answered and agrees.
  CHECK(world["mismatch"]["first"].is_null());
  for (const json& member : world["members"]) {
    CHECK(member["last_completed_seq"].get<uint64_t>() >= 39);
  }
}

TEST_CASE("the watchdog names an operation its stuck progress thread cannot start") {
  DumpDir dir;
  const uint16_t port = test::free_port();
  auto results = test::run_ranks(2, [&](int rank) {
    trace_into(dir);
    auto pg = join(port, rank, 2, seconds(1));
    TCPStore side(TCPStoreOptions{.host = "127.0.0.1", .port = port, .timeout = seconds(30)});
    // 256 KiB: above the size a waiting caller would run on its own thread, so the progress
    // thread runs the first all_reduce and its callback.
    std::vector<float> a(64 << 10, static_cast<float>(rank + 1));
    std::vector<float> b(8, static_cast<float>(rank + 1));
    if (rank == 1) side.wait({"test/armed"}, seconds(20));  // rank 0's callback is in place
    auto first = pg->all_reduce(Tensor::of(a.data(), a.size()));
    if (rank == 0) {
      // A completion callback that blocks the progress thread until the watchdog has dumped:
      // the second all_reduce cannot start meanwhile.
      first->on_complete([&](const Work&) { wait_for_dumps(dir, {0}, seconds(20)); });
      side.set("test/armed", "1");
    } else {
      first->wait(seconds(10));
      // Posted once the stall has been reported, so that its 1 s timeout does not run out.
      wait_for_dumps(dir, {0}, seconds(20));
    }
    auto second = pg->all_reduce(Tensor::of(b.data(), b.size()));
    first->wait(seconds(30));
    second->wait(seconds(30));
    for (float x : a) RANK_CHECK(x == 3.0f, "first: {}", x);
    for (float x : b) RANK_CHECK(x == 3.0f, "second: {}", x);
    if (rank == 0) {
      json dump = read_json(dir.file(0));
      const std::string reason = dump["reason"];
      RANK_CHECK(reason.starts_with("watchdog: "), "{}", reason);
      RANK_CHECK(reason.find("all_reduce #2 was issued and has not started") != std::string::npos,
                 "{}", reason);
    } else {
      RANK_CHECK(!fs::exists(dir.file(1)), "rank 1 dumped");
    }
  });
  INFO(test::describe_failures(results));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
}

TEST_CASE("SIGUSR1 and dump_trace() write every group of the process") {
  DumpDir dir;
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    trace_into(dir);
    auto pg = join(port, rank, 2, seconds(30));
    auto pair = pg->new_group({0, 1}, {.name = "pair"});
    all_reduce_ok(*pg);
    all_reduce_ok(*pair);
    raise(SIGUSR1);  // weft's handler: the trace thread dumps within a poll
    wait_for_dumps(dir, {rank});
    json dump = read_json(dir.file(rank));
    RANK_CHECK(dump["reason"] == "SIGUSR1", "{}", dump["reason"].dump());
    RANK_CHECK(dump["rank"] == rank && dump["world_size"] == 2, "{}", dump.dump());
    RANK_CHECK(dump["groups"].size() == 2, "{}", dump["groups"].size());
    RANK_CHECK(dump["groups"][1]["name"] == "pair", "{}", dump["groups"][1]["name"].dump());
    RANK_CHECK(dump["groups"][1]["last_completed_seq"] == 1, "");

    std::vector<std::string> paths = dump_trace("checkpoint");
    RANK_CHECK(paths.size() == 1 && paths[0] == dir.file(rank).string(), "{}", paths.size());
    dump = read_json(dir.file(rank));
    RANK_CHECK(dump["reason"] == "checkpoint", "{}", dump["reason"].dump());
    RANK_CHECK(dump["earlier_reasons"] == json::array({"SIGUSR1"}), "{}",
               dump["earlier_reasons"].dump());
    RANK_CHECK(!dump["job"].get<std::string>().empty(), "no job id");
    pg->barrier()->wait();
  });
}

}  // namespace
}  // namespace weft

namespace weft {
namespace {

TEST_CASE("after a collective's Timeout on a stopped peer, the error and the teardown are prompt") {
  DumpDir dir;
  const uint16_t port = test::free_port();
  auto results = test::run_ranks(3, [&](int rank) {
    trace_into(dir);
    // Warm up on a world with a long timeout (the first touch of the buffers, and TSan, are
    // slow); the stall happens on a group of the same ranks with a 3 s timeout.
    auto world = join(port, rank, 3, seconds(60));
    auto pg = world->new_group({0, 1, 2}, {.timeout = seconds(3)});
    TCPStore side(TCPStoreOptions{.host = "127.0.0.1", .port = port, .timeout = seconds(30)});
    std::vector<float> data(4 << 20, 1.0f);  // 16 MiB: single-copy sends over shared memory
    Tensor t = Tensor::of(data.data(), data.size());
    for (int i = 0; i < 3; ++i) world->all_reduce(t)->wait();
    pg->barrier()->wait();
    if (rank == 1) {
      side.set("test/pid1", std::to_string(getpid()));
      raise(SIGSTOP);  // frozen mid-job; rank 0 kills it at the end
      return;
    }
    // Issue far ahead, as benchmarks do: the queue holds 200 operations when the peer stops.
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 200; ++i) works.push_back(pg->all_reduce(t));
    const auto issued = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> failed_at;
    try {
      wait_all(works, seconds(30));
    } catch (const Error& e) {
      failed_at = std::chrono::steady_clock::now();
      RANK_CHECK(e.code() == ErrorCode::Timeout || e.code() == ErrorCode::PeerLost, "{}", e.what());
    }
    RANK_CHECK(failed_at.has_value(), "the all_reduces succeeded with rank 1 stopped");
    // The collective's deadline (3 s from its start) and one wait for the stopped peer's
    // acknowledgement of what was sent to it (2 s) at most: not one per chunk sent.
    const auto to_fail = *failed_at - issued;
    RANK_CHECK(to_fail < seconds(8), "failed after {} ms",
               std::chrono::duration_cast<milliseconds>(to_fail).count());
    pg->destroy();
    const auto to_destroy = std::chrono::steady_clock::now() - *failed_at;
    RANK_CHECK(to_destroy < seconds(1), "destroy took {} ms after the failure",
               std::chrono::duration_cast<milliseconds>(to_destroy).count());
    // Rank 0 hosts the store, so it leaves last: only once rank 2 has seen it done.
    if (rank == 0) {
      const pid_t stopped = std::stoi(side.get_string("test/pid1"));
      kill(stopped, SIGKILL);
      side.set("test/done0", "1");
      side.wait({"test/done2"}, seconds(20));
    } else {
      side.wait({"test/done0"}, seconds(20));
      side.set("test/done2", "1");
    }
  });
  INFO(test::describe_failures(results));
  REQUIRE(results[0].exit_code == 0);
  REQUIRE(results[2].exit_code == 0);
  CHECK(results[1].signal == SIGKILL);
}

}  // namespace
}  // namespace weft
