// weft-trace over hand-written dumps (data/<case>/, docs/flight-recorder.md version 1): the
// analysis library's findings, its text and JSON, and the real CLI, from files and from a live
// store answered by a thread that plays two ranks of a three-rank job.
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/error.h"
#include "weft/tcp_store.h"
#include "weft/tcp_store_server.h"

#include "weft_trace_analysis.h"

namespace {

using namespace weft::trace;

const std::string kData = WEFT_TRACE_DATA;
const std::string kBinary = WEFT_TRACE_BIN;

Analysis analyze_case(const std::string& name) { return analyze(load_dumps({kData + "/" + name})); }

std::vector<int> ranks_of(const std::vector<const Member*>& members) {
  std::vector<int> out;
  for (const Member* m : members) out.push_back(m->rank);
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct RunResult {
  int status = -1;
  std::string output;  // stdout, then stderr when asked for
};

// Runs a shell command line and returns its exit status and output.
RunResult run(const std::string& command) {
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// A fresh directory under the system's temporary directory, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           fmt::format("weft-trace-test-{}-{}", getpid(),
                       std::chrono::steady_clock::now().time_since_epoch().count());
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::string file = (path / name).string();
    std::ofstream(file) << text;
    return file;
  }
};

}  // namespace

TEST_CASE("a rank that skipped a collective is named behind, with what the others wait in",
          "[trace_tool]") {
  Analysis a = analyze_case("skipped_collective");
  REQUIRE(a.dumps.size() == 4);
  CHECK(a.job == "6b1f0c2e9d4a7781");
  CHECK(a.world_size == 4);
  CHECK(a.missing.empty());
  REQUIRE(a.groups.size() == 1);
  const GroupAnalysis& g = a.groups[0];
  CHECK(g.name == "world");
  CHECK_FALSE(g.all_done);
  REQUIRE(g.behind.size() == 1);
  CHECK(g.behind[0].rank == 2);
  CHECK(g.behind[0].not_issued);
  CHECK(g.behind[0].seq == 10);
  CHECK(g.behind[0].op == "all_reduce");
  REQUIRE(g.behind[0].last_op != nullptr);
  CHECK(g.behind[0].last_op->seq == 9);
  CHECK(g.behind[0].last_op->state == "completed");
  REQUIRE(g.waiting.size() == 1);
  CHECK(ranks_of(g.waiting[0].members) == std::vector<int>{0, 1, 3});
  CHECK(g.waiting[0].seq == 10);
  CHECK(g.waiting[0].op == "all_reduce");
  CHECK(g.waiting[0].state == "failed");
  CHECK(g.mismatch.checked);
  CHECK_FALSE(g.mismatch.found);
  CHECK(g.mismatch.from == 1);
  CHECK(g.mismatch.to == 9);
  REQUIRE(g.errors.size() == 3);
  CHECK(g.errors[0].entry->error_code == "Timeout");
  CHECK(g.errors[0].short_message == "after 1 s: nothing complete from rank 2 (set WEFT_TIMEOUT)");
  CHECK(a.verdict ==
        "rank 2 (group \"world\") never issued all_reduce #10; ranks 0, 1, 3 are waiting in it");

  std::string text = render_text(a);
  INFO(text);
  CHECK(contains(text, "weft-trace: 4 dumps of job \"6b1f0c2e9d4a7781\" (world size 4)"));
  CHECK(contains(text, "group \"world\" (id \"world\"), 4 ranks: 0-3"));
  CHECK(contains(text,
                 "behind: rank 2 has not issued all_reduce #10: it stopped after #9; its "
                 "newest operation is all_reduce #9 (float32 x 8, sum): completed 1.15 s "
                 "before its dump"));
  CHECK(contains(text,
                 "waiting: ranks 0, 1, 3 are in all_reduce #10 (float32 x 8, sum): failed "
                 "with Timeout"));
  CHECK(contains(text, "mismatch: none in #1..#9"));
  CHECK(contains(text, "rank 1: all_reduce #10: Timeout: after 1 s: nothing complete from rank 2"));
  CHECK(contains(text, "\nverdict: rank 2 (group \"world\") never issued all_reduce #10"));
}

TEST_CASE("a rank blamed by another's error is not named behind when it issued the collective",
          "[trace_tool]") {
  Analysis a = analyze_case("blame_chain");
  REQUIRE(a.groups.size() == 1);
  const GroupAnalysis& g = a.groups[0];
  REQUIRE(g.behind.size() == 1);
  CHECK(g.behind[0].rank == 2);
  CHECK(g.behind[0].seq == 10);
  // Rank 3 is in #10 (started), with ranks 0 and 1 (failed): waiting, not behind.
  REQUIRE(g.waiting.size() == 2);
  CHECK(ranks_of(g.waiting[0].members) == std::vector<int>{0, 1});
  CHECK(ranks_of(g.waiting[1].members) == std::vector<int>{3});
  CHECK(g.waiting[1].state == "started");
  CHECK(a.verdict ==
        "rank 2 (group \"world\") never issued all_reduce #10; ranks 0, 1, 3 are waiting in it");
  std::string text = render_text(a);
  INFO(text);
  CHECK(contains(text, "rank 1: all_reduce #10: Timeout: after 1 s: nothing complete from rank 3"));
  CHECK(contains(text,
                 "waiting: rank 3 is in all_reduce #10 (float32 x 8, sum): started 1.01 s "
                 "before its dump, still running"));
  CHECK_FALSE(contains(text, "behind: rank 3"));
}

TEST_CASE("a killed rank with no dump is named as dead or unreachable", "[trace_tool]") {
  Analysis a = analyze_case("killed_rank");
  CHECK(a.world_size == 3);
  REQUIRE(a.missing.size() == 1);
  CHECK(a.missing[0].first == 1);
  CHECK(a.missing[0].second == "no dump (dead or unreachable)");
  REQUIRE(a.groups.size() == 1);
  const GroupAnalysis& g = a.groups[0];
  CHECK(ranks_of(g.missing) == std::vector<int>{1});
  CHECK(g.behind.empty());
  REQUIRE(g.waiting.size() == 1);
  CHECK(ranks_of(g.waiting[0].members) == std::vector<int>{0, 2});
  CHECK(g.waiting[0].entry->error_code == "PeerLost");
  CHECK(a.verdict ==
        "rank 1 (group \"world\") left no dump (dead or unreachable); ranks 0, 2 failed in "
        "all_reduce #6 (float32 x 8, sum) with PeerLost");
  std::string text = render_text(a);
  INFO(text);
  CHECK(contains(text, "  rank 1: no dump (dead or unreachable)\n"));
  CHECK(contains(text, "rank 0: all_reduce #6: PeerLost: rank 1 gone at step 1/2"));
}

TEST_CASE("a different op at one seq is the first mismatch, with every rank's call",
          "[trace_tool]") {
  Analysis a = analyze_case("mismatch");
  REQUIRE(a.groups.size() == 1);
  const Mismatch& mm = a.groups[0].mismatch;
  REQUIRE(mm.found);
  CHECK(mm.seq == 5);
  REQUIRE(mm.calls.size() == 3);
  CHECK(mm.calls[0].second->op == "all_reduce");
  CHECK(mm.calls[1].first->rank == 1);
  CHECK(mm.calls[1].second->op == "broadcast");
  CHECK(mm.calls[1].second->root == 0);
  CHECK(mm.calls[2].second->op == "all_reduce");
  CHECK(a.verdict ==
        "group \"world\" desync at #5: rank 1 called broadcast (float32 x 8, root 0) while ranks "
        "0, 2 called all_reduce (float32 x 8, sum)");
  std::string text = render_text(a);
  INFO(text);
  CHECK(contains(text,
                 "mismatch: first at #5 (#1..#4 agree); each rank's call:\n"
                 "    rank 0: all_reduce dtype float32 count_in 8 count_out 8 reduce_op sum "
                 "root - fingerprint 40211\n"
                 "    rank 1: broadcast dtype float32 count_in 8 count_out 8 reduce_op - "
                 "root 0 fingerprint 17403\n"
                 "    rank 2: all_reduce dtype float32 count_in 8 count_out 8 reduce_op sum "
                 "root - fingerprint 40211\n"));
}

TEST_CASE("the same op with another dtype at one seq is the first mismatch", "[trace_tool]") {
  Analysis a = analyze_case("mismatch_dtype");
  REQUIRE(a.groups.size() == 1);
  const Mismatch& mm = a.groups[0].mismatch;
  REQUIRE(mm.found);
  CHECK(mm.seq == 5);
  REQUIRE(mm.calls.size() == 2);
  CHECK(mm.calls[0].second->dtype == "float32");
  CHECK(mm.calls[1].second->dtype == "float16");
  CHECK(a.verdict ==
        "group \"world\" desync at #5: rank 1 called all_reduce (float16 x 8, sum) while rank 0 "
        "called all_reduce (float32 x 8, sum)");
  std::string text = render_text(a);
  INFO(text);
  CHECK(contains(text, "rank 1: all_reduce dtype float16 count_in 8 count_out 8 reduce_op sum"));
}

TEST_CASE("sub-groups are analysed apart and name world ranks with their group ranks",
          "[trace_tool]") {
  Analysis a = analyze_case("sub_groups");
  REQUIRE(a.groups.size() == 3);
  CHECK(a.groups[0].name == "world");
  CHECK(a.groups[0].all_done);
  CHECK(a.groups[0].done_seq == 3);
  CHECK(a.groups[1].name == "evens");
  CHECK(a.groups[1].all_done);
  CHECK(a.groups[1].done_seq == 2);
  const GroupAnalysis& odds = a.groups[2];
  CHECK(odds.name == "odds");
  CHECK(odds.id == "world/odds");
  CHECK(odds.numbering_differs);
  CHECK(odds.global_ranks == std::vector<int>{1, 3});
  REQUIRE(odds.behind.size() == 1);
  CHECK(odds.behind[0].rank == 3);
  CHECK(odds.behind[0].group_rank == 1);
  CHECK(odds.behind[0].seq == 4);
  REQUIRE(odds.waiting.size() == 1);
  CHECK(ranks_of(odds.waiting[0].members) == std::vector<int>{1});
  CHECK(a.verdict ==
        "rank 3 (rank 1 in group \"odds\") never issued all_reduce #4; rank 1 (group rank 0) is "
        "waiting in it");
  std::string text = render_text(a);
  INFO(text);
  CHECK(contains(text,
                 "group \"world\" (id \"world\"), 4 ranks: 0-3\n"
                 "  all 4 ranks completed #3; nothing pending\n"));
  CHECK(contains(text,
                 "group \"odds\" (id \"world/odds\"), 2 ranks: world ranks 1, 3\n"
                 "  ranks below are world ranks (as the launcher numbers them); group ranks "
                 "are named as such\n"));
  CHECK(contains(text,
                 "behind: rank 3 (group rank 1) has not issued all_reduce #4: it stopped "
                 "after #3"));
  CHECK(contains(text, "rank 1 (group rank 0): all_reduce #4: Timeout"));
}

TEST_CASE("a dump of another job is ignored with a note; one with job \"\" is merged",
          "[trace_tool]") {
  Analysis a = analyze_case("mixed_jobs");
  CHECK(a.job == "aaa");
  CHECK(a.world_size == 3);
  REQUIRE(a.dumps.size() == 3);
  CHECK(a.dumps[1].rank == 1);
  CHECK(a.dumps[1].job == "");
  REQUIRE(a.ignored.size() == 1);
  CHECK(contains(a.ignored[0].source, "weft-trace-rank3.json"));
  CHECK(a.ignored[0].why == "job \"bbb\", not \"aaa\" (a dump of another job)");
  CHECK(a.missing.empty());
  REQUIRE(a.groups.size() == 1);
  CHECK(a.groups[0].all_done);
  CHECK(a.groups[0].done_seq == 4);
  std::string text = render_text(a);
  INFO(text);
  CHECK(contains(text, "weft-trace-rank3.json: job \"bbb\", not \"aaa\" (a dump of another job)"));
  CHECK(contains(text, "weft-trace-rank1.json has no job id"));
  CHECK(contains(text, "all 3 ranks completed #4; nothing pending"));
}

TEST_CASE("a wrapped ring moves the mismatch search to the oldest seq every rank holds",
          "[trace_tool]") {
  Analysis a = analyze_case("wrapped_ring");
  REQUIRE(a.groups.size() == 1);
  const GroupAnalysis& g = a.groups[0];
  CHECK(g.mismatch.checked);
  CHECK_FALSE(g.mismatch.found);
  CHECK(g.mismatch.from == 9);
  CHECK(g.mismatch.to == 11);
  CHECK(ranks_of(g.mismatch.wrapped) == std::vector<int>{0, 1});
  REQUIRE(g.behind.size() == 1);
  CHECK(g.behind[0].rank == 1);
  CHECK(g.behind[0].seq == 12);
  std::string text = render_text(a);
  INFO(text);
  CHECK(contains(text, "mismatch: none in #9..#11"));
  CHECK(contains(text, "the mismatch search starts at #9, the oldest seq every rank still holds"));
}

TEST_CASE("a send that the peer never matched with a recv is named in the verdict",
          "[trace_tool]") {
  Analysis a = analyze_case("unmatched_send");
  REQUIRE(a.groups.size() == 1);
  const GroupAnalysis& g = a.groups[0];
  CHECK(g.behind.empty());
  CHECK_FALSE(g.all_done);
  REQUIRE(g.waiting.size() == 1);
  CHECK(ranks_of(g.waiting[0].members) == std::vector<int>{0});
  CHECK(g.waiting[0].op == "send");
  CHECK(a.verdict ==
        "rank 0 (group \"world\") is in send (float32 x 8, to peer 1, tag 3), and rank 1 has no "
        "matching recv pending");
}

TEST_CASE("the JSON output carries the same findings as the text", "[trace_tool]") {
  Analysis a = analyze_case("skipped_collective");
  auto j = nlohmann::json::parse(render_json(a));
  CHECK(j["job"] == "6b1f0c2e9d4a7781");
  CHECK(j["world_size"] == 4);
  CHECK(j["dumps"].size() == 4);
  CHECK(j["missing_ranks"].empty());
  REQUIRE(j["groups"].size() == 1);
  auto& g = j["groups"][0];
  CHECK(g["name"] == "world");
  CHECK(g["all_done"] == false);
  REQUIRE(g["members"].size() == 4);
  CHECK(g["members"][2]["last_queued_seq"] == 9);
  CHECK(g["members"][0]["first_error"]["error_code"] == "Timeout");
  REQUIRE(g["behind"].size() == 1);
  CHECK(g["behind"][0]["rank"] == 2);
  CHECK(g["behind"][0]["kind"] == "not_issued");
  CHECK(g["behind"][0]["seq"] == 10);
  CHECK(g["behind"][0]["op"] == "all_reduce");
  REQUIRE(g["waiting"].size() == 1);
  CHECK(g["waiting"][0]["ranks"] == nlohmann::json::array({0, 1, 3}));
  CHECK(g["mismatch"]["checked"] == true);
  CHECK(g["mismatch"]["from"] == 1);
  CHECK(g["mismatch"]["to"] == 9);
  CHECK(g["mismatch"]["first"].is_null());
  CHECK(j["verdict"] ==
        "rank 2 (group \"world\") never issued all_reduce #10; ranks 0, 1, 3 are waiting in it");

  auto m = nlohmann::json::parse(render_json(analyze_case("mismatch")));
  auto& first = m["groups"][0]["mismatch"]["first"];
  CHECK(first["seq"] == 5);
  REQUIRE(first["calls"].size() == 3);
  CHECK(first["calls"][1]["rank"] == 1);
  CHECK(first["calls"][1]["op"] == "broadcast");
  CHECK(first["calls"][1]["root"] == 0);
}

TEST_CASE("a file that is not a valid version-1 dump is refused, naming the file and the fault",
          "[trace_tool]") {
  TempDir dir;
  std::string good = read_text(kData + "/killed_rank/weft-trace-rank0.json");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  struct Case {
    std::string text;
    std::string error;
  };
  std::vector<Case> cases = {
      {"{\"format\": \"weft-trace\",", "not valid JSON"},
      {"[1, 2]", "not a weft-trace dump"},
      {with("\"format\": \"weft-trace\"", "\"format\": \"chrome-trace\""),
       "not a weft-trace dump (format is \"chrome-trace\", not \"weft-trace\")"},
      {with("\"version\": 1", "\"version\": 2"),
       "format version 2 is not one this weft-trace reads (it reads version 1)"},
      {with("\"world_size\": 3", "\"world_size\": \"3\""),
       "\"world_size\" should be an integer, not string"},
      {with("\"seq\": 3,", ""), "groups[0].entries[2]: \"seq\" is missing"},
      {with("\"state\": \"completed\"", "\"state\": \"done\""),
       "groups[0].entries[0]: \"state\" is \"done\""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string file = dir.write(fmt::format("bad{}.json", i), cases[i].text);
    INFO("case " << i << ": expecting " << cases[i].error);
    try {
      load_dump_file(file);
      FAIL("no error");
    } catch (const TraceError& e) {
      std::string what = e.what();
      INFO(what);
      CHECK(what.rfind(file + ": ", 0) == 0);
      CHECK(contains(what, cases[i].error));
    }
  }
  // The CLI says the same on stderr and exits 1.
  RunResult r = run(fmt::format("'{}' '{}' 2>&1", kBinary, (dir.path / "bad3.json").string()));
  CHECK(r.status == 1);
  CHECK(contains(r.output, "bad3.json: format version 2 is not one this weft-trace reads"));
}

TEST_CASE(
    "the weft-trace CLI prints the analysis of a directory, as text or JSON, with its "
    "exit codes",
    "[trace_tool]") {
  RunResult text = run(fmt::format("'{}' '{}/skipped_collective'", kBinary, kData));
  INFO(text.output);
  CHECK(text.status == 0);
  CHECK(contains(text.output, "behind: rank 2 has not issued all_reduce #10"));
  CHECK(contains(text.output,
                 "\nverdict: rank 2 (group \"world\") never issued all_reduce #10; "
                 "ranks 0, 1, 3 are waiting in it\n"));

  // Files named one by one; the missing rank is named.
  RunResult files =
      run(fmt::format("'{0}' '{1}/killed_rank/weft-trace-rank0.json' "
                      "'{1}/killed_rank/weft-trace-rank2.json'",
                      kBinary, kData));
  CHECK(files.status == 0);
  CHECK(contains(files.output, "  rank 1: no dump (dead or unreachable)\n"));

  RunResult json = run(fmt::format("'{}' --json '{}/sub_groups'", kBinary, kData));
  CHECK(json.status == 0);
  auto j = nlohmann::json::parse(json.output);
  REQUIRE(j["groups"].size() == 3);
  CHECK(j["groups"][2]["behind"][0]["rank"] == 3);
  CHECK(j["groups"][2]["behind"][0]["group_rank"] == 1);

  CHECK(run(fmt::format("'{}' --help", kBinary)).status == 0);
  CHECK(run(fmt::format("'{}' 2>&1", kBinary)).status == 2);
  CHECK(run(fmt::format("'{}' --frobnicate x 2>&1", kBinary)).status == 2);
  CHECK(run(fmt::format("'{}' --store nohostport 2>&1", kBinary)).status == 2);
  TempDir empty;
  RunResult none = run(fmt::format("'{}' '{}' 2>&1", kBinary, empty.path.string()));
  CHECK(none.status == 1);
  CHECK(contains(none.output, "no weft-trace-rank*.json in this directory"));
}

TEST_CASE(
    "weft-trace --store asks a live job for dumps, names the rank that did not answer "
    "and deletes its keys",
    "[trace_tool][threaded]") {
  weft::TcpStoreServer server(weft::TcpStoreServerOptions{.host = "127.0.0.1", .port = 0});
  auto client = [&] {
    return std::make_unique<weft::TCPStore>(weft::TCPStoreOptions{
        .host = "127.0.0.1", .port = server.port(), .timeout = std::chrono::seconds(5)});
  };
  std::string dumps[2] = {read_text(kData + "/store/weft-trace-rank0.json"),
                          read_text(kData + "/store/weft-trace-rank1.json")};

  // Ranks 0 and 1 of a three-rank job, as their trace threads would answer; rank 2 never does.
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::thread ranks([&] {
    auto store = client();
    std::string world_size = "3", job = "storejob";
    store->set("weft/trace/world_size", weft::Bytes(world_size.begin(), world_size.end()));
    store->set("weft/trace/job", weft::Bytes(job.begin(), job.end()));
    // As the ranks' trace threads do, but blocking in the store until the next request is
    // posted (in slices, to notice the end of the test) rather than polling.
    int64_t next = 1;
    while (!stop) {
      const std::string key = fmt::format("weft/trace/request/{}", next);
      try {
        store->wait({key}, std::chrono::milliseconds(200));
      } catch (const weft::Error& e) {
        if (e.code() == weft::ErrorCode::Timeout) continue;
        throw;
      }
      weft::Bytes request = store->get(key);
      if (std::string(request.begin(), request.end()).rfind("store ", 0) == 0) {
        for (int rank = 0; rank < 2; ++rank) {
          store->set(fmt::format("weft/trace/reply/{}/{}", next, rank),
                     weft::Bytes(dumps[rank].begin(), dumps[rank].end()));
        }
        ++answered;
      }
      ++next;
    }
  });

  RunResult r = run(fmt::format("'{}' --store 127.0.0.1:{} --timeout 2", kBinary, server.port()));
  stop = true;
  ranks.join();
  INFO(r.output);
  CHECK(answered == 1);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "weft-trace: 2 dumps of job \"storejob\" (world size 3)"));
  CHECK(contains(r.output, "  rank 2: no dump (dead or unreachable)\n"));
  CHECK(contains(r.output, "  rank 0: store reply weft/trace/reply/1/0 (node0 pid 41230)"));
  CHECK(contains(r.output, "verdict: rank 2 (group \"world\") left no dump (dead or unreachable)"));

  auto store = client();
  CHECK(store->add("weft/trace/requests", 0) == 1);
  CHECK_FALSE(store->check({"weft/trace/request/1"}));
  CHECK_FALSE(store->check({"weft/trace/reply/1/0"}));
  CHECK_FALSE(store->check({"weft/trace/reply/1/1"}));
  CHECK_FALSE(store->check({"weft/trace/reply/1/2"}));
}

TEST_CASE("weft-trace --store on a store without a weft job says so and exits 1",
          "[trace_tool][threaded]") {
  weft::TcpStoreServer server(weft::TcpStoreServerOptions{.host = "127.0.0.1", .port = 0});
  RunResult r =
      run(fmt::format("'{}' --store 127.0.0.1:{} --timeout 0.5 2>&1", kBinary, server.port()));
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(contains(r.output, "no weft job with a flight recorder on this store"));
  // It asked nothing: no request counter was made.
  weft::TCPStore store(weft::TCPStoreOptions{.host = "127.0.0.1", .port = server.port()});
  CHECK_FALSE(store.check({"weft/trace/requests"}));
}
