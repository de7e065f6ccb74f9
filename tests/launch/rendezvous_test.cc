// rendezvous() end to end on real processes: tcp://, file://, env:// (torchrun and Slurm
// variables), torchrun's agent store, and the errors that name missing or duplicate ranks.
#include "weft/rendezvous.h"

#include <netdb.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/error.h"
#include "weft/tcp_store.h"
#include "weft/tcp_store_server.h"

#include "tests/support/multiproc.h"

namespace weft {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kRanks = 4;

// Each rank publishes rank*rank + 7 under its own key and checks every other rank's value; then
// all count themselves done, and rank 0 (which may host the store) leaves last.
void exchange(Rendezvous& rdzv) {
  Store& store = *rdzv.store;
  store.set(fmt::format("test/value/{}", rdzv.rank), std::to_string(rdzv.rank * rdzv.rank + 7));
  for (int r = 0; r < rdzv.world_size; ++r) {
    std::string value = store.get_string(fmt::format("test/value/{}", r));
    RANK_CHECK(value == std::to_string(r * r + 7), "rank {} read {} for rank {}", rdzv.rank, value,
               r);
  }
  if (store.add("test/done", 1) == rdzv.world_size) store.set("test/all_done", "1");
  if (rdzv.rank == 0) store.wait({"test/all_done"});
}

void check_identity(const Rendezvous& rdzv, int rank, int world_size) {
  RANK_CHECK(rdzv.rank == rank, "got rank {}", rdzv.rank);
  RANK_CHECK(rdzv.world_size == world_size, "got world size {}", rdzv.world_size);
  RANK_CHECK(rdzv.store != nullptr);
}

TcpStoreServerOptions loopback_server_options() {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  return options;
}

// torchrun's agent store: a TcpStoreServer in a child process of its own, forked while this
// process has no other thread, so that run_ranks() never forks a process whose store thread may
// hold a lock (a child of such a fork can deadlock in the allocator: seen once under ASan). The
// child serves until this object closes its end of the control pipe.
class AgentProcess {
 public:
  AgentProcess() {
    int port_pipe[2], control[2];
    REQUIRE(pipe(port_pipe) == 0);
    REQUIRE(pipe(control) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      close(port_pipe[0]);
      close(control[1]);
      int code = 0;
      try {
        TcpStoreServer server(loopback_server_options());
        uint16_t port = server.port();
        code = write(port_pipe[1], &port, sizeof port) == sizeof port ? 0 : 1;
        char byte;
        while (code == 0 && read(control[0], &byte, 1) > 0) {
        }
      } catch (const std::exception&) {
        code = 1;
      }
      _exit(code);
    }
    close(port_pipe[1]);
    close(control[0]);
    control_ = control[1];
    REQUIRE(read(port_pipe[0], &port_, sizeof port_) == sizeof port_);
    close(port_pipe[0]);
  }
  ~AgentProcess() {
    close(control_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;
  uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int control_ = -1;
  uint16_t port_ = 0;
};

TCPStoreOptions client_options(uint16_t port) {
  TCPStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = seconds(5);
  return options;
}

void set_env(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }

// Each rank starts from an environment without launcher variables, so that the tests pass when
// the test runner itself runs under torchrun, srun or mpirun.
void clear_launcher_env() {
  for (const char* name : {"RANK",
                           "WORLD_SIZE",
                           "LOCAL_RANK",
                           "LOCAL_WORLD_SIZE",
                           "MASTER_ADDR",
                           "MASTER_PORT",
                           "TORCHELASTIC_USE_AGENT_STORE",
                           "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_RUN_ID",
                           "WEFT_JOB_ID",
                           "SLURM_STEP_ID",
                           "SLURM_PROCID",
                           "SLURM_NTASKS",
                           "SLURM_LOCALID",
                           "SLURM_NODEID",
                           "SLURM_STEP_NODELIST",
                           "SLURM_JOB_NODELIST",
                           "SLURM_STEP_TASKS_PER_NODE",
                           "SLURM_TASKS_PER_NODE",
                           "SLURM_JOB_ID",
                           "SLURM_JOBID",
                           "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                           "OMPI_MCA_ess_base_jobid",
                           "PMIX_NAMESPACE"}) {
    unsetenv(name);
  }
}

// The message of the weft::Error that `call` throws, checked to have `code`.
template <typename Call>
std::string error_of(Call call, ErrorCode code) {
  try {
    call();
  } catch (const Error& e) {
    RANK_CHECK(e.code() == code, "code {} for: {}", error_code_name(e.code()), e.what());
    return e.what();
  }
  RANK_CHECK(false, "no error thrown");
  return "";
}

TEST_CASE("tcp:// rendezvous on 4 processes: rank 0 hosts on loopback, all exchange values",
          "[launch][rendezvous][multiproc]") {
  uint16_t port = test::free_port();
  test::run_ranks_ok(kRanks, [port](int rank) {
    clear_launcher_env();
    Rendezvous rdzv = rendezvous(
        {.url = fmt::format("tcp://127.0.0.1:{}?rank={}&world_size={}", port, rank, kRanks),
         .timeout = seconds(20)});
    check_identity(rdzv, rank, kRanks);
    RANK_CHECK((rdzv.server != nullptr) == (rank == 0), "hosting the store on rank {}", rank);
    if (rank == 0) {
      RANK_CHECK(rdzv.server->host() == "127.0.0.1", "bound {}", rdzv.server->host());
      RANK_CHECK(rdzv.server->port() == port);
    }
    RANK_CHECK(rdzv.store->timeout() == seconds(20));
    exchange(rdzv);
  });
}

TEST_CASE("rank and world size may come from the options instead of the URL",
          "[launch][rendezvous][multiproc]") {
  uint16_t port = test::free_port();
  test::run_ranks_ok(2, [port](int rank) {
    clear_launcher_env();
    Rendezvous rdzv = rendezvous({.url = fmt::format("tcp://localhost:{}", port),
                                  .rank = rank,
                                  .world_size = 2,
                                  .timeout = seconds(20)});
    check_identity(rdzv, rank, 2);
    exchange(rdzv);
  });
}

TEST_CASE("file:// rendezvous on 4 processes shares one FileStore",
          "[launch][rendezvous][multiproc]") {
  char dir_template[] = "/tmp/weft-rdzv-XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  std::string path = std::string(dir_template) + "/store";
  test::run_ranks_ok(kRanks, [&path](int rank) {
    clear_launcher_env();
    Rendezvous rdzv =
        rendezvous({.url = fmt::format("file://{}?rank={}&world_size={}", path, rank, kRanks),
                    .timeout = seconds(20)});
    check_identity(rdzv, rank, kRanks);
    RANK_CHECK(rdzv.server == nullptr);
    exchange(rdzv);
  });
  std::filesystem::remove_all(dir_template);
}

TEST_CASE("env:// with torchrun variables on 4 processes: rank 0 hosts, local ranks are read",
          "[launch][rendezvous][multiproc]") {
  uint16_t port = test::free_port();
  test::run_ranks_ok(kRanks, [port](int rank) {
    clear_launcher_env();
    set_env("RANK", std::to_string(rank));
    set_env("WORLD_SIZE", std::to_string(kRanks));
    set_env("LOCAL_RANK", std::to_string(rank % 2));
    set_env("LOCAL_WORLD_SIZE", "2");
    set_env("MASTER_ADDR", "127.0.0.1");
    set_env("MASTER_PORT", std::to_string(port));
    set_env("WEFT_TIMEOUT", "20");
    Rendezvous rdzv = rendezvous();
    check_identity(rdzv, rank, kRanks);
    RANK_CHECK(rdzv.local_rank == rank % 2, "local rank {}", rdzv.local_rank);
    RANK_CHECK(rdzv.local_world_size == 2);
    RANK_CHECK((rdzv.server != nullptr) == (rank == 0));
    exchange(rdzv);
  });
}

TEST_CASE("env:// with Slurm variables on one node rendezvouses on loopback",
          "[launch][rendezvous][multiproc]") {
  uint16_t port = test::free_port();
  test::run_ranks_ok(3, [port](int rank) {
    clear_launcher_env();
    set_env("SLURM_PROCID", std::to_string(rank));
    set_env("SLURM_NTASKS", "3");
    set_env("SLURM_LOCALID", std::to_string(rank));
    set_env("SLURM_NODEID", "0");
    set_env("SLURM_JOB_NODELIST", "node[007]");
    set_env("SLURM_TASKS_PER_NODE", "3");
    set_env("SLURM_JOB_ID", "4242");
    // The derived port (14242) could be taken on a shared machine; MASTER_PORT overrides it.
    set_env("MASTER_PORT", std::to_string(port));
    Rendezvous rdzv = rendezvous({.timeout = seconds(20)});
    check_identity(rdzv, rank, 3);
    RANK_CHECK(rdzv.local_world_size == 3);
    if (rank == 0) RANK_CHECK(rdzv.server->host() == "127.0.0.1", "{}", rdzv.server->host());
    exchange(rdzv);
  });
}

TEST_CASE("env:// with Open MPI variables on one host rendezvouses on loopback",
          "[launch][rendezvous][multiproc]") {
  uint16_t port = test::free_port();
  test::run_ranks_ok(3, [port](int rank) {
    clear_launcher_env();
    set_env("OMPI_COMM_WORLD_RANK", std::to_string(rank));
    set_env("OMPI_COMM_WORLD_SIZE", "3");
    set_env("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank));
    set_env("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
    set_env("OMPI_MCA_ess_base_jobid", "3735814145");
    set_env("MASTER_PORT", std::to_string(port));
    Rendezvous rdzv = rendezvous({.timeout = seconds(20)});
    check_identity(rdzv, rank, 3);
    RANK_CHECK(rdzv.local_rank == rank && rdzv.local_world_size == 3);
    if (rank == 0) RANK_CHECK(rdzv.server->host() == "127.0.0.1", "{}", rdzv.server->host());
    exchange(rdzv);
  });
}

// A server started by the test plays torchrun's agent: with TORCHELASTIC_USE_AGENT_STORE=True no
// rank binds the port (rank 0 would fail with Io: the test's server holds it).
TEST_CASE("under torchrun's agent store every rank, rank 0 included, connects as a client",
          "[launch][rendezvous][multiproc]") {
  AgentProcess agent;
  uint16_t port = agent.port();
  test::run_ranks_ok(kRanks, [port](int rank) {
    clear_launcher_env();
    set_env("RANK", std::to_string(rank));
    set_env("WORLD_SIZE", std::to_string(kRanks));
    set_env("MASTER_ADDR", "127.0.0.1");
    set_env("MASTER_PORT", std::to_string(port));
    set_env("TORCHELASTIC_USE_AGENT_STORE", "True");
    Rendezvous rdzv = rendezvous({.timeout = seconds(20)});
    check_identity(rdzv, rank, kRanks);
    RANK_CHECK(rdzv.server == nullptr, "rank {} hosted a store", rank);
    exchange(rdzv);
  });
  TCPStore client(client_options(port));
  for (int r = 0; r < kRanks; ++r) {
    CHECK(client.get_string(fmt::format("test/value/{}", r)) == std::to_string(r * r + 7));
  }
}

TEST_CASE("under a launcher, a tcp:// store at another port than MASTER_PORT is hosted by rank 0",
          "[launch][rendezvous][multiproc]") {
  // The launcher's agent hosts MASTER_PORT only; a second world at a port of the program's own
  // (the conformance suite's, weft.torch's) must be hosted by its rank 0, not waited for.
  AgentProcess agent;
  const uint16_t own_port = test::free_port();
  test::run_ranks_ok(2, [&](int rank) {
    clear_launcher_env();
    set_env("MASTER_ADDR", "127.0.0.1");
    set_env("MASTER_PORT", std::to_string(agent.port()));
    set_env("TORCHELASTIC_USE_AGENT_STORE", "True");
    Rendezvous rdzv =
        rendezvous({.url = fmt::format("tcp://127.0.0.1:{}?rank={}&world_size=2", own_port, rank),
                    .timeout = seconds(20)});
    RANK_CHECK((rdzv.server != nullptr) == (rank == 0), "rank {}: server {}", rank,
               rdzv.server != nullptr);
    exchange(rdzv);
  });
}

TEST_CASE("a rendezvous missing a rank times out naming how many arrived and which are missing",
          "[launch][rendezvous][multiproc]") {
  // The store outlives the ranks so that each can still inspect it when its wait times out.
  AgentProcess agent;
  uint16_t port = agent.port();
  test::run_ranks_ok(2, [port](int rank) {
    clear_launcher_env();
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    std::string message = error_of(
        [&] {
          rendezvous({.url = fmt::format("tcp://127.0.0.1:{}?rank={}&world_size=4", port,
                                         rank == 0 ? 0 : 2),
                      .timeout = milliseconds(1500)});
        },
        ErrorCode::Timeout);
    RANK_CHECK(message.find("2/4 ranks arrived; missing rank(s) 1, 3") != std::string::npos,
               "message: {}", message);
    RANK_CHECK(message.find("rendezvous tcp://127.0.0.1:") != std::string::npos, "{}", message);
  });
}

TEST_CASE("two processes claiming one rank are refused naming the first claimant",
          "[launch][rendezvous][multiproc]") {
  AgentProcess agent;
  uint16_t port = agent.port();
  std::string url = fmt::format("tcp://127.0.0.1:{}?rank=1&world_size=2", port);
  // The first claimant waits for rank 0, which never comes; the second, started once the first
  // has claimed, is refused at once.
  test::run_ranks_ok(2, [&](int process) {
    clear_launcher_env();
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    if (process == 1) {
      TCPStore client(client_options(port));
      client.wait({"weft/rendezvous/0/rank/1"}, seconds(10));
    }
    std::string message = error_of([&] { rendezvous({.url = url, .timeout = seconds(1)}); },
                                   process == 0 ? ErrorCode::Timeout : ErrorCode::InvalidArgument);
    if (process == 1) {
      RANK_CHECK(message.find("rank 1 was already claimed by") != std::string::npos, "{}", message);
    }
  });
}

// Issue 21: a rank of job B, started by mistake on job A's store address while A's rank 1 is
// still starting, took rank 1 and ran with A's rank 0. Now it is refused, claims nothing, and A's
// real rank 1 joins.
TEST_CASE("a rank of another job is refused naming both job ids, and the job's own rank joins",
          "[launch][rendezvous][multiproc]") {
  AgentProcess agent;
  uint16_t port = agent.port();
  test::run_ranks_ok(3, [port](int process) {
    clear_launcher_env();
    const int rank = process == 0 ? 0 : 1;
    set_env("RANK", std::to_string(rank));
    set_env("WORLD_SIZE", "2");
    set_env("MASTER_ADDR", "127.0.0.1");
    set_env("MASTER_PORT", std::to_string(port));
    set_env("TORCHELASTIC_USE_AGENT_STORE", "True");
    set_env("TORCHELASTIC_RUN_ID", process == 1 ? "job-b" : "job-a");
    TCPStore client(client_options(port));
    if (process == 1) {
      client.wait({"weft/rendezvous/0/job"}, seconds(20));
      std::string message =
          error_of([] { rendezvous({.timeout = seconds(20)}); }, ErrorCode::InvalidArgument);
      RANK_CHECK(message.find("this process is of job TORCHELASTIC_RUN_ID=job-b but the store "
                              "belongs to job TORCHELASTIC_RUN_ID=job-a") != std::string::npos,
                 "{}", message);
      RANK_CHECK(!client.check({"weft/rendezvous/0/rank/1"}), "job b's rank claimed rank 1");
      client.set("test/refused", "1");
      return;
    }
    if (process == 2) client.wait({"test/refused"}, seconds(20));
    Rendezvous rdzv = rendezvous({.timeout = seconds(20)});
    check_identity(rdzv, rank, 2);
    exchange(rdzv);
  });
}

// Issue 18: a rank of another weft release, or with settings that change the wire, is refused at
// rendezvous, and so is every rank of its job, each naming both sides. Rank 0 joins first (the
// others wait for its claim), so it is the one compared with.
//
// Each rank runs in a fresh process (this program, exec'd on the hidden case below): WEFT_DEBUG
// reaches rendezvous through config(), which a process reads once, and a forked child keeps what
// its parent read.
void refused_by_mismatch(int odd_rank, const char* variable, const char* value,
                         const std::string& words) {
  AgentProcess agent;
  uint16_t port = agent.port();
  test::run_ranks_ok(3, [&](int rank) {
    clear_launcher_env();
    if (rank == odd_rank) setenv(variable, value, 1);
    set_env("WEFT_TEST_RDZV_PORT", std::to_string(port));
    set_env("WEFT_TEST_RDZV_RANK", std::to_string(rank));
    set_env("WEFT_TEST_RDZV_WORDS", words);
    set_env("WEFT_TEST_RDZV_ODD", rank == odd_rank ? "1" : "0");
    execl("/proc/self/exe", "rendezvous_test", "one rank of a mismatched rendezvous*", nullptr);
    RANK_CHECK(false, "exec: {}", std::strerror(errno));
  });
}

TEST_CASE("one rank of a mismatched rendezvous run in a fresh process by the cases below",
          "[.][rendezvous_rank]") {
  const int port = std::atoi(std::getenv("WEFT_TEST_RDZV_PORT"));
  const int rank = std::atoi(std::getenv("WEFT_TEST_RDZV_RANK"));
  const std::string words = std::getenv("WEFT_TEST_RDZV_WORDS");
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  if (rank != 0) {
    TCPStore client(client_options(static_cast<uint16_t>(port)));
    client.wait({"weft/rendezvous/0/rank/0"}, seconds(20));
  }
  const std::string url = fmt::format("tcp://127.0.0.1:{}?rank={}&world_size=3", port, rank);
  try {
    rendezvous({.url = url, .timeout = seconds(20)});
    FAIL("rank " << rank << " was not refused");
  } catch (const Error& e) {
    INFO("rank " << rank << ": " << e.what());
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("rendezvous " + url));
    CHECK_THAT(e.what(), Catch::Contains(words));
    if (std::string(std::getenv("WEFT_TEST_RDZV_ODD")) != "1") {
      CHECK_THAT(e.what(), Catch::Contains("the job was refused at rendezvous: "));
    }
  }
}

TEST_CASE("a rank of another weft version is refused at rendezvous, with every rank, naming both",
          "[launch][rendezvous][multiproc]") {
  refused_by_mismatch(2, "WEFT_TEST_FAKE_VERSION", "0.0.9",
                      "rank 2 runs weft 0.0.9 but rank 0 (the first to join) runs weft " +
                          std::string(WEFT_TEST_VERSION) + ": every rank of a job must run");
}

TEST_CASE("a rank whose WEFT_DEBUG differs is refused at rendezvous, with every rank, naming both",
          "[launch][rendezvous][multiproc]") {
  refused_by_mismatch(1, "WEFT_DEBUG", "detail",
                      "rank 1 has WEFT_DEBUG=detail but rank 0 (the first to join) has "
                      "WEFT_DEBUG=off");
}

TEST_CASE("a rank whose store quits during rendezvous says so, naming the store",
          "[launch][rendezvous][multiproc]") {
  uint16_t port = test::free_port();
  test::run_ranks_ok(2, [port](int process) {
    clear_launcher_env();
    if (process == 0) {
      // The store's host: serves until rank 1 of 2 has claimed its rank, then quits.
      TcpStoreServerOptions options = loopback_server_options();
      options.port = port;
      TcpStoreServer server(options);
      TCPStore client(client_options(port));
      client.wait({"weft/rendezvous/0/rank/1"}, seconds(20));
      return;
    }
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    try {
      rendezvous({.url = fmt::format("tcp://127.0.0.1:{}?rank=1&world_size=2", port),
                  .timeout = seconds(20)});
      RANK_CHECK(false, "rendezvous completed without rank 0");
    } catch (const Error& e) {
      std::string message = e.what();
      RANK_CHECK(e.code() == ErrorCode::PeerLost || e.code() == ErrorCode::Io, "{}", message);
      RANK_CHECK(message.find("lost the store during rendezvous (its host, the launcher, quit") !=
                     std::string::npos,
                 "{}", message);
      RANK_CHECK(message.find(fmt::format("store 127.0.0.1:{})", port)) != std::string::npos, "{}",
                 message);
    }
  });
}

TEST_CASE("a store host name that does not resolve fails at once, saying so",
          "[launch][rendezvous]") {
  clear_launcher_env();
  // RFC 6761 keeps .invalid out of DNS; a resolver that cannot be reached answers EAI_AGAIN,
  // which is rightly retried, so the check needs one that answers.
  addrinfo* list = nullptr;
  int rc = getaddrinfo("weft-test.invalid", "1", nullptr, &list);
  if (list != nullptr) freeaddrinfo(list);
  if (rc != EAI_NONAME) {
    WARN("the resolver did not answer EAI_NONAME for weft-test.invalid (" << gai_strerror(rc)
                                                                          << "): not checked");
    return;
  }
  auto start = std::chrono::steady_clock::now();
  try {
    rendezvous(
        {.url = "tcp://weft-test.invalid:29400?rank=1&world_size=2", .timeout = seconds(30)});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("the host \"weft-test.invalid\" does not resolve"));
    CHECK_THAT(e.what(), !Catch::Contains("did that start?"));
  }
  CHECK(std::chrono::steady_clock::now() - start < seconds(10));
}

TEST_CASE("a rank that cannot reach the store fails with Timeout naming who should host it",
          "[launch][rendezvous]") {
  clear_launcher_env();
  uint16_t port = test::free_port();
  try {
    rendezvous({.url = fmt::format("tcp://127.0.0.1:{}?rank=1&world_size=2", port),
                .timeout = milliseconds(300)});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Timeout);
    CHECK_THAT(e.what(),
               Catch::Contains(fmt::format("store 127.0.0.1:{}): cannot reach the store", port)));
    CHECK_THAT(e.what(), Catch::Contains("hosted by rank 0"));
  }
}

TEST_CASE("rank 0 fails with Io naming the address when the store's port is taken",
          "[launch][rendezvous]") {
  clear_launcher_env();
  TcpStoreServer holder(loopback_server_options());
  try {
    rendezvous({.url = fmt::format("tcp://127.0.0.1:{}?rank=0&world_size=2", holder.port()),
                .timeout = seconds(5)});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::Contains("rank 0 cannot host the store"));
    CHECK_THAT(e.what(), Catch::Contains(std::to_string(holder.port())));
    CHECK_THAT(e.what(), Catch::Contains("is the port in use? set MASTER_PORT"));
  }
}

// Under mpirun across hosts, MASTER_ADDR naming a host other than rank 0's used to read "is the
// port in use? set MASTER_PORT", which sends the user after the wrong variable.
TEST_CASE("rank 0 whose MASTER_ADDR is another host's fails naming the address, not the port",
          "[launch][rendezvous]") {
  clear_launcher_env();
  // 192.0.2.1 is TEST-NET-1 (RFC 5737): never a local address, unless the kernel lets any
  // address be bound.
  std::ifstream nonlocal("/proc/sys/net/ipv4/ip_nonlocal_bind");
  int any_address = 0;
  if (nonlocal >> any_address && any_address != 0) {
    WARN("net.ipv4.ip_nonlocal_bind is on: every address is bindable here; nothing to check");
    return;
  }
  // Rank 0 of 4 ranks on two hosts, as mpirun --host a:2,b:2 -x MASTER_ADDR=... starts it.
  set_env("OMPI_COMM_WORLD_RANK", "0");
  set_env("OMPI_COMM_WORLD_SIZE", "4");
  set_env("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  set_env("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  set_env("MASTER_ADDR", "192.0.2.1");
  set_env("MASTER_PORT", std::to_string(test::free_port()));
  std::string message = error_of([] { rendezvous({.timeout = seconds(5)}); }, ErrorCode::Io);
  clear_launcher_env();
  CHECK_THAT(message, Catch::Contains("rank 0 cannot host the store"));
  CHECK_THAT(message, Catch::Contains("192.0.2.1 is not an address of this host"));
  CHECK_THAT(message, Catch::Contains("set MASTER_ADDR to rank 0's host"));
  CHECK_THAT(message, !Catch::Contains("set MASTER_PORT"));
}

TEST_CASE("rendezvous refuses bad URLs and missing ranks before touching the network",
          "[launch][rendezvous]") {
  clear_launcher_env();
  auto message = [](RendezvousOptions options) {
    try {
      rendezvous(options);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      return std::string(e.what());
    }
    FAIL("no error");
    return std::string();
  };
  CHECK_THAT(message({.url = "tcp://127.0.0.1:1"}), Catch::Contains("rank and world_size"));
  CHECK_THAT(message({.url = "udp://x:1"}), Catch::Contains("unknown scheme"));
  CHECK_THAT(message({.url = "tcp://127.0.0.1:1?rank=1&world_size=2", .rank = 0}),
             Catch::Contains("the URL says rank=1 but the options say 0"));
  CHECK_THAT(message({.url = "tcp://127.0.0.1:1", .rank = 3, .world_size = 2}),
             Catch::Contains("rank 3 is out of range for world size 2"));
}

}  // namespace
}  // namespace weft
