// The C API (weft/weft.h) at its edges: argument errors and their messages, the work handle's
// wait/test/free contract, timeouts, aborts, sub-groups and the per-thread last error. Ranks are
// real processes meeting through a TCP store (tcp://127.0.0.1:PORT, rank 0 hosts it) with explicit
// rank and world size. That every collective computes the right values is tests/conformance's job;
// here one case per collective checks that the C arguments reach the right C++ ones.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/tcp_store.h"
#include "weft/weft.h"

#include "tests/c_api/c_api_test_support.h"
#include "tests/support/multiproc.h"

namespace weft {
namespace {

using test::capi::Clock;
using test::capi::garbage;
using test::capi::join;
using test::capi::leave;
using test::capi::Signal;

TEST_CASE("weft_init refuses NULL pointers, a wrong struct_size and bad values, naming each",
          "[c_api]") {
  weft_group_t* group = garbage<weft_group_t>();
  EXPECT_RESULT(weft_init(nullptr, &group), WEFT_ERR_INVALID_ARGUMENT,
                "weft_init: InvalidArgument: options is NULL");
  CHECK(group == nullptr);

  weft_init_options_t options = WEFT_INIT_OPTIONS_INIT;
  CHECK(options.struct_size == sizeof(weft_init_options_t));
  CHECK(options.rank == -1);
  CHECK(options.timeout_ms == 0);
  EXPECT_RESULT(weft_init(&options, nullptr), WEFT_ERR_INVALID_ARGUMENT, "group is NULL");
  EXPECT_RESULT(weft_init_from_env(nullptr), WEFT_ERR_INVALID_ARGUMENT,
                "weft_init_from_env: InvalidArgument: group is NULL");

  options.struct_size = sizeof(weft_init_options_t) - 8;
  group = garbage<weft_group_t>();
  EXPECT_RESULT(weft_init(&options, &group), WEFT_ERR_INVALID_ARGUMENT,
                fmt::format("options->struct_size is {}", sizeof(weft_init_options_t) - 8),
                "WEFT_INIT_OPTIONS_INIT");
  CHECK(group == nullptr);
  options.struct_size = sizeof(weft_init_options_t) + 8;
  EXPECT_RESULT(weft_init(&options, &group), WEFT_ERR_INVALID_ARGUMENT, "newer weft.h");
  options.struct_size = 0;
  EXPECT_RESULT(weft_init(&options, &group), WEFT_ERR_INVALID_ARGUMENT, "struct_size is 0");

  options = WEFT_INIT_OPTIONS_INIT;
  options.timeout_ms = -5;
  EXPECT_RESULT(weft_init(&options, &group), WEFT_ERR_INVALID_ARGUMENT, "timeout_ms is -5");

  // Refused by the rendezvous before it connects anywhere.
  options = WEFT_INIT_OPTIONS_INIT;
  options.url = "tcp://127.0.0.1:1";
  options.rank = 3;
  options.world_size = 2;
  EXPECT_RESULT(weft_init(&options, &group), WEFT_ERR_INVALID_ARGUMENT,
                "rank 3 is out of range for world size 2");
  options.url = "bogus://somewhere";
  EXPECT_RESULT(weft_init(&options, &group), WEFT_ERR_INVALID_ARGUMENT, "bogus://");
  CHECK(group == nullptr);
}

TEST_CASE("weft_result_name names every result; weft_version is the project's", "[c_api]") {
  CHECK(std::string(weft_result_name(WEFT_SUCCESS)) == "WEFT_SUCCESS");
  CHECK(std::string(weft_result_name(WEFT_ERR_TIMEOUT)) == "WEFT_ERR_TIMEOUT");
  CHECK(std::string(weft_result_name(WEFT_ERR_PEER_LOST)) == "WEFT_ERR_PEER_LOST");
  CHECK(std::string(weft_result_name(WEFT_ERR_INVALID_ARGUMENT)) == "WEFT_ERR_INVALID_ARGUMENT");
  CHECK(std::string(weft_result_name(WEFT_ERR_UNSUPPORTED)) == "WEFT_ERR_UNSUPPORTED");
  CHECK(std::string(weft_result_name(WEFT_ERR_ABORTED)) == "WEFT_ERR_ABORTED");
  CHECK(std::string(weft_result_name(WEFT_ERR_DESYNC)) == "WEFT_ERR_DESYNC");
  CHECK(std::string(weft_result_name(WEFT_ERR_PROTOCOL)) == "WEFT_ERR_PROTOCOL");
  CHECK(std::string(weft_result_name(WEFT_ERR_IO)) == "WEFT_ERR_IO");
  CHECK(std::string(weft_result_name(WEFT_ERR_INTERNAL)) == "WEFT_ERR_INTERNAL");
  CHECK(std::string(weft_result_name(static_cast<weft_result_t>(77))) == "WEFT_ERR_UNKNOWN");
  CHECK(std::string(weft_version()) == WEFT_TEST_VERSION);
}

TEST_CASE("weft_last_error is the calling thread's, and only failing calls replace it", "[c_api]") {
  weft_group_t* group = nullptr;
  REQUIRE(weft_init(nullptr, &group) == WEFT_ERR_INVALID_ARGUMENT);
  const char* mine = weft_last_error();
  const std::string mine_text = mine;
  REQUIRE(mine_text.find("options is NULL") != std::string::npos);

  std::string other_before, other_after;
  std::thread other([&] {
    other_before = weft_last_error();
    weft_work_wait(nullptr, 0);
    other_after = weft_last_error();
  });
  other.join();
  CHECK(other_before.empty());
  CHECK(other_after == "weft_work_wait: InvalidArgument: work is NULL");

  // Successful calls leave the message (and the pointer) as they were.
  CHECK(weft_work_free(nullptr) == WEFT_SUCCESS);
  CHECK(weft_group_destroy(nullptr) == WEFT_SUCCESS);
  CHECK(weft_last_error() == mine);
  CHECK(std::string(weft_last_error()) == mine_text);
}

TEST_CASE("collectives refuse bad arguments by name and issue nothing; the group stays usable",
          "[c_api][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    weft_group_t* g = join(port, rank, 2);
    const std::string where = fmt::format("rank {}/2 group \"world\"", rank);
    float x[4] = {1, 2, 3, 4};
    int32_t ints[4] = {1, 2, 3, 4};

    // Enum values outside the enums: C passes any int; C++ may only name 0..15 without UB.
    weft_work_t* work = garbage<weft_work_t>();
    EXPECT_RESULT(weft_all_reduce(nullptr, x, x, 4, WEFT_FLOAT32, WEFT_SUM, &work),
                  WEFT_ERR_INVALID_ARGUMENT, "weft_all_reduce: InvalidArgument: group is NULL");
    RANK_CHECK(work == nullptr);
    EXPECT_RESULT(weft_all_reduce(g, x, x, 4, static_cast<weft_dtype_t>(13), WEFT_SUM, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, where + " all_reduce #1: InvalidArgument",
                  "dtype 13 is not a weft_dtype_t value");
    EXPECT_RESULT(weft_broadcast(g, x, 4, static_cast<weft_dtype_t>(15), 0, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "dtype 15 is not a weft_dtype_t value");
    EXPECT_RESULT(
        weft_all_reduce(g, x, x, 4, WEFT_FLOAT32, static_cast<weft_red_op_t>(12), nullptr),
        WEFT_ERR_INVALID_ARGUMENT, "op 12 is not a weft_red_op_t value");
    EXPECT_RESULT(weft_reduce_scatter(g, x, x, 2, WEFT_FLOAT32, WEFT_PREMUL_SUM, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "WEFT_PREMUL_SUM needs a factor");
    EXPECT_RESULT(weft_all_reduce(g, x, x, 4, WEFT_FLOAT32, WEFT_BXOR, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "op bxor cannot reduce float32");
    EXPECT_RESULT(weft_all_reduce_premul(g, ints, ints, 4, WEFT_INT32, 0.5, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "cannot reduce int32");
    EXPECT_RESULT(weft_all_reduce(g, nullptr, x, 4, WEFT_FLOAT32, WEFT_SUM, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "sendbuf is NULL but count is 4");
    EXPECT_RESULT(weft_broadcast(g, x, 4, WEFT_FLOAT32, 2, nullptr), WEFT_ERR_INVALID_ARGUMENT,
                  where + " broadcast #1: InvalidArgument",
                  "root 2 is out of range for a group of 2 ranks");
    EXPECT_RESULT(weft_reduce(g, x, x, 4, WEFT_FLOAT32, WEFT_SUM, -1, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "root -1 is out of range");
    EXPECT_RESULT(weft_all_gather(g, x, x, SIZE_MAX / 2 + 1, WEFT_FLOAT32, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "overflows size_t");
    EXPECT_RESULT(weft_send(g, x, 4, WEFT_FLOAT32, 2, 0, nullptr), WEFT_ERR_INVALID_ARGUMENT,
                  fmt::format("{} send #1: InvalidArgument: dst 2 is out of range for a group of "
                              "2 ranks",
                              where));
    EXPECT_RESULT(weft_recv(g, x, 4, WEFT_FLOAT32, 1 - rank, uint64_t{1} << 63, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "is above the largest");
    int32_t value = 0;
    EXPECT_RESULT(weft_group_rank(g, nullptr), WEFT_ERR_INVALID_ARGUMENT,
                  "weft_group_rank: InvalidArgument: rank is NULL");
    EXPECT_RESULT(weft_group_size(nullptr, &value), WEFT_ERR_INVALID_ARGUMENT, "group is NULL");
    EXPECT_RESULT(weft_work_test(nullptr, nullptr), WEFT_ERR_INVALID_ARGUMENT, "work is NULL");

    // None of it was issued: the first real collective is #1, and it works.
    EXPECT_OK(weft_all_reduce(g, x, x, 4, WEFT_FLOAT32, WEFT_SUM, nullptr));
    for (int i = 0; i < 4; ++i) RANK_CHECK(x[i] == 2.0f * (i + 1), "x[{}] = {}", i, x[i]);
    EXPECT_RESULT(weft_broadcast(g, x, 4, WEFT_FLOAT32, 7, nullptr), WEFT_ERR_INVALID_ARGUMENT,
                  where + " broadcast #2:");
    EXPECT_OK(weft_group_rank(g, &value));
    RANK_CHECK(value == rank);
    EXPECT_OK(weft_group_size(g, &value));
    RANK_CHECK(value == 2);
    leave(g);
  });
}

TEST_CASE("every collective moves the C arguments where the C++ API expects them, sync and async",
          "[c_api][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int r) {
    weft_group_t* g = join(port, r, 3);
    constexpr int n = 5;
    std::vector<weft_work_t*> works;

    // Out-of-place sum, asynchronous: the input is left alone.
    int64_t send[n], recv[n];
    for (int i = 0; i < n; ++i) send[i] = r * 10 + i;
    works.push_back(nullptr);
    EXPECT_OK(weft_all_reduce(g, send, recv, n, WEFT_INT64, WEFT_SUM, &works.back()));
    // In-place max and avg, premul_sum: synchronous.
    double maxed[n], premul[n];
    float avg[n];
    for (int i = 0; i < n; ++i) {
      maxed[i] = r + i;
      premul[i] = r + 1;
      avg[i] = static_cast<float>(r);
    }
    EXPECT_OK(weft_all_reduce(g, maxed, maxed, n, WEFT_FLOAT64, WEFT_MAX, nullptr));
    EXPECT_OK(weft_all_reduce(g, avg, avg, n, WEFT_FLOAT32, WEFT_AVG, nullptr));
    EXPECT_OK(weft_all_reduce_premul(g, premul, premul, n, WEFT_FLOAT64, 0.5, nullptr));
    // reduce to root 1 (recvbuf NULL elsewhere), broadcast from root 2.
    int32_t factors[n], product[n], bcast[n];
    for (int i = 0; i < n; ++i) {
      factors[i] = r + 2;
      product[i] = -1;
      bcast[i] = r == 2 ? 7 + i : -1;
    }
    EXPECT_OK(
        weft_reduce(g, factors, r == 1 ? product : nullptr, n, WEFT_INT32, WEFT_PROD, 1, nullptr));
    EXPECT_OK(weft_broadcast(g, bcast, n, WEFT_INT32, 2, nullptr));
    // all_gather, out of place and in place (this rank's block of the output as the input).
    int32_t mine[n], gathered[3 * n], in_place[3 * n];
    for (int i = 0; i < n; ++i) mine[i] = in_place[r * n + i] = r * 100 + i;
    EXPECT_OK(weft_all_gather(g, mine, gathered, n, WEFT_INT32, nullptr));
    works.push_back(nullptr);
    EXPECT_OK(weft_all_gather(g, in_place + r * n, in_place, n, WEFT_INT32, &works.back()));
    // reduce_scatter (sum) and its premul variant.
    int64_t scatter_in[3 * n], scatter_out[n];
    double ones[3 * n], scaled[n];
    for (int k = 0; k < 3 * n; ++k) {
      scatter_in[k] = r + k;
      ones[k] = 1.0;
    }
    EXPECT_OK(weft_reduce_scatter(g, scatter_in, scatter_out, n, WEFT_INT64, WEFT_SUM, nullptr));
    EXPECT_OK(weft_reduce_scatter_premul(g, ones, scaled, n, WEFT_FLOAT64, 2.0, nullptr));
    // Even all_to_all: block j goes to rank j.
    int32_t a2a_in[3 * 2], a2a_out[3 * 2];
    for (int j = 0; j < 3; ++j) {
      for (int i = 0; i < 2; ++i) a2a_in[j * 2 + i] = r * 100 + j * 10 + i;
    }
    EXPECT_OK(weft_all_to_all(g, a2a_in, a2a_out, 2, WEFT_INT32, nullptr));
    // A ring of send/recv: small messages, so every rank may send first.
    int32_t outgoing[n], incoming[n];
    for (int i = 0; i < n; ++i) outgoing[i] = r * 1000 + i;
    works.push_back(nullptr);
    EXPECT_OK(weft_send(g, outgoing, n, WEFT_INT32, (r + 1) % 3, 5, &works.back()));
    EXPECT_OK(weft_recv(g, incoming, n, WEFT_INT32, (r + 2) % 3, 5, nullptr));
    // From any source: rank 0 takes ranks 1 and 2's messages, once synchronously (the sender in
    // *source) and once asynchronously (weft_work_source_rank).
    int32_t from_any[2][n];
    int32_t sources[2] = {-1, -1};
    if (r == 0) {
      EXPECT_OK(weft_recv_any(g, from_any[0], n, WEFT_INT32, 6, &sources[0], nullptr));
      weft_work_t* any = nullptr;
      EXPECT_OK(weft_recv_any(g, from_any[1], n, WEFT_INT32, 6, nullptr, &any));
      EXPECT_OK(weft_work_wait(any, -1));
      EXPECT_OK(weft_work_source_rank(any, &sources[1]));
      EXPECT_OK(weft_work_free(any));
      RANK_CHECK(sources[0] + sources[1] == 3 && sources[0] * sources[1] == 2,
                 "recv_any sources {} and {}, expected 1 and 2", sources[0], sources[1]);
      for (int m = 0; m < 2; ++m) {
        for (int i = 0; i < n; ++i) {
          RANK_CHECK(from_any[m][i] == sources[m] * 1000 + i, "recv_any #{} [{}] = {}", m, i,
                     from_any[m][i]);
        }
      }
    } else {
      works.push_back(nullptr);
      EXPECT_OK(weft_send(g, outgoing, n, WEFT_INT32, 0, 6, &works.back()));
    }
    works.push_back(nullptr);
    EXPECT_OK(weft_barrier(g, &works.back()));

    for (weft_work_t* w : works) {
      EXPECT_OK(weft_work_wait(w, -1));
      EXPECT_OK(weft_work_free(w));
    }
    for (int i = 0; i < n; ++i) {
      RANK_CHECK(send[i] == r * 10 + i, "send[{}] changed to {}", i, send[i]);
      RANK_CHECK(recv[i] == 30 + 3 * i, "all_reduce sum [{}] = {}", i, recv[i]);
      RANK_CHECK(maxed[i] == 2 + i, "all_reduce max [{}] = {}", i, maxed[i]);
      RANK_CHECK(avg[i] == 1.0f, "all_reduce avg [{}] = {}", i, avg[i]);
      RANK_CHECK(premul[i] == 0.5 * (1 + 2 + 3), "premul_sum [{}] = {}", i, premul[i]);
      RANK_CHECK(product[i] == (r == 1 ? 2 * 3 * 4 : -1), "reduce prod [{}] = {}", i, product[i]);
      RANK_CHECK(bcast[i] == 7 + i, "broadcast [{}] = {}", i, bcast[i]);
      RANK_CHECK(scatter_out[i] == 3 + 3 * (r * n + i), "reduce_scatter [{}] = {}", i,
                 scatter_out[i]);
      RANK_CHECK(scaled[i] == 2.0 * 3, "reduce_scatter premul [{}] = {}", i, scaled[i]);
      RANK_CHECK(incoming[i] == (r + 2) % 3 * 1000 + i, "recv [{}] = {}", i, incoming[i]);
    }
    for (int k = 0; k < 3 * n; ++k) {
      const int32_t expected = k / n * 100 + k % n;
      RANK_CHECK(gathered[k] == expected, "all_gather [{}] = {}", k, gathered[k]);
      RANK_CHECK(in_place[k] == expected, "in-place all_gather [{}] = {}", k, in_place[k]);
    }
    for (int j = 0; j < 3; ++j) {
      for (int i = 0; i < 2; ++i) {
        RANK_CHECK(a2a_out[j * 2 + i] == j * 100 + r * 10 + i, "all_to_all [{}] = {}", j * 2 + i,
                   a2a_out[j * 2 + i]);
      }
    }
    leave(g);
  });
}

TEST_CASE("weft_gather, weft_scatter and weft_all_to_all_v move their blocks; bad ones are named",
          "[c_api][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int r) {
    weft_group_t* g = join(port, r, 3);
    const std::string where = fmt::format("rank {}/3 group \"world\"", r);
    constexpr int n = 4;
    // gather to root 2 (recvbuf NULL elsewhere), asynchronously.
    int32_t mine[n], gathered[3 * n];
    for (int i = 0; i < n; ++i) mine[i] = r * 100 + i;
    for (int k = 0; k < 3 * n; ++k) gathered[k] = -1;
    weft_work_t* work = nullptr;
    EXPECT_OK(weft_gather(g, mine, r == 2 ? gathered : nullptr, n, WEFT_INT32, 2, &work));
    EXPECT_OK(weft_work_wait(work, -1));
    EXPECT_OK(weft_work_free(work));
    // scatter from root 0 (sendbuf NULL elsewhere).
    double all[3 * n], block[n];
    for (int k = 0; k < 3 * n; ++k) all[k] = r == 0 ? 0.5 * k : -1.0;
    EXPECT_OK(weft_scatter(g, r == 0 ? all : nullptr, block, n, WEFT_FLOAT64, 0, nullptr));
    // all_to_all_v: rank r sends j + r + 1 elements to rank j, each r * 1000 + j * 10 + i.
    size_t send_counts[3], recv_counts[3];
    std::vector<int64_t> send, recv;
    for (int j = 0; j < 3; ++j) {
      send_counts[j] = static_cast<size_t>(j + r + 1);
      recv_counts[j] = static_cast<size_t>(r + j + 1);
      for (int i = 0; i < j + r + 1; ++i) send.push_back(r * 1000 + j * 10 + i);
    }
    recv.assign(send.size(), -1);  // sum over j of (r + j + 1) == the same sum
    EXPECT_OK(weft_all_to_all_v(g, send.data(), send_counts, recv.data(), recv_counts, WEFT_INT64,
                                nullptr));

    for (int k = 0; k < 3 * n; ++k) {
      const int32_t expected = r == 2 ? k / n * 100 + k % n : -1;
      RANK_CHECK(gathered[k] == expected, "gather [{}] = {}", k, gathered[k]);
    }
    for (int i = 0; i < n; ++i) {
      RANK_CHECK(block[i] == 0.5 * (r * n + i), "scatter [{}] = {}", i, block[i]);
    }
    size_t at = 0;
    for (int j = 0; j < 3; ++j) {
      for (int i = 0; i < r + j + 1; ++i, ++at) {
        RANK_CHECK(recv[at] == j * 1000 + r * 10 + i, "all_to_all_v [{}] = {}", at, recv[at]);
      }
    }

    // Refusals name the argument; none is issued.
    EXPECT_RESULT(weft_gather(g, mine, nullptr, n, WEFT_INT32, r, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, where + " gather_into_tensor #4: InvalidArgument",
                  "recvbuf is NULL but count is 12");
    EXPECT_RESULT(weft_scatter(g, all, block, n, WEFT_FLOAT64, 3, nullptr),
                  WEFT_ERR_INVALID_ARGUMENT, "root 3 is out of range for a group of 3 ranks");
    EXPECT_RESULT(
        weft_all_to_all_v(g, send.data(), nullptr, recv.data(), recv_counts, WEFT_INT64, nullptr),
        WEFT_ERR_INVALID_ARGUMENT, where + " all_to_all #4: InvalidArgument",
        "send_counts is NULL");
    size_t huge[3] = {SIZE_MAX, 1, 0};
    EXPECT_RESULT(
        weft_all_to_all_v(g, send.data(), huge, recv.data(), recv_counts, WEFT_INT64, nullptr),
        WEFT_ERR_INVALID_ARGUMENT, "the sum of send_counts overflows size_t");
    EXPECT_OK(weft_barrier(g, nullptr));
    leave(g);
  });
}

TEST_CASE("a pending work tests not done and times out a short wait; a freed one still runs",
          "[c_api][multiproc]") {
  const uint16_t port = test::free_port();
  Signal rank0_tested, rank0_freed;
  test::run_ranks_ok(2, [&](int rank) {
    weft_group_t* g = join(port, rank, 2);
    // Rank 1 issues its half only once rank 0 has tested and waited on its pending work.
    int64_t x[3] = {rank + 1, rank + 1, rank + 1};
    weft_work_t* work = nullptr;
    if (rank == 1) rank0_tested.wait();
    EXPECT_OK(weft_all_reduce(g, x, x, 3, WEFT_INT64, WEFT_SUM, &work));
    RANK_CHECK(work != nullptr);
    if (rank == 0) {
      int done = -1;
      EXPECT_OK(weft_work_test(work, &done));
      RANK_CHECK(done == 0);
      EXPECT_RESULT(weft_work_wait(work, 0), WEFT_ERR_TIMEOUT,
                    "rank 0/2 group \"world\" all_reduce #1", "did not complete within");
      const auto start = Clock::now();
      EXPECT_RESULT(weft_work_wait(work, 50), WEFT_ERR_TIMEOUT, "did not complete within");
      RANK_CHECK(Clock::now() - start >= std::chrono::milliseconds(50));
      rank0_tested.post();
    }
    EXPECT_OK(weft_work_wait(work, -1));  // the work's own timeout: the group's 20 s
    int done = 0;
    EXPECT_OK(weft_work_test(work, &done));
    RANK_CHECK(done == 1);
    EXPECT_OK(weft_work_wait(work, 0));  // a completed work answers again, at once
    EXPECT_OK(weft_work_free(work));
    for (int64_t v : x) RANK_CHECK(v == 1 + 2, "{}", v);

    // Freed before it could complete (rank 1 is late again): it still runs, in issue order, so
    // once the barrier after it returns, its output is final.
    int64_t y[2] = {10 * (rank + 1), 10 * (rank + 1)};
    if (rank == 1) rank0_freed.wait();
    work = nullptr;
    EXPECT_OK(weft_all_reduce(g, y, y, 2, WEFT_INT64, WEFT_SUM, &work));
    EXPECT_OK(weft_work_free(work));
    if (rank == 0) rank0_freed.post();
    EXPECT_OK(weft_barrier(g, nullptr));
    for (int64_t v : y) RANK_CHECK(v == 10 + 20, "{}", v);
    leave(g);
  });
}

TEST_CASE("abort fails pending work with WEFT_ERR_ABORTED and the reason; so do later calls",
          "[c_api][multiproc]") {
  const uint16_t port = test::free_port();
  Signal rank0_done, rank1_joined, rank1_done;
  test::run_ranks_ok(2, [&](int rank) {
    if (rank == 1) {
      // Issues nothing; stays alive (so rank 0 sees an abort, not a lost peer) until rank 0 is
      // done. Rank 0's group hosts the store: it is not destroyed before this rank's weft_init
      // returned (rank 0's own may return before this one has read the last of the rendezvous),
      // and rank 0 stays until this rank is through.
      Signal::PostAtExit post{rank1_done};
      weft_group_t* g = nullptr;
      {
        Signal::PostAtExit joined{rank1_joined};
        g = join(port, rank, 2);
      }
      rank0_done.wait();
      EXPECT_OK(weft_group_abort(g, nullptr));
      EXPECT_OK(weft_group_destroy(g));
      return;
    }
    {
      Signal::PostAtExit post{rank0_done};
      weft_group_t* g = join(port, rank, 2);
      float x[8] = {};
      weft_work_t* work = nullptr;
      EXPECT_OK(weft_all_reduce(g, x, x, 8, WEFT_FLOAT32, WEFT_SUM, &work));
      EXPECT_OK(weft_group_abort(g, "the test gives up on rank 1"));
      EXPECT_RESULT(weft_work_wait(work, 5000), WEFT_ERR_ABORTED, "the test gives up on rank 1");
      int done = 0;
      EXPECT_RESULT(weft_work_test(work, &done), WEFT_ERR_ABORTED, "the test gives up on rank 1");
      RANK_CHECK(done == 1);
      EXPECT_OK(weft_work_free(work));
      const auto start = Clock::now();
      EXPECT_RESULT(weft_barrier(g, nullptr), WEFT_ERR_ABORTED, "the test gives up on rank 1");
      RANK_CHECK(Clock::now() - start < std::chrono::seconds(2));
      rank1_joined.wait();
      EXPECT_OK(weft_group_destroy(g));
    }
    rank1_done.wait();
  });
}

TEST_CASE("a synchronous collective past the group's timeout returns WEFT_ERR_TIMEOUT and stops",
          "[c_api][multiproc][slow]") {
  const uint16_t port = test::free_port();
  Signal rank0_done, rank1_joined, rank1_done;
  constexpr int64_t kTimeoutMs = 3000;  // also bounds the rendezvous: room for a loaded host
  test::run_ranks_ok(2, [&](int rank) {
    if (rank == 1) {
      Signal::PostAtExit post{rank1_done};  // rank 0's group hosts the store: as above
      weft_group_t* g = nullptr;
      {
        Signal::PostAtExit joined{rank1_joined};
        g = join(port, rank, 2, kTimeoutMs);
      }
      rank0_done.wait();  // issues nothing
      EXPECT_OK(weft_group_destroy(g));
      return;
    }
    {
      Signal::PostAtExit post{rank0_done};
      weft_group_t* g = join(port, rank, 2, kTimeoutMs);
      double x[4] = {1, 2, 3, 4};
      const auto start = Clock::now();
      EXPECT_RESULT(weft_all_reduce(g, x, x, 4, WEFT_FLOAT64, WEFT_SUM, nullptr), WEFT_ERR_TIMEOUT,
                    "all_reduce #1", "Timeout");
      const auto waited = Clock::now() - start;
      RANK_CHECK(waited >= std::chrono::milliseconds(kTimeoutMs - 100) &&
                     waited < std::chrono::milliseconds(3 * kTimeoutMs),
                 "returned after {} ms",
                 std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
      // Nothing of the all_reduce is left running: the group fails at once from now on.
      const auto again = Clock::now();
      const weft_result_t result = weft_barrier(g, nullptr);
      RANK_CHECK(result == WEFT_ERR_TIMEOUT || result == WEFT_ERR_ABORTED, "{}: {}",
                 weft_result_name(result), weft_last_error());
      RANK_CHECK(Clock::now() - again < std::chrono::seconds(1));
      rank1_joined.wait();
      EXPECT_OK(weft_group_destroy(g));
    }
    rank1_done.wait();
  });
}

TEST_CASE("weft_new_group and weft_split make sub-groups, NULL on ranks left out",
          "[c_api][multiproc]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int rank) {
    weft_group_t* world = join(port, rank, 3);
    const int32_t evens[] = {0, 2};
    weft_group_t* pair = garbage<weft_group_t>();
    EXPECT_OK(weft_new_group(world, evens, 2, &pair));
    RANK_CHECK((pair == nullptr) == (rank == 1));

    const int32_t bad[] = {0, 5};
    weft_group_t* none = garbage<weft_group_t>();
    EXPECT_RESULT(weft_new_group(world, bad, 2, &none), WEFT_ERR_INVALID_ARGUMENT,
                  "new_group: InvalidArgument: ranks: 5 is out of range for a group of 3");
    RANK_CHECK(none == nullptr);
    EXPECT_RESULT(weft_new_group(world, nullptr, 2, &none), WEFT_ERR_INVALID_ARGUMENT,
                  "weft_new_group: InvalidArgument: ranks is NULL but num_ranks is 2");
    EXPECT_RESULT(weft_new_group(world, evens, 2, nullptr), WEFT_ERR_INVALID_ARGUMENT,
                  "out is NULL");
    EXPECT_RESULT(weft_split(world, 0, 0, nullptr), WEFT_ERR_INVALID_ARGUMENT, "out is NULL");

    // Rank 0 joins nothing; ranks 1 and 2 form a group ordered by key: rank 2 first.
    weft_group_t* split = garbage<weft_group_t>();
    EXPECT_OK(weft_split(world, rank == 0 ? -1 : 1, -rank, &split));
    RANK_CHECK((split == nullptr) == (rank == 0));

    int32_t sub_rank = -1, sub_size = -1;
    if (pair != nullptr) {
      EXPECT_OK(weft_group_rank(pair, &sub_rank));
      EXPECT_OK(weft_group_size(pair, &sub_size));
      RANK_CHECK(sub_rank == rank / 2 && sub_size == 2, "{} of {}", sub_rank, sub_size);
      int32_t v = rank + 1;
      EXPECT_OK(weft_all_reduce(pair, &v, &v, 1, WEFT_INT32, WEFT_SUM, nullptr));
      RANK_CHECK(v == 1 + 3, "{}", v);
    }
    if (split != nullptr) {
      EXPECT_OK(weft_group_rank(split, &sub_rank));
      RANK_CHECK(sub_rank == 2 - rank, "{}", sub_rank);
      int32_t v = rank == 2 ? 42 : 0;
      EXPECT_OK(weft_broadcast(split, &v, 1, WEFT_INT32, 0, nullptr));  // from world rank 2
      RANK_CHECK(v == 42, "{}", v);
    }
    EXPECT_OK(weft_group_destroy(pair));
    EXPECT_OK(weft_group_destroy(split));
    leave(world);
  });
}

TEST_CASE("weft_dump_trace writes this rank's flight recorder where WEFT_TRACE_DIR says",
          "[c_api][multiproc]") {
  // The folder meson gives every test (earlier cases of this binary already read the
  // configuration, which children inherit): other tests may dump there too, so a file that is
  // not ours is read again after another dump.
  const char* dir = std::getenv("WEFT_TRACE_DIR");
  const std::string folder = dir != nullptr && *dir != '\0' ? dir : ".";
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    weft_group_t* g = join(port, rank, 2);
    int32_t x[4] = {rank, rank, rank, rank};
    EXPECT_OK(weft_all_reduce(g, x, x, 4, WEFT_INT32, WEFT_SUM, nullptr));
    const std::string reason = fmt::format("from C, pid {}", getpid());
    const std::string path = fmt::format("{}/weft-trace-rank{}.json", folder, rank);
    bool found = false;
    for (int attempt = 0; attempt < 5 && !found; ++attempt) {
      size_t written = 99;
      EXPECT_OK(weft_dump_trace(reason.c_str(), &written));
      RANK_CHECK(written == 1, "{}", written);
      FILE* file = std::fopen(path.c_str(), "r");
      RANK_CHECK(file != nullptr, "no {}", path);
      std::string text(1 << 20, '\0');
      text.resize(std::fread(text.data(), 1, text.size(), file));
      std::fclose(file);
      found = text.find(fmt::format("\"reason\": \"{}\"", reason)) != std::string::npos;
      if (found) {
        RANK_CHECK(text.find("\"op\": \"all_reduce\"") != std::string::npos, "{}", text);
      }
    }
    RANK_CHECK(found, "{} never held this rank's dump", path);
    EXPECT_OK(weft_dump_trace(nullptr, nullptr));
    leave(g);
  });
}

}  // namespace
}  // namespace weft

namespace weft {
namespace {

TEST_CASE(
    "weft_symmetric_alloc gives memory whose all_reduce runs zero-copy; free refuses while "
    "in use",
    "[c_api][multiproc][symmetric]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int rank) {
    using test::capi::join;
    using test::capi::leave;
    weft_group_t* g = join(port, rank, 3);
    weft_symmetric_t* buffer = nullptr;
    EXPECT_RESULT(weft_symmetric_alloc(g, 4096, nullptr), WEFT_ERR_INVALID_ARGUMENT,
                  "buffer is NULL");
    EXPECT_OK(weft_symmetric_alloc(g, 4096, &buffer));
    void* data = nullptr;
    size_t bytes = 0;
    EXPECT_OK(weft_symmetric_data(buffer, &data, &bytes));
    RANK_CHECK(data != nullptr && bytes == 4096);
    auto* x = static_cast<int32_t*>(data);
    for (int i = 0; i < 1000; ++i) x[i] = rank * 100 + i;
    // Rank 2 posts only once rank 0 has tried to free the buffer: until then rank 0's
    // all_reduce waits for it. (The hand-off goes through the C++ store client: the C API has
    // none.)
    TCPStore side(
        TCPStoreOptions{.host = "127.0.0.1", .port = port, .timeout = std::chrono::seconds(20)});
    if (rank == 2) side.wait({"test/free_tried"}, std::chrono::seconds(20));
    weft_work_t* work = nullptr;
    EXPECT_OK(weft_all_reduce(g, x, x, 1000, WEFT_INT32, WEFT_SUM, &work));
    if (rank == 0) {
      EXPECT_RESULT(weft_symmetric_free(buffer), WEFT_ERR_INVALID_ARGUMENT, "all_reduce #1",
                    "still in use");
      side.set("test/free_tried", "1");
    }
    EXPECT_OK(weft_work_wait(work, -1));
    EXPECT_OK(weft_work_free(work));
    for (int i = 0; i < 1000; ++i) {
      RANK_CHECK(x[i] == 300 + 3 * i, "rank {} x[{}] = {}", rank, i, x[i]);
    }
    EXPECT_OK(weft_symmetric_free(buffer));
    EXPECT_OK(weft_symmetric_free(nullptr));
    leave(g);
  });
}

}  // namespace
}  // namespace weft
