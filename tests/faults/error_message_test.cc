// Error messages that say what to do: real ranks (forked processes) over the tcp backend, each
// test asserting the text a user reads.
//
// - Ranks that call all_reduce with float32 on one and int32 on the other (equal byte sizes) fail
//   with Desync instead of reducing each other's bits as garbage, without WEFT_DEBUG=detail: the
//   call fingerprint in every tag (collectives/tag.h). Over shared memory and over TCP.
// - A size mismatch the fingerprint cannot see (all_to_all split sizes) says it is probably a
//   desync and to rerun with WEFT_DEBUG=detail.
// - A peer that called abort() is said to have aborted, not to have exited or crashed.
// - Every message names this rank, its group and its code once (no nested prefixes).
//
// Rank 0 hosts the store; it waits for rank 1's "done" before returning. The parent process
// makes no weft call (weft::config() is read once per process).
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"
#include "weft/process_group.h"
#include "weft/tcp_store.h"

#include "tests/support/multiproc.h"

namespace weft {
namespace {

using std::chrono::seconds;

std::shared_ptr<ProcessGroup> join(uint16_t port, int rank, const std::string& shm) {
  ProcessGroupOptions options;
  options.url = fmt::format("tcp://127.0.0.1:{}", port);
  options.rank = rank;
  options.world_size = 2;
  options.timeout = seconds(30);
  options.backend_settings = {{"shm", shm}};
  return init_process_group(options);
}

std::unique_ptr<TCPStore> side_store(uint16_t port) {
  return std::make_unique<TCPStore>(
      TCPStoreOptions{.host = "127.0.0.1", .port = port, .timeout = seconds(20)});
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

struct Failure {
  ErrorCode code = ErrorCode::Io;
  std::string message;  // empty: the Work succeeded
};

Failure failure_of(const std::shared_ptr<Work>& work) {
  try {
    work->wait(seconds(20));
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {};
}

// The context once, in front: `rank R/2 group "world" OP #N (...): CODE: ` and no repeat of it.
void check_single_prefix(const Failure& f, int rank, const std::string& op, ErrorCode code) {
  const std::string who = fmt::format("rank {}/2 group \"world\" ", rank);
  RANK_CHECK(f.message.rfind(who + op, 0) == 0, "the message does not start with {}{}: {}", who, op,
             f.message);
  RANK_CHECK(count(f.message, "group \"world\"") == 1, "the context is repeated: {}", f.message);
  RANK_CHECK(count(f.message, fmt::format(": {}: ", error_code_name(code))) == 1,
             "the code is repeated: {}", f.message);
}

void dtype_mismatch(const std::string& shm) {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(
      2,
      [&](int rank) {
        auto pg = join(port, rank, shm);
        auto side = side_store(port);
        pg->barrier()->wait();
        // 1024 x 4 bytes on both ranks: the transport sees equal sizes.
        std::vector<float> f(1024, 1.5f);
        std::vector<int32_t> i(1024, 7);
        const Failure got = failure_of(rank == 0 ? pg->all_reduce(Tensor::of(f.data(), f.size()))
                                                 : pg->all_reduce(Tensor::of(i.data(), i.size())));
        RANK_CHECK(!got.message.empty(), "float32 against int32 all_reduce succeeded (garbage)");
        RANK_CHECK(got.code == ErrorCode::Desync, "expected Desync, got {}: {}",
                   error_code_name(got.code), got.message);
        check_single_prefix(got, rank, "all_reduce #2", ErrorCode::Desync);
        // Over shared memory the collective is small enough for the shared slots, whose barrier
        // compares the calls; over TCP the first message's tag carries the mismatch.
        const std::string named = shm == "1"
                                      ? fmt::format("rank {} runs all_reduce #2 (4096 bytes of {})",
                                                    1 - rank, rank == 0 ? "int32" : "float32")
                                      : fmt::format("rank {} sent tag 2:", 1 - rank);
        RANK_CHECK(got.message.find(named) != std::string::npos, "the peer is not named: {}",
                   got.message);
        RANK_CHECK(
            got.message.find("the two ranks called this collective with different "
                             "arguments (dtype, count, reduce op or root") != std::string::npos,
            "no diagnosis: {}", got.message);
        RANK_CHECK(got.message.find("rerun with WEFT_DEBUG=detail") != std::string::npos,
                   "no next step: {}", got.message);
        // What this rank's buffer holds is its own input, never the peer's bits reduced in.
        if (rank == 0) {
          RANK_CHECK(std::all_of(f.begin(), f.end(), [](float v) { return v == 1.5f; }),
                     "rank 0's float32 buffer was changed");
        } else {
          RANK_CHECK(std::all_of(i.begin(), i.end(), [](int32_t v) { return v == 7; }),
                     "rank 1's int32 buffer was changed");
        }
        if (rank == 1) side->set("test/done/1", "1");
        if (rank == 0) side->wait({"test/done/1"}, seconds(20));
      },
      seconds(60));
}

TEST_CASE("float32 against int32 all_reduce of one byte size fails with Desync over shm",
          "[faults][multiproc][errors]") {
  dtype_mismatch("1");
}

TEST_CASE("float32 against int32 all_reduce of one byte size fails with Desync over TCP",
          "[faults][multiproc][errors]") {
  dtype_mismatch("0");
}

TEST_CASE("a size mismatch says it is probably a desync and to rerun with WEFT_DEBUG=detail",
          "[faults][multiproc][errors]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(
      2,
      [&](int rank) {
        auto pg = join(port, rank, "1");
        auto side = side_store(port);
        pg->barrier()->wait();
        std::vector<int32_t> in(8, rank), out(8, -1);
        // Rank 0 sends rank 1 three elements; rank 1 expects five. Split sizes may differ per
        // rank, so the call fingerprint leaves them out: the transport sees the mismatch.
        const std::vector<size_t> send =
            rank == 0 ? std::vector<size_t>{1, 3} : std::vector<size_t>{2, 2};
        const std::vector<size_t> recv =
            rank == 0 ? std::vector<size_t>{1, 2} : std::vector<size_t>{5, 2};
        const Failure got = failure_of(pg->all_to_all(Tensor::of(out.data(), rank == 0 ? 3 : 7),
                                                      Tensor::of(in.data(), 4), recv, send));
        if (rank == 1) {
          RANK_CHECK(got.code == ErrorCode::Protocol, "expected Protocol, got {}: {}",
                     error_code_name(got.code), got.message);
          check_single_prefix(got, rank, "all_to_all #2", ErrorCode::Protocol);
          RANK_CHECK(got.message.find("rank 0 sent 12 bytes with tag 2:") != std::string::npos &&
                         got.message.find("but this rank expects 20 bytes: the ranks disagree "
                                          "about this collective: probably a desync") !=
                             std::string::npos &&
                         got.message.find("rerun with WEFT_DEBUG=detail") != std::string::npos,
                     "{}", got.message);
          side->set("test/done/1", "1");
        } else {
          side->wait({"test/done/1"}, seconds(20));
        }
      },
      seconds(60));
}

void peer_aborts(const std::string& shm) {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(
      2,
      [&](int rank) {
        auto pg = join(port, rank, shm);
        auto side = side_store(port);
        pg->barrier()->wait();
        if (rank == 1) {
          pg->abort("test abort");
          // Stays until rank 0 has checked: the hang-up is the abort's, not this exit's.
          side->wait({"test/checked"}, seconds(30));
          side->set("test/done/1", "1");
          return;
        }
        std::vector<float> x(256, 1.0f);
        const Failure got = failure_of(pg->all_reduce(Tensor::of(x.data(), x.size())));
        side->set("test/checked", "1");
        RANK_CHECK(got.code == ErrorCode::PeerLost, "expected PeerLost, got {}: {}",
                   error_code_name(got.code), got.message);
        RANK_CHECK(got.message.find("rank 1 aborted its process group and hung up (abort() was "
                                    "called there") != std::string::npos,
                   "the abort is not named: {}", got.message);
        RANK_CHECK(got.message.find("crashed") == std::string::npos &&
                       got.message.find("exited") == std::string::npos &&
                       got.message.find("closed its connection") == std::string::npos,
                   "an abort described as an exit or a crash: {}", got.message);
        check_single_prefix(got, rank, "all_reduce #2", ErrorCode::PeerLost);
        side->wait({"test/done/1"}, seconds(20));
      },
      seconds(60));
}

TEST_CASE("a peer that aborted is named as aborted, not as exited or crashed, over shm",
          "[faults][multiproc][errors]") {
  peer_aborts("1");
}

TEST_CASE("a peer that aborted is named as aborted, not as exited or crashed, over TCP",
          "[faults][multiproc][errors]") {
  peer_aborts("0");
}

}  // namespace
}  // namespace weft
