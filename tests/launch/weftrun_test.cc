// weftrun end to end: real ranks of tests/launch/rank_program under the real launcher.
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/cpu_binding.h"
#include "tests/support/multiproc.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string tool_path(const char* variable) {
  const char* path = std::getenv(variable);
  if (path == nullptr) FAIL(variable << " is not set (meson sets it)");
  return path;
}

// weftrun started with stdout and stderr into one pipe. Killed (with its ranks, through their
// parent-death signal) if a test leaves it running.
class Weftrun {
 public:
  // `ignored`: signals weftrun starts with ignored, as a script's `&` leaves SIGINT.
  explicit Weftrun(std::vector<std::string> args, std::vector<int> ignored = {}) {
    args.insert(args.begin(), tool_path("WEFT_TEST_WEFTRUN"));
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      for (int sig : ignored) signal(sig, SIG_IGN);
      execv(argv[0], argv.data());
      _exit(126);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~Weftrun() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads until `text` has appeared `count` times, or fails the test at the deadline.
  void read_until(const std::string& text, int count, std::chrono::seconds deadline) {
    auto end = Clock::now() + deadline;
    while (occurrences(text) < count) {
      INFO(output_);
      REQUIRE(Clock::now() < end);
      REQUIRE(read_some(end));
    }
  }

  // Reads to end of file and reaps weftrun; returns its exit code (128+N for a signal N).
  int finish(std::chrono::seconds deadline = std::chrono::seconds(30)) {
    auto end = Clock::now() + deadline;
    while (read_some(end)) {
    }
    INFO(output_);
    REQUIRE(Clock::now() < end);
    int status = 0;
    REQUIRE(waitpid(pid_, &status, 0) == pid_);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  int occurrences(const std::string& text) const {
    int n = 0;
    for (size_t at = output_.find(text); at != std::string::npos; at = output_.find(text, at + 1)) {
      ++n;
    }
    return n;
  }
  // False at end of file or past the deadline.
  bool read_some(Clock::time_point end) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buffer[4096];
    ssize_t n = read(fd_, buffer, sizeof(buffer));
    if (n <= 0) return false;
    output_.append(buffer, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_;
};

std::vector<std::string> program(std::vector<std::string> args) {
  args.insert(args.begin(), tool_path("WEFT_TEST_RANK_PROGRAM"));
  return args;
}

// How many names in /dev/shm start with `stem`.
int shm_names(std::string_view stem) {
  DIR* dir = opendir("/dev/shm");
  REQUIRE(dir != nullptr);
  int n = 0;
  while (const dirent* entry = readdir(dir)) n += std::string_view(entry->d_name).starts_with(stem);
  closedir(dir);
  return n;
}

// Gives this process a /dev/shm of its own (a mount namespace with a fresh tmpfs there), so that
// any weft-* name counts, whoever made it. False where that is not allowed (not root).
bool private_dev_shm() {
  return unshare(CLONE_NEWNS) == 0 &&
         mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
         mount("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777") == 0;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_CASE("weftrun --prefix runs 4 ranks that rendezvous through its store and prefixes every line",
          "[launch][weftrun][multiproc]") {
  Weftrun run(
      concat({"--nproc-per-node", "4", "--standalone", "--prefix"}, program({"--lines", "2"})));
  int code = run.finish();
  INFO(run.output());
  CHECK(code == 0);
  for (int r = 0; r < 4; ++r) {
    CHECK_THAT(run.output(), Catch::Contains(fmt::format("[{}]: rank {} of 4: line 0\n", r, r)));
    CHECK_THAT(run.output(), Catch::Contains(fmt::format("[{}]: rank {} of 4: line 1\n", r, r)));
    CHECK_THAT(run.output(), Catch::Contains(fmt::format("[{}]: rank {}: on stderr\n", r, r)));
    CHECK_THAT(run.output(), Catch::Contains(fmt::format("[{}]: rank {} ok\n", r, r)));
  }
  std::istringstream lines(run.output());
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    CHECK(std::regex_search(line, std::regex("^\\[[0-3]\\]: ")));
  }
  CHECK(count == 4 * 4);
}

TEST_CASE("weftrun relays the ranks' lines unchanged by default, as torchrun does",
          "[launch][weftrun][multiproc]") {
  // No flag: a program's output reads under weftrun as it does alone (nccl-tests' parsers).
  // --no-prefix says the same explicitly; --prefix=... takes no value.
  for (std::vector<std::string> flags :
       {std::vector<std::string>{}, std::vector<std::string>{"--no-prefix"}}) {
    Weftrun run(concat(concat({"--nproc_per_node=2", "--standalone"}, flags), program({})));
    CHECK(run.finish() == 0);
    INFO(run.output());
    std::istringstream lines(run.output());
    std::vector<std::string> got;
    for (std::string line; std::getline(lines, line);) got.push_back(line);
    std::sort(got.begin(), got.end());
    CHECK(got == std::vector<std::string>{"rank 0 of 2: line 0", "rank 0 ok", "rank 0: on stderr",
                                          "rank 1 of 2: line 0", "rank 1 ok", "rank 1: on stderr"});
  }
  Weftrun bad({"--prefix=yes", "--standalone", "x"});
  CHECK(bad.finish() == 2);
  CHECK_THAT(bad.output(), Catch::Contains("--prefix takes no value"));
}

TEST_CASE("a rank that exits 3 makes weftrun stop the others and exit 3 naming it",
          "[launch][weftrun][multiproc]") {
  Weftrun run(concat({"--nproc-per-node", "4", "--standalone", "--grace-period", "2"},
                     program({"--lines", "3", "--exit-rank", "2", "--exit-code", "3", "--hang"})));
  int code = run.finish();
  const std::string& out = run.output();
  INFO(out);
  CHECK(code == 3);
  CHECK(std::regex_search(out, std::regex("weftrun: rank 2 \\(pid [0-9]+\\) exited with code 3 "
                                          "first; stopped the other ranks")));
  // Nobody asked for flight-recorder dumps: the others are stopped at once.
  CHECK_THAT(out, !Catch::Contains("flight recorders"));
  for (int r : {0, 1, 3}) {
    CHECK(std::regex_search(
        out, std::regex(fmt::format("weftrun:   rank {} \\(pid [0-9]+\\) was killed by signal 15 "
                                    "\\(SIGTERM\\) after weftrun stopped it",
                                    r))));
    CHECK_THAT(out, !Catch::Contains(fmt::format("rank {} ok", r)));
  }
  // Its lines were relayed once, as they came; the summary points at them instead of repeating
  // them (an error printed twice reads as two errors).
  for (const char* line :
       {"rank 2 of 4: line 0\n", "rank 2 of 4: line 2\n", "rank 2: on stderr\n"}) {
    size_t first = out.find(line);
    CHECK(first != std::string::npos);
    CHECK(out.find(line, first + 1) == std::string::npos);
  }
  CHECK_THAT(out, Catch::Contains("weftrun: rank 2's output is above (weftrun --prefix marks each "
                                  "line with its rank)\n"));
  CHECK_THAT(out, !Catch::Contains("last lines"));
}

TEST_CASE("a failed rank that asked for flight-recorder dumps gets the others a poll's time first",
          "[launch][weftrun][multiproc]") {
  const auto start = std::chrono::steady_clock::now();
  Weftrun run(
      concat({"--nproc-per-node", "3", "--standalone", "--grace-period", "2"},
             program({"--exit-rank", "1", "--exit-code", "3", "--dump-request", "--hang"})));
  int code = run.finish();
  const auto took = std::chrono::steady_clock::now() - start;
  const std::string& out = run.output();
  INFO(out);
  CHECK(code == 3);
  CHECK_THAT(out, Catch::Contains("stopped the other ranks (SIGTERM, SIGKILL after 2 s) once they "
                                  "had written their flight recorders (it asked them to)"));
  // WEFT_TRACE_POLL (1 s by default) and a margin passed before the SIGTERM.
  CHECK(took >= std::chrono::milliseconds(1400));
  for (int r : {0, 2}) {
    CHECK(std::regex_search(
        out,
        std::regex(fmt::format("weftrun:   rank {} \\(pid [0-9]+\\) was killed by signal 15", r))));
  }
}

TEST_CASE("a rank killed by SIGKILL is named with its signal and weftrun exits 137",
          "[launch][weftrun][multiproc]") {
  Weftrun run(
      concat({"--nproc-per-node", "3", "--standalone"}, program({"--kill-rank", "1", "--hang"})));
  int code = run.finish();
  const std::string& out = run.output();
  INFO(out);
  CHECK(code == 128 + SIGKILL);
  CHECK(std::regex_search(out, std::regex("weftrun: rank 1 \\(pid [0-9]+\\) was killed by signal 9 "
                                          "\\(SIGKILL\\) first")));
  CHECK_THAT(out, Catch::Contains("rank 1 of 3: line 0\n"));
  CHECK_THAT(out, !Catch::Contains("rank 0 ok"));
}

TEST_CASE("ranks that ignore SIGTERM are killed with SIGKILL once the grace period ends",
          "[launch][weftrun][multiproc]") {
  auto start = Clock::now();
  Weftrun run(
      concat({"--nproc-per-node", "3", "--standalone", "--grace-period", "0.5"},
             program({"--exit-rank", "0", "--exit-code", "5", "--hang", "--ignore-sigterm"})));
  int code = run.finish();
  const std::string& out = run.output();
  INFO(out);
  CHECK(code == 5);
  CHECK(Clock::now() - start >= std::chrono::milliseconds(500));
  CHECK_THAT(out, Catch::Contains("SIGKILL after 0.5 s"));
  for (int r : {1, 2}) {
    CHECK(std::regex_search(
        out, std::regex(fmt::format("weftrun:   rank {} \\(pid [0-9]+\\) was killed by signal 9 "
                                    "\\(SIGKILL\\) after weftrun stopped it",
                                    r))));
  }
}

TEST_CASE("SIGTERM to weftrun is forwarded to every rank and weftrun exits 143",
          "[launch][weftrun][multiproc]") {
  Weftrun run(concat({"--nproc-per-node", "3", "--standalone"}, program({"--hang"})));
  run.read_until("waiting\n", 3, std::chrono::seconds(30));
  REQUIRE(kill(run.pid(), SIGTERM) == 0);
  int code = run.finish();
  INFO(run.output());
  CHECK(code == 128 + SIGTERM);
  CHECK_THAT(run.output(), Catch::Contains("weftrun: received signal 15 (SIGTERM)"));
  for (int r = 0; r < 3; ++r) {
    CHECK(std::regex_search(run.output(),
                            std::regex(fmt::format("weftrun:   rank {} \\(pid [0-9]+\\) was killed "
                                                   "by signal 15 \\(SIGTERM\\) after weftrun",
                                                   r))));
  }
}

TEST_CASE("SIGINT reaches the ranks even when weftrun started with SIGINT ignored",
          "[launch][weftrun][multiproc]") {
  // As under `bash -c 'weftrun ... & wait'`: background jobs of a shell without job control
  // start with SIGINT ignored, and exec keeps that.
  auto start = Clock::now();
  Weftrun run(concat({"--nproc-per-node", "2", "--standalone", "--grace-period", "20"},
                     program({"--hang"})),
              {SIGINT});
  run.read_until("waiting\n", 2, std::chrono::seconds(30));
  REQUIRE(kill(run.pid(), SIGINT) == 0);
  int code = run.finish(std::chrono::seconds(40));
  INFO(run.output());
  CHECK(code == 128 + SIGINT);
  for (int r = 0; r < 2; ++r) {
    CHECK(std::regex_search(run.output(),
                            std::regex(fmt::format("weftrun:   rank {} \\(pid [0-9]+\\) was killed "
                                                   "by signal 2 \\(SIGINT\\) after weftrun",
                                                   r))));
  }
  CHECK(Clock::now() - start < std::chrono::seconds(20));  // not the grace period's SIGKILL
}

TEST_CASE("a rank that aborts after weftrun's SIGTERM is not said to be stopped by weftrun",
          "[launch][weftrun][multiproc]") {
  Weftrun run(
      concat({"--nproc-per-node", "3", "--standalone"},
             program({"--exit-rank", "2", "--exit-code", "3", "--hang", "--abort-on-sigterm"})));
  int code = run.finish();
  const std::string& out = run.output();
  INFO(out);
  CHECK(code == 3);
  for (int r : {0, 1}) {
    CHECK(std::regex_search(
        out, std::regex(fmt::format("weftrun:   rank {} \\(pid [0-9]+\\) was killed by signal 6 "
                                    "\\(SIGABRT\\) \\(weftrun had sent it signal 15 "
                                    "\\(SIGTERM\\)\\)\n",
                                    r))));
  }
  CHECK_THAT(out, !Catch::Contains("after weftrun stopped it"));
}

TEST_CASE("weftrun gives its ranks one WEFT_JOB_ID, --rdzv-id's when given, a new one otherwise",
          "[launch][weftrun][multiproc]") {
  Weftrun named({"--nproc-per-node", "2", "--standalone", "--prefix", "--rdzv-id", "job42",
                 "/bin/sh", "-c", "echo id=$WEFT_JOB_ID"});
  CHECK(named.finish() == 0);
  CHECK_THAT(named.output(),
             Catch::Contains("[0]: id=job42\n") && Catch::Contains("[1]: id=job42\n"));

  std::string ids[2];
  for (std::string& id : ids) {
    Weftrun run({"--nproc-per-node", "2", "--standalone", "--prefix", "/bin/sh", "-c",
                 "echo id=$WEFT_JOB_ID"});
    REQUIRE(run.finish() == 0);
    std::smatch m;
    const std::string& out = run.output();
    REQUIRE(std::regex_search(out, m, std::regex("\\[0\\]: id=(wr[0-9a-f]+)\n")));
    id = m[1];
    CHECK_THAT(out, Catch::Contains(fmt::format("[1]: id={}\n", id)));
  }
  CHECK(ids[0] != ids[1]);
}

TEST_CASE("weftrun --bind-to core binds each rank to its share of the cores; none by default",
          "[launch][weftrun][multiproc]") {
  const std::vector<weft::CpuInfo> cpus = weft::allowed_cpus();
  std::vector<int> every;
  for (const weft::CpuInfo& info : cpus) every.push_back(info.cpu);
  const std::string show = "grep Cpus_allowed_list: /proc/self/status";
  {
    Weftrun run({"--nproc-per-node", "2", "--standalone", "--prefix", "--bind-to", "core",
                 "/bin/sh", "-c", show});
    REQUIRE(run.finish() == 0);
    for (int r = 0; r < 2; ++r) {
      std::vector<int> share = weft::cpu_share(cpus, r, 2);
      if (share.empty()) share = every;  // one CPU here: not bound, and said so
      CHECK_THAT(run.output(), Catch::Contains(fmt::format("[{}]: Cpus_allowed_list:\t{}\n", r,
                                                           weft::cpu_list_text(share))));
    }
    if (cpus.size() < 2) CHECK_THAT(run.output(), Catch::Contains("not binding them"));
  }
  {
    // More ranks than CPUs: every rank keeps weftrun's CPUs, and weftrun says why once.
    const int ranks = static_cast<int>(cpus.size()) + 1;
    Weftrun run({"--nproc-per-node", std::to_string(ranks), "--standalone", "--prefix", "--bind-to",
                 "core", "/bin/sh", "-c", show});
    REQUIRE(run.finish() == 0);
    CHECK_THAT(run.output(),
               Catch::Contains(fmt::format("--bind-to core: {} ranks on {} CPUs; not binding them",
                                           ranks, cpus.size())));
    for (int r = 0; r < ranks; ++r) {
      CHECK_THAT(run.output(), Catch::Contains(fmt::format("[{}]: Cpus_allowed_list:\t{}\n", r,
                                                           weft::cpu_list_text(every))));
    }
  }
  {
    Weftrun run({"--nproc-per-node", "2", "--standalone", "--prefix", "/bin/sh", "-c", show});
    REQUIRE(run.finish() == 0);
    for (int r = 0; r < 2; ++r) {
      CHECK_THAT(run.output(), Catch::Contains(fmt::format("[{}]: Cpus_allowed_list:\t{}\n", r,
                                                           weft::cpu_list_text(every))));
    }
  }
}

TEST_CASE("20 jobs interrupted in shared-memory set-up leave no segment in /dev/shm",
          "[launch][weftrun][multiproc]") {
  const bool isolated = private_dev_shm();
  if (!isolated) WARN("no private /dev/shm (needs root): counting only this test's job names");
  int watch = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  REQUIRE(watch >= 0);
  REQUIRE(inotify_add_watch(watch, "/dev/shm", IN_CREATE) >= 0);
  const int signals[] = {SIGINT, SIGTERM, SIGHUP};
  for (int job = 0; job < 20; ++job) {
    const int sig = signals[job % 3];
    const std::string id = fmt::format("shmtest{}x{}", getpid(), job);
    const std::string stem = isolated ? "weft-" : fmt::format("weft-{}-", id);
    INFO("job " << job << ", signal " << sig);
    Weftrun run(concat({"--nproc-per-node", "4", "--standalone", "--rdzv-id", id},
                       program({"--shm-stall", "3", "--hang"})));
    // Ranks 0, 1 and 2 create their segments, then wait for rank 3's, which never comes.
    auto end = Clock::now() + std::chrono::seconds(30);
    while (shm_names(stem) < 3) {
      REQUIRE(Clock::now() < end);
      pollfd p{watch, POLLIN, 0};
      poll(&p, 1, 100);
      char events[4096];
      while (read(watch, events, sizeof(events)) > 0) {
      }
    }
    REQUIRE(kill(run.pid(), sig) == 0);
    CHECK(run.finish() == 128 + sig);
    CHECK(shm_names(stem) == 0);
  }
  close(watch);
}

TEST_CASE("weftrun on node 1 sets the multi-node variables and does not host the store",
          "[launch][weftrun][multiproc]") {
  // The test holds the port: node 0 could not bind it, so node 1 succeeding proves it did not try.
  int holder = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(holder, 1) == 0);
  socklen_t len = sizeof(addr);
  getsockname(holder, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string port = std::to_string(ntohs(addr.sin_port));

  Weftrun node1({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port",
                 port, "--prefix", "/bin/sh", "-c",
                 "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
                 "$MASTER_PORT $TORCHELASTIC_USE_AGENT_STORE"});
  CHECK(node1.finish() == 0);
  CHECK_THAT(node1.output(),
             Catch::Contains(fmt::format("[2]: 2 4 0 2 1 127.0.0.1 {} True", port)));
  CHECK_THAT(node1.output(),
             Catch::Contains(fmt::format("[3]: 3 4 1 2 1 127.0.0.1 {} True", port)));

  Weftrun node0({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "/bin/true"});
  CHECK(node0.finish() == 1);
  CHECK_THAT(node0.output(),
             Catch::Contains(fmt::format("weftrun: cannot host the store on 127.0.0.1:{}", port)));
  close(holder);
}

TEST_CASE("a bad WEFT_* value is reported as a configuration error, not as the store's port",
          "[launch][weftrun]") {
  // The store server reads WEFT_* too: its failure used to read "cannot host the store ... pass
  // --master-port", which sends the user after the wrong thing.
  setenv("WEFT_TIMEOUT", "soon", 1);
  Weftrun run({"--standalone", "/bin/true"});
  unsetenv("WEFT_TIMEOUT");
  CHECK(run.finish() == 2);
  INFO(run.output());
  CHECK_THAT(run.output(),
             Catch::StartsWith("weftrun: configuration: InvalidArgument: WEFT_TIMEOUT=\"soon\" is "
                               "not a duration"));
  CHECK_THAT(run.output(), Catch::Contains("fix or unset it"));
  CHECK_THAT(run.output(), !Catch::Contains("cannot host the store"));
  CHECK_THAT(run.output(), !Catch::Contains("--master-port"));
}

TEST_CASE("weftrun refuses bad flags with a message and exit code 2", "[launch][weftrun]") {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--bogus", "x"}, "unknown option --bogus"},
           {{"--nproc-per-node", "0", "x"}, "--nproc-per-node 0: expected an integer in 1..4096"},
           {{"--nnodes", "1:2", "x"}, "elastic ranges are not supported"},
           {{"--nnodes", "2", "--node-rank", "2", "x"}, "--node-rank 2 is out of range"},
           {{"--standalone", "--master-port", "5", "x"}, "drop --master-*"},
           {{"--grace-period", "-1", "x"}, "expected seconds"},
           {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
           {{"--standalone"}, "no program given"},
           {{"--bind-to", "socket", "x"}, "--bind-to socket: expected core or none"},
       }) {
    Weftrun run(c.args);
    INFO(fmt::format("{}", fmt::join(c.args, " ")));
    CHECK(run.finish() == 2);
    CHECK_THAT(run.output(), Catch::Contains(c.message));
  }
  Weftrun help({"--help"});
  CHECK(help.finish() == 0);
  CHECK_THAT(help.output(), Catch::Contains("--nproc-per-node N"));
}

}  // namespace
