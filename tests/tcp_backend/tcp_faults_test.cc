// TcpTransport under failure: a killed peer, a deadline, abort() from another thread, a size
// mismatch. Each must end the affected waits promptly with the right code and a message that
// names the peer.
#include <signal.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "tests/tcp_backend/tcp_test_support.h"

namespace weft::tcp::test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs wait() and returns the Error it threw; fails the rank when it returned normally.
Error wait_for_error(TcpTransport& t, collectives::Request request, Clock::time_point deadline) {
  try {
    t.wait(request, deadline);
  } catch (const Error& e) {
    return e;
  }
  throw std::runtime_error("wait returned normally, expected an Error");
}

TEST_CASE("killing a rank mid-transfer fails its peers with PeerLost naming it within 5 s",
          "[tcp][multiproc][faults]") {
  TempDir dir;
  auto results = run_ranks(3, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 3);
    TcpTransport& t = *r.transport;
    std::vector<uint8_t> buffer(64 * kMiB, 0);
    if (rank == 1) {
      // Nobody reads until rank 1 is dead, so at most the socket buffers (a few MiB) of each
      // 64 MiB message are on their way when it dies.
      auto to0 = t.send(0, buffer.data(), buffer.size(), make_tag(1, 0));
      auto to2 = t.send(2, buffer.data(), buffer.size(), make_tag(1, 0));
      RANK_CHECK(!t.test(to0) && !t.test(to2), "64 MiB fit in the socket buffers");
      r.store->set("dying", "1");
      raise(SIGKILL);
    }
    r.store->wait({"dying"}, 20s);
    auto request = t.recv(1, buffer.data(), buffer.size(), make_tag(1, 0));
    auto start = Clock::now();
    Error e = wait_for_error(t, request, within(30s));
    RANK_CHECK(e.code() == ErrorCode::PeerLost, "{}", e.what());
    RANK_CHECK(contains(e.what(), "rank 1 "), "{}", e.what());
    RANK_CHECK(Clock::now() - start < 5s, "PeerLost took too long");
    // Later requests with the lost peer fail the same way, at once.
    uint8_t byte = 0;
    Error later = wait_for_error(t, t.send(1, &byte, 1, make_tag(2, 0)), within(30s));
    RANK_CHECK(later.code() == ErrorCode::PeerLost, "{}", later.what());
    Error late_recv = wait_for_error(t, t.recv(1, &byte, 1, make_tag(2, 0)), within(30s));
    RANK_CHECK(late_recv.code() == ErrorCode::PeerLost, "{}", late_recv.what());
  });
  for (const auto& result : results) {
    if (result.rank == 1) {
      INFO(result.output);
      CHECK(result.signal == SIGKILL);
    } else {
      INFO(describe_failures({result}));
      CHECK(result.exit_code == 0);
    }
  }
}

TEST_CASE("a wait past its deadline throws Timeout naming peer, tag and bytes outstanding",
          "[tcp][multiproc][faults]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 2);
    TcpTransport& t = *r.transport;
    std::vector<uint8_t> buffer(1000, 0);
    uint8_t go = 1;
    if (rank == 1) {
      t.wait(t.recv(0, &go, 1, make_tag(7, 9)), within(20s));
      auto late = pattern(5, 1000);
      t.wait(t.send(0, late.data(), late.size(), make_tag(7, 1)), within(20s));
      return;
    }
    auto start = Clock::now();
    Error e = wait_for_error(t, t.recv(1, buffer.data(), 1000, make_tag(7, 1)), within(200ms));
    auto waited = Clock::now() - start;
    RANK_CHECK(e.code() == ErrorCode::Timeout, "{}", e.what());
    RANK_CHECK(contains(e.what(), "rank 1 ") && contains(e.what(), "tag 7:1") &&
                   contains(e.what(), "1000 of 1000 bytes"),
               "{}", e.what());
    RANK_CHECK(waited >= 200ms && waited < 5s);
    // The timed-out receive was withdrawn: the late message matches the next receive.
    t.wait(t.send(1, &go, 1, make_tag(7, 9)), within(20s));
    t.wait(t.recv(1, buffer.data(), 1000, make_tag(7, 1)), within(20s));
    check_pattern(buffer, 5, "late message");
  });
}

TEST_CASE("a receive from any source goes to the earliest posted, times out and sees a loss",
          "[tcp][multiproc][faults][recv_any]") {
  TempDir dir;
  auto results = run_ranks(3, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 3);
    TcpTransport& t = *r.transport;
    const collectives::Tag tag = collectives::point_to_point_tag(5);
    if (rank == 1) {
      // Two messages with one tag, sent once rank 0 has posted its receives (then once more).
      for (int round = 0; round < 2; ++round) {
        r.store->wait({fmt::format("posted{}", round)}, 20s);
        auto a = pattern(10 + round, 3000), b = pattern(20 + round, 3000);
        t.wait(t.send(0, a.data(), a.size(), tag), within(20s));
        t.wait(t.send(0, b.data(), b.size(), tag), within(20s));
      }
      r.store->wait({"late"}, 20s);
      auto late = pattern(30, 100);
      t.wait(t.send(0, late.data(), late.size(), tag), within(20s));
      r.store->wait({"done"}, 20s);
      return;
    }
    if (rank == 2) {
      r.store->wait({"kill2"}, 20s);
      raise(SIGKILL);
    }
    std::vector<uint8_t> first(3000), second(3000);
    // Any source posted first: it takes the first message, the receive from rank 1 the second.
    int source = -1;
    auto any = t.recv_any(first.data(), first.size(), tag, &source);
    auto from1 = t.recv(1, second.data(), second.size(), tag);
    r.store->set("posted0", "1");
    t.wait(any, within(20s));
    t.wait(from1, within(20s));
    RANK_CHECK(source == 1, "source {}", source);
    check_pattern(first, 10, "any source, posted first");
    check_pattern(second, 20, "from rank 1, posted second");
    // The other way round.
    source = -1;
    from1 = t.recv(1, first.data(), first.size(), tag);
    any = t.recv_any(second.data(), second.size(), tag, &source);
    r.store->set("posted1", "1");
    t.wait(from1, within(20s));
    t.wait(any, within(20s));
    RANK_CHECK(source == 1, "source {}", source);
    check_pattern(first, 11, "from rank 1, posted first");
    check_pattern(second, 21, "any source, posted second");
    // Past its deadline: Timeout saying no message came from any rank, and withdrawn (the late
    // message goes to the next receive).
    std::vector<uint8_t> small(100);
    Error e =
        wait_for_error(t, t.recv_any(small.data(), small.size(), tag, &source), within(200ms));
    RANK_CHECK(e.code() == ErrorCode::Timeout, "{}", e.what());
    RANK_CHECK(contains(e.what(), "no message from any rank"), "{}", e.what());
    r.store->set("late", "1");
    source = -1;
    t.wait(t.recv_any(small.data(), small.size(), tag, &source), within(20s));
    RANK_CHECK(source == 1, "source {}", source);
    check_pattern(small, 30, "late message");
    // A rank lost while one waits fails it, naming that rank.
    auto orphan = t.recv_any(small.data(), small.size(), tag, &source);
    r.store->set("kill2", "1");
    auto start = Clock::now();
    e = wait_for_error(t, orphan, within(30s));
    RANK_CHECK(e.code() == ErrorCode::PeerLost, "{}", e.what());
    RANK_CHECK(contains(e.what(), "rank 2 ") && contains(e.what(), "receive from any source"), "{}",
               e.what());
    RANK_CHECK(Clock::now() - start < 5s, "PeerLost took too long");
    r.store->set("done", "1");
  });
  for (const auto& result : results) {
    INFO(describe_failures({result}));
    if (result.rank == 2) {
      CHECK(result.signal == SIGKILL);
    } else {
      CHECK(result.exit_code == 0);
    }
  }
}

TEST_CASE("abort from another thread wakes a blocked wait with Aborted and tells the peer",
          "[tcp][multiproc][faults]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 2);
    TcpTransport& t = *r.transport;
    uint64_t value = 0;
    if (rank == 1) {
      // Rank 0's abort shuts its connections down: this wait ends with PeerLost, not a timeout.
      Error e = wait_for_error(t, t.recv(0, &value, sizeof(value), make_tag(1, 0)), within(20s));
      RANK_CHECK(e.code() == ErrorCode::PeerLost, "{}", e.what());
      RANK_CHECK(contains(e.what(), "rank 0 "), "{}", e.what());
      return;
    }
    auto request = t.recv(1, &value, sizeof(value), make_tag(1, 0));
    std::atomic<bool> waiting{false};
    std::thread aborter([&] {
      waiting.wait(false);
      t.abort("test abort");
    });
    auto start = Clock::now();
    waiting = true;
    waiting.notify_one();
    Error e = wait_for_error(t, request, within(20s));
    aborter.join();
    RANK_CHECK(e.code() == ErrorCode::Aborted, "{}", e.what());
    RANK_CHECK(contains(e.what(), "test abort"), "{}", e.what());
    RANK_CHECK(Clock::now() - start < 5s);
    // Every later request fails the same way.
    Error later = wait_for_error(t, t.send(1, &value, sizeof(value), make_tag(2, 0)), within(20s));
    RANK_CHECK(later.code() == ErrorCode::Aborted, "{}", later.what());
  });
}

TEST_CASE("a receive whose size differs from the send fails with Protocol naming both sizes",
          "[tcp][multiproc][faults]") {
  TempDir dir;
  run_ranks_ok(2, [&](int rank) {
    TcpRank r = connect_rank(dir.file("store"), rank, 2);
    TcpTransport& t = *r.transport;
    if (rank == 1) {
      auto wrong = pattern(1, 100);
      auto right = pattern(2, 64);
      t.wait(t.send(0, wrong.data(), wrong.size(), make_tag(3, 0)), within(20s));
      t.wait(t.send(0, right.data(), right.size(), make_tag(3, 1)), within(20s));
      return;
    }
    std::vector<uint8_t> buffer(64, 0);
    Error e = wait_for_error(t, t.recv(1, buffer.data(), 64, make_tag(3, 0)), within(20s));
    RANK_CHECK(e.code() == ErrorCode::Protocol, "{}", e.what());
    RANK_CHECK(contains(e.what(), "100 bytes") && contains(e.what(), "64 bytes") &&
                   contains(e.what(), "rank 1 "),
               "{}", e.what());
    // The mismatched message was discarded whole: the next one arrives intact.
    t.wait(t.recv(1, buffer.data(), 64, make_tag(3, 1)), within(20s));
    check_pattern(buffer, 2, "message after a mismatch");
  });
}

TEST_CASE("posting to this rank or a rank outside the group is InvalidArgument", "[tcp]") {
  TempDir dir;
  TcpRank r = connect_rank(dir.file("store"), 0, 1);
  uint8_t byte = 0;
  CHECK_THROWS_AS(r.transport->send(0, &byte, 1, 0), Error);
  CHECK_THROWS_AS(r.transport->recv(5, &byte, 1, 0), Error);
  CHECK_THROWS_AS(r.transport->wait(collectives::Request{12345}, within(1s)), Error);
}

}  // namespace
}  // namespace weft::tcp::test
