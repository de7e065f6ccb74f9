// The flight recorder's ring on its own (runtime/flight_recorder.h): what it keeps, how it wraps,
// what a failure leaves, the watchdog's question, and a dump taken while another thread records
// (run under TSan in CI: the recorder is written by one thread and read by another with no lock).
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/work.h"

#include "runtime/flight_recorder.h"

namespace weft {
namespace {

using nlohmann::json;

FlightRecorder::GroupInfo group(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  FlightRecorder::GroupInfo info;
  info.name = "world";
  info.id = "world";
  info.rank = 1;
  info.size = 4;
  info.global_ranks = {0, 1, 2, 3};
  info.timeout = timeout;
  return info;
}

// An all_reduce of `count` floats with sequence number `seq`.
Collective all_reduce(uint64_t seq, size_t count, std::vector<float>& buffer) {
  buffer.resize(count);
  Collective c;
  c.kind = CollectiveKind::AllReduce;
  c.seq = seq;
  c.op = ReduceOp::Max;
  c.inputs.push_back(Tensor::of(buffer.data(), count));
  c.outputs.push_back(Tensor::of(buffer.data(), count));
  return c;
}

json parse(const FlightRecorder& recorder) {
  std::string text;
  recorder.append_json(text);
  return json::parse(text);
}

TEST_CASE("the recorder keeps each operation's arguments, states and times") {
  auto recorder = std::make_shared<FlightRecorder>(group(), 16);
  std::vector<float> buffer;
  Collective c = all_reduce(1, 8, buffer);
  const int64_t before = FlightRecorder::now_ns();
  const uint64_t id = recorder->queued(c, DType::Float32, 0xbeef);
  TraceRef trace{recorder, id, 1, 1};

  json queued = parse(*recorder)["entries"][0];
  CHECK(queued["state"] == "queued");
  CHECK(queued["started_ns"] == 0);

  recorder->started(trace);
  recorder->note_algorithm(id, "ring");
  recorder->finished(trace, nullptr);
  json g = parse(*recorder);
  CHECK(g["name"] == "world");
  CHECK(g["rank"] == 1);
  CHECK(g["size"] == 4);
  CHECK(g["capacity"] == 16);
  CHECK(g["recorded"] == 1);
  CHECK(g["last_queued_seq"] == 1);
  CHECK(g["last_started_seq"] == 1);
  CHECK(g["last_completed_seq"] == 1);
  REQUIRE(g["entries"].size() == 1);
  json e = g["entries"][0];
  CHECK(e["id"] == 0);
  CHECK(e["seq"] == 1);
  CHECK(e["op"] == "all_reduce");
  CHECK(e["dtype"] == "float32");
  CHECK(e["count_in"] == 8);
  CHECK(e["count_out"] == 8);
  CHECK(e["reduce_op"] == "max");
  CHECK(e["root"] == -1);
  CHECK(e["fingerprint"] == 0xbeef);
  CHECK(e["algorithm"] == "ring");
  CHECK(e["state"] == "completed");
  CHECK(e["queued_ns"].get<int64_t>() >= before);
  CHECK(e["started_ns"].get<int64_t>() >= e["queued_ns"].get<int64_t>());
  CHECK(e["ended_ns"].get<int64_t>() >= e["started_ns"].get<int64_t>());
  CHECK(e["thread"].get<int>() > 0);
  CHECK_FALSE(e.contains("error"));
}

TEST_CASE("a full ring keeps the newest operations; the sequence numbers stay exact") {
  auto recorder = std::make_shared<FlightRecorder>(group(), 4);
  std::vector<float> buffer;
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    TraceRef trace{recorder, recorder->queued(all_reduce(seq, seq, buffer), DType::Float32, 0), 1,
                   seq};
    recorder->started(trace);
    if (seq <= 9) recorder->finished(trace, nullptr);
  }
  json g = parse(*recorder);
  CHECK(g["recorded"] == 10);
  CHECK(g["last_queued_seq"] == 10);
  CHECK(g["last_started_seq"] == 10);
  CHECK(g["last_completed_seq"] == 9);
  REQUIRE(g["entries"].size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(g["entries"][i]["id"] == 6 + i);
    CHECK(g["entries"][i]["seq"] == 7 + i);
    CHECK(g["entries"][i]["count_in"] == 7 + i);
  }
  CHECK(g["entries"][3]["state"] == "started");
  // An update for an operation whose slot was reused is dropped, not written over the new one.
  recorder->finished(TraceRef{recorder, 5, 1, 6}, nullptr);  // slot 5 % 4 now holds id 9
  CHECK(parse(*recorder)["entries"][3]["state"] == "started");
}

TEST_CASE("a failure keeps its code and message, and calls the failure hook once per group") {
  int hooks = 0;
  std::string hook_message;
  auto recorder =
      std::make_shared<FlightRecorder>(group(), 8, [&](ErrorCode code, const std::string& message) {
        ++hooks;
        CHECK(code == ErrorCode::Timeout);
        hook_message = message;
      });
  std::vector<float> buffer;
  ErrorContext context{1, 4, "world", "all_reduce", 1, ""};
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    TraceRef trace{recorder, recorder->queued(all_reduce(seq, 4, buffer), DType::Float32, 0), 1,
                   seq};
    recorder->finished(
        trace, std::make_exception_ptr(Error(ErrorCode::Timeout, context, "nothing from rank 2")));
  }
  // Aborted is not a failure worth a dump (the program asked for it).
  TraceRef aborted{recorder, recorder->queued(all_reduce(3, 4, buffer), DType::Float32, 0), 1, 3};
  recorder->finished(aborted,
                     std::make_exception_ptr(Error(ErrorCode::Aborted, context, "abort()")));
  CHECK(hooks == 1);
  CHECK(hook_message.find("nothing from rank 2") != std::string::npos);
  json g = parse(*recorder);
  CHECK(g["last_completed_seq"] == 0);
  CHECK(g["entries"][0]["state"] == "failed");
  CHECK(g["entries"][0]["error_code"] == "Timeout");
  CHECK(g["entries"][0]["error"].get<std::string>().find("nothing from rank 2") !=
        std::string::npos);
  CHECK(g["entries"][2]["error_code"] == "Aborted");
}

TEST_CASE("the watchdog names the oldest operation once it is past the timeout, once") {
  auto recorder = std::make_shared<FlightRecorder>(group(std::chrono::milliseconds(20)), 8);
  std::vector<float> buffer;
  TraceRef first{recorder, recorder->queued(all_reduce(1, 4, buffer), DType::Float32, 0), 1, 1};
  recorder->started(first);
  recorder->queued(all_reduce(2, 4, buffer), DType::Float32, 0);
  const std::chrono::milliseconds grace(5);
  // 25 ms is the timeout plus the grace: the clock is passed in, not slept through.
  auto later = [](int ms) { return FlightRecorder::now_ns() + int64_t{ms} * 1'000'000; };
  CHECK_FALSE(recorder->overdue(std::chrono::seconds(10)));
  CHECK_FALSE(recorder->overdue(grace, later(15)));
  std::optional<std::string> report = recorder->overdue(grace, later(40));
  REQUIRE(report);
  CHECK(report->find("all_reduce #1 started") != std::string::npos);
  CHECK(report->find("group \"world\"") != std::string::npos);
  CHECK_FALSE(recorder->overdue(grace, later(40)));  // once per operation
  // The first ends; the second cannot start (its thread is stuck): named once it is overdue.
  recorder->finished(first, nullptr);
  CHECK_FALSE(recorder->overdue(grace, later(15)));
  report = recorder->overdue(grace, later(40));
  REQUIRE(report);
  CHECK(report->find("all_reduce #2 was issued and has not started") != std::string::npos);
}

TEST_CASE("a dump taken while another thread records sees whole entries only") {
  auto recorder = std::make_shared<FlightRecorder>(group(), 64);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    std::vector<float> buffer;
    for (uint64_t seq = 1; seq <= 20000; ++seq) {
      // count_in == seq in every entry: a torn read would mix two operations' fields.
      TraceRef trace{recorder,
                     recorder->queued(all_reduce(seq, seq % 97, buffer), DType::Float32,
                                      static_cast<uint16_t>(seq)),
                     1, seq};
      recorder->started(trace);
      recorder->note_algorithm(trace.first, "recursive_doubling");
      recorder->finished(trace, nullptr);
    }
    done = true;
  });
  int dumps = 0;
  while (!done || dumps == 0) {
    json g = parse(*recorder);
    uint64_t previous = 0;
    bool first = true;
    for (const json& e : g["entries"]) {
      const uint64_t seq = e["seq"];
      REQUIRE(e["id"] == seq - 1);
      REQUIRE(e["count_in"] == seq % 97);
      REQUIRE(e["fingerprint"] == static_cast<uint16_t>(seq));
      if (!first) REQUIRE(seq > previous);
      previous = seq;
      first = false;
    }
    REQUIRE(g["entries"].size() <= 64);
    ++dumps;
  }
  writer.join();
  json g = parse(*recorder);
  CHECK(g["recorded"] == 20000);
  CHECK(g["last_completed_seq"] == 20000);
  CHECK(g["entries"].size() == 64);
  CHECK(g["entries"][63]["state"] == "completed");
}

}  // namespace
}  // namespace weft
