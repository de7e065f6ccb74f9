// c10d's habits on weft's ProcessGroup (docs/process-groups.md, "Coming from c10d"), on real
// processes over the tcp backend: object collectives, monitored_barrier, send/recv to oneself,
// batch_isend_irecv, all_to_all_single, the default group's helpers and Work::then. Every result
// is checked element by element against values computed here.
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/process_group.h"
#include "weft/tcp_store.h"

#include "tests/support/multiproc.h"

namespace weft {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::shared_ptr<ProcessGroup> join(uint16_t port, int rank, int size) {
  ProcessGroupOptions options;
  options.url = fmt::format("tcp://127.0.0.1:{}", port);
  options.rank = rank;
  options.world_size = size;
  options.timeout = seconds(20);
  return init_process_group(options);
}

// Rank r's object: (r * 37 + salt) % 53 bytes (rank 0 with salt 0: empty), byte i = r * 31 + i.
Bytes object_of(int rank, int salt = 0) {
  Bytes b(static_cast<size_t>((rank * 37 + salt) % 53));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(rank * 31 + salt + i);
  return b;
}

void check_object(const Bytes& got, const Bytes& expected, std::string_view what, int rank,
                  size_t index) {
  RANK_CHECK(got.size() == expected.size(), "rank {} {}[{}]: {} bytes, expected {}", rank, what,
             index, got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    RANK_CHECK(got[i] == expected[i], "rank {} {}[{}] byte {}: {}, expected {}", rank, what, index,
               i, got[i], expected[i]);
  }
}

// The Error `fn` throws (a test failure when it throws none).
template <typename Fn>
Error error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  throw std::runtime_error("expected a weft::Error");
}

TEST_CASE("object collectives move byte strings of different sizes to the right ranks",
          "[c10d][objects]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(4, [&](int rank) {
    auto pg = join(port, rank, 4);
    // all_gather_object: every rank's object, by rank.
    std::vector<Bytes> all = pg->all_gather_object(object_of(rank));
    RANK_CHECK(all.size() == 4);
    for (int r = 0; r < 4; ++r) check_object(all[r], object_of(r), "all_gather_object", rank, r);

    // broadcast_object_list from root 2: three objects; the others start with none.
    std::vector<Bytes> list;
    if (rank == 2) list = {object_of(5, 1), Bytes{}, object_of(6, 2)};
    pg->broadcast_object_list(list, 2);
    RANK_CHECK(list.size() == 3, "{} objects", list.size());
    const std::vector<Bytes> expected_list = {object_of(5, 1), Bytes{}, object_of(6, 2)};
    for (size_t i = 0; i < 3; ++i) {
      check_object(list[i], expected_list[i], "broadcast_object_list", rank, i);
    }

    // gather_object to root 1.
    std::vector<Bytes> gathered = pg->gather_object(object_of(rank, 3), 1);
    if (rank == 1) {
      RANK_CHECK(gathered.size() == 4);
      for (int r = 0; r < 4; ++r) check_object(gathered[r], object_of(r, 3), "gather_object", 1, r);
    } else {
      RANK_CHECK(gathered.empty(), "gather_object gave {} objects off root", gathered.size());
    }

    // scatter_object_list from root 3: rank r gets object_of(r, 7).
    std::vector<Bytes> to_scatter;
    if (rank == 3) {
      for (int r = 0; r < 4; ++r) to_scatter.push_back(object_of(r, 7));
    }
    Bytes mine = pg->scatter_object_list(to_scatter, 3);
    check_object(mine, object_of(rank, 7), "scatter_object_list", rank, 0);

    // A root out of range names the call.
    Error e = error_of([&] { pg->gather_object(Bytes{1}, 4); });
    RANK_CHECK(e.code() == ErrorCode::InvalidArgument);
    RANK_CHECK(std::string(e.what()).find("gather_object #") != std::string::npos &&
                   std::string(e.what()).find("root 4 is out of range for a group of 4 ranks") !=
                       std::string::npos,
               "{}", e.what());
  });
}

TEST_CASE("monitored_barrier passes when all arrive and names the ranks that did not",
          "[c10d][monitored_barrier]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(4, [&](int rank) {
    auto pg = join(port, rank, 4);
    pg->monitored_barrier(seconds(10));
    pg->barrier()->wait();  // ranks 2 and 3 stay until everyone has passed the first one
    if (rank >= 2) return;  // they never arrive at the next two
    // Rank 0 hosts the store that rank 1 reads rank 0's verdicts from: it stays until rank 1 is
    // through (as with PyTorch's TCPStore, the store's host must outlive the others' use of it).
    TCPStore side(TCPStoreOptions{.host = "127.0.0.1", .port = port, .timeout = seconds(20)});
    struct Done {
      TCPStore& side;
      int rank;
      ~Done() {
        try {
          if (rank == 1) side.set("test/monitored/done", "1");
          if (rank == 0) side.wait({"test/monitored/done"}, seconds(20));
        } catch (const Error&) {
          // The check that failed says why; this only orders the exits.
        }
      }
    } done{side, rank};
    const std::string prefix = fmt::format("rank {}/4 group \"world\" monitored_barrier #", rank);
    Error all = error_of([&] { pg->monitored_barrier(milliseconds(300), true); });
    RANK_CHECK(all.code() == ErrorCode::Timeout, "{}", all.what());
    RANK_CHECK(
        std::string(all.what()) == prefix + "2: Timeout: ranks 2, 3 did not arrive within 300 ms",
        "{}", all.what());
    Error first = error_of([&] { pg->monitored_barrier(milliseconds(300)); });
    RANK_CHECK(std::string(first.what()) ==
                   prefix +
                       "3: Timeout: rank 2 did not arrive within 300 ms (the first one missing; "
                       "wait_all_ranks=true names all)",
               "{}", first.what());
  });
}

TEST_CASE("send and recv to oneself match by tag in posting order, either half first",
          "[c10d][self]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2);
    std::vector<int32_t> a(100), b(100), got_a(100, -1), got_b(100, -1);
    for (int i = 0; i < 100; ++i) a[i] = rank * 1000 + i, b[i] = -rank * 1000 - i;
    // Receive first: pending until the send comes.
    auto r1 = pg->recv(Tensor::of(got_a.data(), 100), rank, 5);
    RANK_CHECK(!r1->is_completed());
    auto s1 = pg->send(Tensor::of(a.data(), 100), rank, 5);
    // Two sends on one tag, then two receives: in posting order.
    auto s2 = pg->send(Tensor::of(b.data(), 100), rank, 6);
    auto s3 = pg->send(Tensor::of(a.data(), 100), rank, 6);
    std::vector<int32_t> second(100, -1);
    auto r2 = pg->recv(Tensor::of(got_b.data(), 100), rank, 6);
    auto r3 = pg->recv(Tensor::of(second.data(), 100), rank, 6);
    wait_all(std::vector<std::shared_ptr<Work>>{r1, s1, s2, s3, r2, r3});
    for (int i = 0; i < 100; ++i) {
      RANK_CHECK(got_a[i] == a[i], "tag 5 [{}]: {} != {}", i, got_a[i], a[i]);
      RANK_CHECK(got_b[i] == b[i], "tag 6 first [{}]: {} != {}", i, got_b[i], b[i]);
      RANK_CHECK(second[i] == a[i], "tag 6 second [{}]: {} != {}", i, second[i], a[i]);
    }
    // A size mismatch fails both halves, naming both.
    std::vector<int32_t> small(3);
    auto bad_send = pg->send(Tensor::of(a.data(), 100), rank, 9);
    auto bad_recv = pg->recv(Tensor::of(small.data(), 3), rank, 9);
    for (const auto& w : {bad_send, bad_recv}) {
      Error e = error_of([&] { w->wait(); });
      RANK_CHECK(e.code() == ErrorCode::InvalidArgument);
      RANK_CHECK(std::string(e.what()).find("disagree: the send has int32 x 100 on cpu, the recv "
                                            "int32 x 3 on cpu") != std::string::npos,
                 "{}", e.what());
    }
    // Still usable, with the peer too: a collective after it all.
    std::vector<int64_t> x = {rank + 1, 10};
    pg->all_reduce(Tensor::of(x.data(), 2))->wait();
    RANK_CHECK(x[0] == 3 && x[1] == 20, "{} {}", x[0], x[1]);
    // abort() fails an unmatched half.
    auto lonely = pg->recv(Tensor::of(small.data(), 3), rank, 11);
    pg->abort("test over");
    Error e = error_of([&] { lonely->wait(); });
    RANK_CHECK(e.code() == ErrorCode::Aborted, "{}", e.what());
  });
}

TEST_CASE(
    "batch_isend_irecv runs a ring exchange with self-sends in one unit; "
    "all_to_all_single equals all_to_all with splits",
    "[c10d][batch]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int rank) {
    auto pg = join(port, rank, 3);
    const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
    std::vector<float> out(257), from_prev(257, -1), self_out(5), self_in(5, -1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = float(rank * 1000 + i);
    for (size_t i = 0; i < 5; ++i) self_out[i] = float(-rank - i);
    // Receives first on every rank: fine inside one unit.
    auto works = pg->batch_isend_irecv({{P2POp::Recv, Tensor::of(from_prev.data(), 257), prev},
                                        {P2POp::Recv, Tensor::of(self_in.data(), 5), rank, 3},
                                        {P2POp::Send, Tensor::of(out.data(), 257), next},
                                        {P2POp::Send, Tensor::of(self_out.data(), 5), rank, 3}});
    RANK_CHECK(works.size() == 4);
    wait_all(works);
    for (size_t i = 0; i < 257; ++i) {
      RANK_CHECK(from_prev[i] == float(prev * 1000 + i), "[{}] {}", i, from_prev[i]);
    }
    for (size_t i = 0; i < 5; ++i) RANK_CHECK(self_in[i] == self_out[i], "self [{}]", i);

    // all_to_all_single: rank r sends (j + 1) elements r * 100 + j * 10 + k to rank j.
    std::vector<size_t> input_splits = {1, 2, 3};
    std::vector<size_t> output_splits(3, static_cast<size_t>(rank + 1));
    std::vector<int32_t> input, output(3 * (rank + 1), -1);
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k <= j; ++k) input.push_back(rank * 100 + j * 10 + k);
    }
    pg->all_to_all_single(Tensor::of(output.data(), output.size()),
                          Tensor::of(input.data(), input.size()), output_splits, input_splits)
        ->wait();
    for (int q = 0; q < 3; ++q) {
      for (int k = 0; k <= rank; ++k) {
        const int32_t expected = q * 100 + rank * 10 + k;
        const int32_t got = output[q * (rank + 1) + k];
        RANK_CHECK(got == expected, "from {} [{}]: {} != {}", q, k, got, expected);
      }
    }
  });
}

TEST_CASE("the default group: is_initialized, get_rank, get_world_size, destroy_process_group",
          "[c10d][default_group]") {
  const uint16_t port = test::free_port();
  const uint16_t port2 = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    RANK_CHECK(!is_initialized());
    Error none = error_of([] { get_rank(); });
    RANK_CHECK(none.code() == ErrorCode::InvalidArgument);
    RANK_CHECK(std::string(none.what())
                       .find("default process group: InvalidArgument: there is "
                             "none: call weft::init_process_group() first") == 0,
               "{}", none.what());
    auto world = join(port, rank, 2);
    RANK_CHECK(is_initialized());
    RANK_CHECK(get_rank() == rank && get_world_size() == 2);
    RANK_CHECK(default_group() == world);
    // A second world does not replace the default; helpers take a group too.
    auto other = join(port2, 1 - rank, 2);
    RANK_CHECK(default_group() == world);
    RANK_CHECK(get_rank(other) == 1 - rank && get_world_size(other) == 2);
    // Both are through other's set-up before its store's host (process 1) destroys it.
    other->barrier()->wait();
    destroy_process_group(other);
    RANK_CHECK(default_group() == world);
    destroy_process_group();
    RANK_CHECK(!is_initialized());
    Error gone = error_of([&] { world->barrier(); });
    RANK_CHECK(std::string(gone.what()).find("the group has been destroyed") != std::string::npos,
               "{}", gone.what());
  });
}

TEST_CASE("then() continues a collective's Work on completion; get_future() waits for it",
          "[c10d][then]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int rank) {
    auto pg = join(port, rank, 3);
    std::vector<double> v(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = double(rank) + 0.5 * double(i);
    // The callback halves the sum in place, after the all_reduce and before `done` completes.
    auto done = pg->all_reduce(Tensor::of(v.data(), v.size()))->then([&](const Work& w) {
      w.wait();
      for (double& x : v) x /= 2;
    });
    done->wait();
    for (size_t i = 0; i < v.size(); ++i) {
      const double expected = (3.0 + 1.5 * double(i)) / 2;  // (0 + 1 + 2 + 3 * 0.5 i) / 2
      RANK_CHECK(v[i] == expected, "[{}] {} != {}", i, v[i], expected);
    }
    std::vector<int32_t> x(64, rank);
    pg->all_reduce(Tensor::of(x.data(), x.size()), ReduceOp::Max)->get_future().get();
    for (size_t i = 0; i < x.size(); ++i) RANK_CHECK(x[i] == 2, "max [{}] {}", i, x[i]);
  });
}

}  // namespace
}  // namespace weft
