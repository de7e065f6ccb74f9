// ProcessGroup end to end on real processes over the tcp backend (or WEFT_TEST_BACKEND's): the
// API's shape (async Work, issue order, sub-groups, coalescing, abort, destroy) rather than every
// collective x dtype, which tests/conformance covers.
#include "weft/process_group.h"

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/tcp_store.h"
#include "weft/tcp_store_server.h"

#include "tests/support/multiproc.h"

namespace weft {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The backend under test: WEFT_TEST_BACKEND (meson runs this file over ucx too), default tcp.
std::string backend_under_test() {
  const char* value = std::getenv("WEFT_TEST_BACKEND");
  return value && *value ? value : "tcp";
}

std::shared_ptr<ProcessGroup> join(uint16_t port, int rank, int size,
                                   std::map<std::string, std::string> settings = {}) {
  ProcessGroupOptions options;
  options.backend = backend_under_test();
  options.url = fmt::format("tcp://127.0.0.1:{}", port);
  options.rank = rank;
  options.world_size = size;
  options.timeout = seconds(20);
  options.backend_settings = std::move(settings);
  return init_process_group(options);
}

TEST_CASE("process group: all_reduce on 4 ranks, async, in issue order", "[process_group]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(4, [&](int rank) {
    auto pg = join(port, rank, 4);
    RANK_CHECK(pg->rank() == rank && pg->size() == 4);
    RANK_CHECK(pg->backend_name() == backend_under_test(), "{}", pg->backend_name());
    std::vector<std::vector<float>> buffers(5, std::vector<float>(1000));
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 5; ++i) {
      for (size_t j = 0; j < 1000; ++j) buffers[i][j] = float(rank * 1000 + j + i);
      works.push_back(pg->all_reduce(Tensor::of(buffers[i].data(), 1000)));
    }
    wait_all(works);
    for (int i = 0; i < 5; ++i) {
      for (size_t j = 0; j < 1000; ++j) {
        float expected = float((0 + 1 + 2 + 3) * 1000 + 4 * (j + i));
        RANK_CHECK(buffers[i][j] == expected, "i {} j {}: {} != {}", i, j, buffers[i][j], expected);
      }
    }
    RANK_CHECK(pg->sequence_number() == 5);
  });
}

TEST_CASE("process group: large sends still complete while their receiver is in a small collective",
          "[process_group]") {
  // Rank 0 sends two 8 MiB messages with one tag, then all_reduces 8 bytes; rank 1 all_reduces
  // first, then receives both (the second from any source). Each group runs its calls in issue
  // order, so rank 0's sends must finish (their data taken from it) while rank 1 waits in the
  // small all_reduce: a wait that moved no messages (the shared-slot barrier, one host; a UCX
  // rendezvous left with its sender) would hold both until the timeout. The two messages must
  // still arrive in the order they were sent.
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2);
    const size_t n = size_t{2} << 20;
    std::vector<float> first(n), second(n);
    float small = static_cast<float>(rank + 1);
    const auto start = std::chrono::steady_clock::now();
    if (rank == 0) {
      for (size_t i = 0; i < n; ++i) {
        first[i] = static_cast<float>(i % 977);
        second[i] = static_cast<float>(i % 991) + 0.5f;
      }
      auto one = pg->send(Tensor::of(first.data(), n), 1, 7);
      auto two = pg->send(Tensor::of(second.data(), n), 1, 7);
      pg->all_reduce(Tensor::of(&small, 1))->wait();
      one->wait();
      two->wait();
    } else {
      pg->all_reduce(Tensor::of(&small, 1))->wait();
      pg->recv(Tensor::of(first.data(), n), 0, 7)->wait();
      auto any = pg->recv_any(Tensor::of(second.data(), n), 7);
      any->wait();
      RANK_CHECK(any->source_rank() == 0, "recv_any names rank {}", any->source_rank());
      for (size_t i = 0; i < n; ++i) {
        RANK_CHECK(first[i] == static_cast<float>(i % 977), "first, element {}: {}", i, first[i]);
        RANK_CHECK(second[i] == static_cast<float>(i % 991) + 0.5f, "second, element {}: {}", i,
                   second[i]);
      }
    }
    RANK_CHECK(small == 3.0f, "all_reduce gave {}", small);
    const auto took = std::chrono::steady_clock::now() - start;
    RANK_CHECK(took < seconds(5), "took {} ms", took / std::chrono::milliseconds(1));
    pg->barrier()->wait();  // rank 0 stays until rank 1 has both messages
  });
}

TEST_CASE("process group: sub-groups by new_group and split, used concurrently",
          "[process_group]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(4, [&](int rank) {
    auto pg = join(port, rank, 4);
    auto evens = pg->new_group({0, 2});
    auto halves = pg->split(rank / 2, -rank);  // key reverses the order within a half
    auto single = pg->new_group({rank == 3 ? 3 : 0});
    RANK_CHECK((evens != nullptr) == (rank % 2 == 0));
    RANK_CHECK(halves && halves->size() == 2);
    RANK_CHECK(halves->rank() == 1 - rank % 2, "{}", halves->rank());
    int64_t a = rank + 1, b = rank + 1;
    auto w1 = halves->all_reduce(Tensor::of(&a, 1));
    std::shared_ptr<Work> w2;
    if (evens) w2 = evens->all_reduce(Tensor::of(&b, 1));
    w1->wait();
    if (w2) w2->wait();
    const int64_t half_sum = rank < 2 ? 1 + 2 : 3 + 4;
    RANK_CHECK(a == half_sum, "{}", a);
    if (evens) RANK_CHECK(b == 1 + 3, "{}", b);
    if (single) {
      RANK_CHECK(single->size() == 1);
      double x = 2.5;
      single->all_reduce(Tensor::of(&x, 1), ReduceOp::Avg)->wait();
      RANK_CHECK(x == 2.5);
    }
    auto none = pg->split(rank == 0 ? -1 : 7, 0);
    RANK_CHECK((none == nullptr) == (rank == 0));
    if (none) {
      RANK_CHECK(none->size() == 3 && none->rank() == rank - 1);
      none->barrier()->wait();
    }
    pg->barrier()->wait();  // rank 0 hosts the store: it stays until everyone is done with it
  });
}

TEST_CASE("process group: argument errors name the argument", "[process_group]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2);
    std::vector<float> x(4), y(3);
    auto message = [](auto&& call) -> std::string {
      try {
        call();
      } catch (const Error& e) {
        RANK_CHECK(e.code() == ErrorCode::InvalidArgument, "{}", e.what());
        return e.what();
      }
      return "no error";
    };
    std::string m =
        message([&] { pg->all_reduce(Tensor::of(x.data(), 4), Tensor::of(y.data(), 3)); });
    RANK_CHECK(m.find("output has 3 elements; expected 4") != std::string::npos, "{}", m);
    m = message([&] { pg->broadcast(Tensor::of(x.data(), 4), 2); });
    RANK_CHECK(m.find("root 2 is out of range") != std::string::npos, "{}", m);
    m = message([&] { pg->all_reduce(Tensor::of(x.data(), 4), ReduceOp::BXor); });
    RANK_CHECK(m.find("cannot reduce float32") != std::string::npos, "{}", m);
    RANK_CHECK(m.find("rank " + std::to_string(rank) + "/2 group \"world\" all_reduce #1") !=
                   std::string::npos,
               "{}", m);
    // Byte sizes that overflow size_t: once they wrapped into a few bytes and "succeeded".
    Tensor huge{x.data(), (size_t{1} << 62) + 4, DType::Float32, Device{}};
    m = message([&] { pg->broadcast(huge, 0); });
    RANK_CHECK(m.find("tensor has 4611686018427387908 elements of float32") != std::string::npos &&
                   m.find("overflows size_t") != std::string::npos,
               "{}", m);
    m = message([&] { pg->send(huge, 1 - rank); });
    RANK_CHECK(m.find("overflows size_t") != std::string::npos, "{}", m);
    m = message([&] {
      pg->all_gather_uneven(Tensor::of(x.data(), 1), Tensor::of(x.data(), 1),
                            {rank == 0 ? 1 : SIZE_MAX, rank == 0 ? SIZE_MAX : 1});
    });
    RANK_CHECK(m.find("the sum of counts") != std::string::npos, "{}", m);
    m = message([&] { static_cast<void>(huge.nbytes()); });
    RANK_CHECK(m.find("Tensor::nbytes") != std::string::npos, "{}", m);
    // Nothing was issued: the group still works.
    pg->barrier()->wait();
    RANK_CHECK(pg->sequence_number() == 1);
  });
}

TEST_CASE("process group: coalesced all_reduces complete together", "[process_group]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(3, [&](int rank) {
    auto pg = join(port, rank, 3);
    std::vector<int32_t> a(10, rank), b(7, 2 * rank);
    pg->start_coalescing();
    auto wa = pg->all_reduce(Tensor::of(a.data(), a.size()));
    auto wb = pg->all_reduce(Tensor::of(b.data(), b.size()), ReduceOp::Max);
    auto all = pg->end_coalescing();
    all->wait();
    RANK_CHECK(wa->is_completed() && wb->is_completed());
    for (int32_t v : a) RANK_CHECK(v == 0 + 1 + 2);
    for (int32_t v : b) RANK_CHECK(v == 4);
  });
}

// Element i of rank r's message number k: never equal across (r, k).
int32_t any_value(int r, int k, size_t i) { return r * 100'000'000 + k * 10'000'000 + int32_t(i); }

TEST_CASE("process group: recv_any takes every rank's message once and names its sender",
          "[process_group][recv_any]") {
  // Shared memory between the ranks, and TCP between them; small messages and 4 MiB ones (the
  // shared-memory transport reads those straight from the sender's buffer).
  for (const char* shm : {"1", "0"}) {
    for (size_t n : {size_t{3}, size_t{1} << 20}) {
      DYNAMIC_SECTION("shm " << shm << ", " << n << " elements") {
        const uint16_t port = test::free_port();
        test::run_ranks_ok(4, [&](int rank) {
          auto pg = join(port, rank, 4, {{"shm", shm}});
          if (rank != 0) {
            std::vector<int32_t> mine(n);
            for (int k = 0; k < 2; ++k) {
              for (size_t i = 0; i < n; ++i) mine[i] = any_value(rank, k, i);
              pg->send(Tensor::of(mine.data(), n), 0, 7)->wait();
            }
            pg->barrier()->wait();
            return;
          }
          // Six messages, two from each of ranks 1..3: each taken once, the two from one rank
          // in the order it sent them, each with its sender named.
          std::vector<std::vector<int32_t>> got(6, std::vector<int32_t>(n, -1));
          std::vector<std::shared_ptr<Work>> works;
          for (auto& g : got) works.push_back(pg->recv_any(Tensor::of(g.data(), n), 7));
          wait_all(works);
          std::vector<int> seen(4, 0);
          for (size_t m = 0; m < got.size(); ++m) {
            const int source = works[m]->source_rank();
            RANK_CHECK(source >= 1 && source <= 3, "message {}: source_rank() {}", m, source);
            const int k = seen[source]++;
            RANK_CHECK(k < 2, "message {}: a third message from rank {}", m, source);
            for (size_t i = 0; i < n; ++i) {
              RANK_CHECK(got[m][i] == any_value(source, k, i),
                         "message {} (from rank {}, its #{}) [{}]: {}, expected {}", m, source, k,
                         i, got[m][i], any_value(source, k, i));
            }
          }
          pg->barrier()->wait();
        });
      }
    }
  }
}

TEST_CASE(
    "process group: large messages with one tag, in flight at once, arrive whole and in order",
    "[process_group][recv_any]") {
  // Over UCX, messages from 512 KiB on travel as a header and pieces: the pieces of message k must
  // land in receive k, whatever receive (from a named rank or from any rank) takes the header.
  // Sizes straddle the piece size, and one is not a multiple of 4 KiB.
  const uint16_t port = test::free_port();
  const std::vector<size_t> counts = {size_t{1} << 17, (size_t{3} << 18) + 5, size_t{1} << 22,
                                      size_t{1} << 17};
  test::run_ranks_ok(3, [&](int rank) {
    auto pg = join(port, rank, 3);
    if (rank != 0) {
      std::vector<std::vector<int32_t>> mine(counts.size());
      std::vector<std::shared_ptr<Work>> works;
      for (size_t k = 0; k < counts.size(); ++k) {
        mine[k].resize(counts[k]);
        for (size_t i = 0; i < counts[k]; ++i) mine[k][i] = any_value(rank, int(k), i);
        works.push_back(pg->send(Tensor::of(mine[k].data(), counts[k]), 0, 9));
      }
      wait_all(works);
      pg->barrier()->wait();
      return;
    }
    // Rank 2's messages by name, rank 1's from any source (only rank 1 sends with tag 9 there:
    // rank 2's are taken by the named receives, posted first).
    std::vector<std::vector<int32_t>> named(counts.size()), any(counts.size());
    std::vector<std::shared_ptr<Work>> works;
    for (size_t k = 0; k < counts.size(); ++k) {
      named[k].assign(counts[k], -1);
      works.push_back(pg->recv(Tensor::of(named[k].data(), counts[k]), 2, 9));
    }
    for (size_t k = 0; k < counts.size(); ++k) {
      any[k].assign(counts[k], -1);
      works.push_back(pg->recv_any(Tensor::of(any[k].data(), counts[k]), 9));
    }
    wait_all(works);
    for (size_t k = 0; k < counts.size(); ++k) {
      RANK_CHECK(works[counts.size() + k]->source_rank() == 1, "any #{}: source {}", k,
                 works[counts.size() + k]->source_rank());
      for (size_t i = 0; i < counts[k]; ++i) {
        RANK_CHECK(named[k][i] == any_value(2, int(k), i), "named #{} [{}]: {}, expected {}", k, i,
                   named[k][i], any_value(2, int(k), i));
        RANK_CHECK(any[k][i] == any_value(1, int(k), i), "any #{} [{}]: {}, expected {}", k, i,
                   any[k][i], any_value(1, int(k), i));
      }
    }
    pg->barrier()->wait();
  });
}

TEST_CASE("process group: a large message of another size fails the receive, naming both sizes",
          "[process_group]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2);
    std::vector<int32_t> x(size_t{1} << 20, rank);
    if (rank == 1) {
      auto w = pg->send(Tensor::of(x.data(), size_t{3} << 18), 0, 5);  // 3 MiB
      try {
        w->wait();  // may complete, or fail when rank 0's group breaks
      } catch (const Error&) {
      }
      return;
    }
    auto w = pg->recv(Tensor::of(x.data(), x.size()), 1, 5);  // 4 MiB
    try {
      w->wait();
      RANK_CHECK(false, "a 3 MiB message was taken by a 4 MiB receive");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::Protocol, "{}", e.what());
      RANK_CHECK(std::string(e.what()).find("rank 1 sent 3145728 bytes") != std::string::npos &&
                     std::string(e.what()).find("expects 4194304 bytes") != std::string::npos,
                 "{}", e.what());
    }
  });
}

TEST_CASE("process group: recv_any refuses what it cannot do, and a wrong size is an error",
          "[process_group][recv_any]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    auto pg = join(port, rank, 2);
    std::vector<int32_t> x(20, rank);
    auto error_of = [](auto&& call) -> Error {
      try {
        call();
      } catch (const Error& e) {
        return e;
      }
      throw std::runtime_error("expected a weft::Error");
    };
    // Not inside a coalesced unit.
    pg->start_coalescing();
    Error e = error_of([&] { pg->recv_any(Tensor::of(x.data(), 20), 3); });
    RANK_CHECK(e.code() == ErrorCode::InvalidArgument, "{}", e.what());
    RANK_CHECK(
        std::string(e.what()).find("cannot be part of a coalesced unit") != std::string::npos, "{}",
        e.what());
    pg->end_coalescing()->wait();
    // A message of another size fails the receive, naming both sizes and the sender.
    if (rank == 1) {
      pg->send(Tensor::of(x.data(), 10), 0, 4)->wait();
    } else {
      auto w = pg->recv_any(Tensor::of(x.data(), 20), 4);
      e = error_of([&] { w->wait(); });
      RANK_CHECK(e.code() == ErrorCode::Protocol, "{}", e.what());
      RANK_CHECK(std::string(e.what()).find("rank 1 sent 40 bytes") != std::string::npos &&
                     std::string(e.what()).find("expects 80 bytes") != std::string::npos &&
                     std::string(e.what()).find("recv (int32 x 20, from any rank tag 4)") !=
                         std::string::npos,
                 "{}", e.what());
      RANK_CHECK(w->source_rank() == -1, "{}", w->source_rank());
    }
  });
  // A group of one has nobody to receive from.
  const uint16_t solo = test::free_port();
  test::run_ranks_ok(1, [&](int rank) {
    auto pg = join(solo, rank, 1);
    int32_t v = 0;
    try {
      pg->recv_any(Tensor::of(&v, 1), 0);
      RANK_CHECK(false, "recv_any on a group of one was accepted");
    } catch (const Error& e) {
      RANK_CHECK(e.code() == ErrorCode::InvalidArgument, "{}", e.what());
    }
  });
}

TEST_CASE("process group: abort fails pending work with Aborted in bounded time",
          "[process_group]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(
      2,
      [&](int rank) {
        auto pg = join(port, rank, 2);
        pg->barrier()->wait();
        if (rank == 1) {
          // Rank 0 never joins this all_reduce: it blocks until aborted.
          std::vector<float> x(1 << 16, 1.0f);
          auto work = pg->all_reduce(Tensor::of(x.data(), x.size()));
          auto later = pg->all_reduce(Tensor::of(x.data(), x.size()));
          std::thread aborter([&] {
            // Let the all_reduce start and block on rank 0, which never joins it.
            try {
              work->wait(milliseconds(200));
            } catch (const Error&) {
            }
            pg->abort("test abort");
          });
          auto start = std::chrono::steady_clock::now();
          try {
            work->wait();
            RANK_CHECK(false, "the all_reduce completed");
          } catch (const Error& e) {
            RANK_CHECK(e.code() == ErrorCode::Aborted, "{}", e.what());
          }
          try {
            later->wait();
            RANK_CHECK(false, "the second all_reduce completed");
          } catch (const Error& e) {
            RANK_CHECK(e.code() == ErrorCode::Aborted, "{}", e.what());
          }
          aborter.join();
          RANK_CHECK(std::chrono::steady_clock::now() - start < seconds(5));
          RANK_CHECK(pg->all_reduce(Tensor::of(x.data(), 1))->exception() != nullptr);
          TCPStore({.host = "127.0.0.1", .port = port}).set("rank 1 done", "yes");
        } else {
          // Stay alive (rank 0 hosts the store) until rank 1 is done, without joining its
          // all_reduce.
          TCPStore({.host = "127.0.0.1", .port = port}).get("rank 1 done", seconds(20));
        }
      },
      seconds(30));
}

// A TCPStore that tells a waiting thread when a blocking call starts (once armed).
class WatchedStore final : public TCPStore {
 public:
  using TCPStore::TCPStore;

  void arm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = true;
  }
  // Whether a blocking call started after arm(), within `timeout`.
  bool wait_for_blocking_call(milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return blocked_.wait_for(lock, timeout, [&] { return seen_; });
  }

  Bytes get(const std::string& key, milliseconds timeout) override {
    notify();
    return TCPStore::get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    notify();
    TCPStore::wait(keys, timeout);
  }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               milliseconds timeout) override {
    notify();
    return TCPStore::multi_get(keys, timeout);
  }

 private:
  void notify() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!armed_) return;
    seen_ = true;
    blocked_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable blocked_;
  bool armed_ = false;
  bool seen_ = false;
};

// new_group waits in the store for members that never come; an abort of the parent from another
// thread once left it there until the timeout.
TEST_CASE("process group: abort ends a new_group blocked on a missing member; later ones refuse",
          "[process_group]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(
      2,
      [&](int rank) {
        std::unique_ptr<TcpStoreServer> server;
        if (rank == 0)
          server = std::make_unique<TcpStoreServer>(TcpStoreServerOptions{.port = port});
        auto store =
            std::make_shared<WatchedStore>(TCPStoreOptions{.port = port, .timeout = seconds(20)});
        ProcessGroupOptions options;
        options.store = store;
        options.rank = rank;
        options.world_size = 2;
        options.timeout = seconds(20);
        auto pg = init_process_group(options);
        pg->barrier()->wait();
        if (rank == 1) {  // never calls new_group; stays until rank 0 is through
          store->get("rank 0 done", seconds(20));
          pg.reset();
          store->set("rank 1 done", "yes");
          return;
        }
        store->arm();
        std::thread aborter([&] {
          if (store->wait_for_blocking_call(seconds(20))) pg->abort("the test gives up on rank 1");
        });
        const auto start = std::chrono::steady_clock::now();
        std::string message = "new_group returned";
        try {
          pg->new_group({0, 1});
        } catch (const Error& e) {
          RANK_CHECK(e.code() == ErrorCode::Aborted, "{}", e.what());
          message = e.what();
        }
        aborter.join();
        const auto waited = std::chrono::steady_clock::now() - start;
        RANK_CHECK(message.find("stopped waiting: rank 0/2 group \"world\" was aborted: the test "
                                "gives up on rank 1") != std::string::npos,
                   "{}", message);
        RANK_CHECK(waited < seconds(5), "new_group returned after {} ms",
                   std::chrono::duration_cast<milliseconds>(waited).count());
        // On an aborted group, new_group refuses at once, as split does.
        for (int attempt = 0; attempt < 2; ++attempt) {
          try {
            if (attempt == 0) pg->new_group({0, 1});
            if (attempt == 1) pg->split(0, 0);
            RANK_CHECK(false, "attempt {} made a group", attempt);
          } catch (const Error& e) {
            RANK_CHECK(e.code() == ErrorCode::Aborted, "{}", e.what());
            RANK_CHECK(
                std::string(e.what()).find("the test gives up on rank 1") != std::string::npos,
                "{}", e.what());
          }
        }
        store->set("rank 0 done", "yes");
        store->get("rank 1 done", seconds(20));  // this rank hosts the store
      },
      seconds(40));
}

}  // namespace
}  // namespace weft
