#include "tools/weftrun_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/config.h"
#include "weft/tcp_store.h"

#include "runtime/cpu_binding.h"
#include "runtime/fd_limit.h"
#include "runtime/shm_names.h"

extern char** environ;

namespace weft::weftrun {
namespace {

using Clock = std::chrono::steady_clock;

// A line longer than this is relayed in pieces, so one rank cannot make weftrun buffer without
// bound by never writing a newline.
constexpr size_t kMaxLineBytes = 64 * 1024;
// Lines kept for the summary are cut to this many bytes.
constexpr size_t kMaxTailLineBytes = 512;
// After the last rank exits, how long its descendants may keep the pipes open before weftrun
// stops relaying and exits anyway.
constexpr std::chrono::milliseconds kDrainAfterExit{2000};
// Beyond WEFT_TRACE_POLL, for the ranks to write their flight-recorder dumps after a failure
// that asked them to (a dump is milliseconds; the poll is what they wait for).
constexpr std::chrono::milliseconds kDumpMargin{500};

// The variables weftrun sets; inherited values of the same names are dropped.
constexpr const char* kLaunchVariables[] = {"RANK",
                                            "WORLD_SIZE",
                                            "LOCAL_RANK",
                                            "LOCAL_WORLD_SIZE",
                                            "GROUP_RANK",
                                            "GROUP_WORLD_SIZE",
                                            "MASTER_ADDR",
                                            "MASTER_PORT",
                                            "TORCHELASTIC_USE_AGENT_STORE",
                                            "TORCHELASTIC_RESTART_COUNT",
                                            "WEFT_JOB_ID"};

// What weftrun forwards to its ranks; they must not inherit these ignored or blocked.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

[[noreturn]] void fail(const std::string& what) {
  // fd_error_text: EMFILE says which limit and what to do (weftrun holds two pipes per rank).
  throw std::runtime_error(fmt::format("{}: {}", what, fd_error_text(errno)));
}

// Writes all of text to fd; false when the reader is gone (EPIPE) or the write fails.
bool write_fully(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("signal {} (SIG{})", sig, abbrev) : fmt::format("signal {}", sig);
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by {}", signal_text(WTERMSIG(status)));
  return "ended";
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

}  // namespace

void block_launcher_signals() {
  sigset_t blocked;
  sigemptyset(&blocked);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&blocked, sig);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  // A closed stdout must not kill weftrun while its ranks run: writes fail with EPIPE instead.
  signal(SIGPIPE, SIG_IGN);
}

Supervisor::Supervisor(const Options& options, uint16_t store_port)
    : options_(options), store_port_(store_port) {
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  signal_fd_ = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) fail("signalfd");
  ranks_.resize(static_cast<size_t>(options_.nproc_per_node));
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    ranks_[local].local_rank = local;
    ranks_[local].rank = options_.node_rank * options_.nproc_per_node + local;
  }
  if (options_.bind_to_core) {
    const std::vector<CpuInfo> cpus = allowed_cpus();
    for (Rank& rank : ranks_) {
      rank.cpus = cpu_share(cpus, rank.local_rank, options_.nproc_per_node);
    }
    if (ranks_.empty() || ranks_[0].cpus.empty()) {
      // As mpirun when oversubscribed: every rank may run anywhere.
      fmt::print(stderr, "weftrun: --bind-to core: {} ranks on {} CPUs; not binding them\n",
                 options_.nproc_per_node, cpus.size());
    }
  }
}

Supervisor::~Supervisor() {
  for (Rank& rank : ranks_) {
    for (int& fd : rank.fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  if (signal_fd_ >= 0) ::close(signal_fd_);
}

std::vector<std::string> Supervisor::child_environment(const Rank& rank) const {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    bool ours = false;
    for (const char* variable : kLaunchVariables) ours = ours || name == variable;
    if (!ours) env.emplace_back(entry);
  }
  int world_size = options_.nnodes * options_.nproc_per_node;
  env.push_back(fmt::format("RANK={}", rank.rank));
  env.push_back(fmt::format("WORLD_SIZE={}", world_size));
  env.push_back(fmt::format("LOCAL_RANK={}", rank.local_rank));
  env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", options_.nproc_per_node));
  env.push_back(fmt::format("GROUP_RANK={}", options_.node_rank));
  env.push_back(fmt::format("GROUP_WORLD_SIZE={}", options_.nnodes));
  env.push_back(fmt::format("MASTER_ADDR={}", options_.master_addr));
  env.push_back(fmt::format("MASTER_PORT={}", store_port_));
  env.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
  env.push_back("TORCHELASTIC_RESTART_COUNT=0");
  env.push_back(fmt::format("WEFT_JOB_ID={}", options_.job_id));
  return env;
}

void Supervisor::spawn(Rank& rank) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) fail("pipe2");
  // Everything the child needs is built before fork: after it, only async-signal-safe calls
  // (the store server's thread may hold malloc's lock at the moment of fork).
  std::vector<std::string> env = child_environment(rank);
  std::vector<char*> envp, argv;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (const std::string& a : options_.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::string exec_failed = fmt::format("weftrun: cannot run {}: ", options_.command[0]);
  const cpu_set_t mask = cpu_mask(rank.cpus);
  const std::string bind_failed =
      fmt::format("weftrun: rank {}: cannot bind to CPUs {} (running unbound): ", rank.rank,
                  cpu_list_text(rank.cpus));
  pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) fail("fork");
  if (pid == 0) {
    setpgid(0, 0);
    // Die with weftrun even when it is SIGKILLed and cannot stop the ranks itself.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(128 + SIGKILL);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    // Default actions and an empty mask: what weftrun inherited (SIGINT ignored under a
    // script's `&`) must not make its ranks deaf to the signals it forwards.
    signal(SIGPIPE, SIG_DFL);
    for (int sig : kForwardedSignals) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // Before exec: the program and every thread it starts inherit the mask.
    if (!rank.cpus.empty() && sched_setaffinity(0, sizeof mask, &mask) != 0) {
      int error = errno;
      write_fully(STDERR_FILENO, bind_failed);
      write_fully(STDERR_FILENO, strerror(error));
      write_fully(STDERR_FILENO, "\n");
    }
    execvpe(argv[0], argv.data(), envp.data());
    int error = errno;
    write_fully(STDERR_FILENO, exec_failed);
    write_fully(STDERR_FILENO, strerror(error));
    write_fully(STDERR_FILENO, "\n");
    _exit(127);
  }
  // Also set here: a signal sent before the child ran setpgid must still reach its group.
  setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  rank.pid = pid;
  rank.fds[0] = out[0];
  rank.fds[1] = err[0];
  for (int fd : rank.fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void Supervisor::emit_line(Rank& rank, int stream, std::string line) {
  if (!output_closed_[stream]) {
    std::string text = options_.prefix ? fmt::format("[{}]: {}\n", rank.rank, line) : line + "\n";
    if (!write_fully(stream == 0 ? STDOUT_FILENO : STDERR_FILENO, text)) {
      output_closed_[stream] = true;
    }
  }
  if (line.size() > kMaxTailLineBytes) {
    line.resize(kMaxTailLineBytes);
    line += "...";
  }
  rank.tail.push_back(std::move(line));
  if (rank.tail.size() > kTailLines) rank.tail.pop_front();
}

void Supervisor::read_output(Rank& rank, int stream) {
  char buffer[16384];
  int& fd = rank.fds[stream];
  std::string& partial = rank.partial[stream];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {  // end of file (or a read error, treated alike): relay what is left
      if (!partial.empty()) emit_line(rank, stream, std::move(partial));
      partial.clear();
      ::close(fd);
      fd = -1;
      return;
    }
    partial.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t newline; (newline = partial.find('\n', start)) != std::string::npos;) {
      emit_line(rank, stream, partial.substr(start, newline - start));
      start = newline + 1;
    }
    partial.erase(0, start);
    if (partial.size() >= kMaxLineBytes) {
      emit_line(rank, stream, std::move(partial));
      partial.clear();
    }
  }
}

void Supervisor::stop_all(int sig) {
  for (Rank& rank : ranks_) {
    if (rank.exited) continue;
    ::kill(-rank.pid, sig);
    rank.stopped_by_us = true;
    rank.stop_signal = sig;
  }
  if (!stopping_) {
    stopping_ = true;
    kill_deadline_ = Clock::now() + options_.grace_period;
  }
}

bool Supervisor::dump_requested() const {
  if (weft::config().trace_buffer == 0) return false;
  try {
    weft::TCPStoreOptions store;
    store.host = options_.master_addr;
    store.port = store_port_;
    store.timeout = std::chrono::seconds(1);
    // Every rank's trace thread reads this counter (creating it at 0); a request adds one.
    return weft::TCPStore(store).add("weft/trace/requests", 0) > 0;
  } catch (const std::exception&) {
    return false;  // no store (any more): nobody can be asked anything
  }
}

void Supervisor::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Rank& rank = ranks_[i];
      if (rank.pid != pid || rank.exited) continue;
      rank.exited = true;
      rank.status = status;
      // Its descendants may still hold resources (or the pipes): end the whole group.
      ::kill(-rank.pid, SIGKILL);
      if (failed(status) && first_failed_ < 0 && forwarded_signal_ == 0 && !rank.stopped_by_us) {
        first_failed_ = static_cast<int>(i);
        if (dump_requested()) {
          // Each rank's trace thread answers within a poll: stopping them now would lose the
          // survivors' view of the failure.
          stop_at_ = Clock::now() + weft::config().trace_poll + kDumpMargin;
          waited_for_dumps_ = true;
        } else {
          stop_all(SIGTERM);
        }
      }
    }
  }
}

void Supervisor::handle_signal() {
  for (;;) {
    signalfd_siginfo info;
    ssize_t n = ::read(signal_fd_, &info, sizeof(info));
    if (n != static_cast<ssize_t>(sizeof(info))) return;
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      reap();
    } else {
      // Forwarded as received; a failure already being handled keeps its place in the summary.
      if (forwarded_signal_ == 0 && first_failed_ < 0) forwarded_signal_ = sig;
      stop_all(sig);
    }
  }
}

bool Supervisor::all_exited() const {
  for (const Rank& rank : ranks_) {
    if (!rank.exited && rank.pid > 0) return false;
  }
  return true;
}

int Supervisor::run() {
  for (Rank& rank : ranks_) {
    spawn(rank);
    // A signal that arrived while starting: stop what has started, start nothing more.
    handle_signal();
    if (stopping_) break;
  }
  std::optional<Clock::time_point> drain_deadline;
  for (;;) {
    std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
    std::vector<std::pair<Rank*, int>> owners{{nullptr, -1}};
    for (Rank& rank : ranks_) {
      for (int stream = 0; stream < 2; ++stream) {
        if (rank.fds[stream] < 0) continue;
        fds.push_back({rank.fds[stream], POLLIN, 0});
        owners.emplace_back(&rank, stream);
      }
    }
    bool exited = all_exited();
    if (exited && !drain_deadline) drain_deadline = Clock::now() + kDrainAfterExit;
    if (exited && (fds.size() == 1 || Clock::now() >= *drain_deadline)) break;

    int timeout_ms = -1;
    auto until = [&](Clock::time_point t) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
      int bounded = static_cast<int>(std::max<int64_t>(0, ms));
      timeout_ms = timeout_ms < 0 ? bounded : std::min(timeout_ms, bounded);
    };
    if (stopping_ && !killed_) until(kill_deadline_);
    if (stop_at_) until(*stop_at_);
    if (drain_deadline) until(*drain_deadline);

    int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) fail("poll");
    for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_output(*owners[i].first, owners[i].second);
    }
    if (ready > 0 && fds[0].revents != 0) handle_signal();
    if (stop_at_ && Clock::now() >= *stop_at_) {
      stop_at_.reset();
      if (!stopping_) stop_all(SIGTERM);
    }
    if (stopping_ && !killed_ && Clock::now() >= kill_deadline_) {
      killed_ = true;
      for (Rank& rank : ranks_) {
        if (!rank.exited && rank.pid > 0) {
          ::kill(-rank.pid, SIGKILL);
          rank.stop_signal = SIGKILL;
        }
      }
    }
  }
  std::string text = summary() + remove_orphans();
  if (!text.empty()) write_fully(STDERR_FILENO, text);
  return exit_code();
}

int Supervisor::exit_code() const {
  if (first_failed_ >= 0) {
    int status = ranks_[first_failed_].status;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
  }
  if (forwarded_signal_ != 0) return 128 + forwarded_signal_;
  for (const Rank& rank : ranks_) {
    if (rank.pid <= 0 || failed(rank.status)) return 1;
  }
  return 0;
}

std::string Supervisor::summary() const {
  std::string text;
  if (first_failed_ >= 0) {
    const Rank& first = ranks_[first_failed_];
    text += fmt::format("weftrun: rank {} (pid {}) {} first", first.rank, first.pid,
                        status_text(first.status));
    if (ranks_.size() > 1) {
      text += fmt::format("; stopped the other ranks (SIGTERM, SIGKILL after {:g} s)",
                          static_cast<double>(options_.grace_period.count()) / 1000.0);
      if (waited_for_dumps_) {
        text += fmt::format(
            " once they had written their flight recorders (it asked them to): `weft-trace {}` "
            "says who was behind",
            weft::config().trace_dir.empty() ? "." : weft::config().trace_dir);
      }
    }
    text += "\n";
  } else if (forwarded_signal_ != 0) {
    text += fmt::format("weftrun: received {}; forwarded it to every rank\n",
                        signal_text(forwarded_signal_));
  } else {
    return "";
  }
  for (const Rank& rank : ranks_) {
    if (first_failed_ >= 0 && &rank == &ranks_[first_failed_]) continue;
    if (rank.pid <= 0) {
      text += fmt::format("weftrun:   rank {}: not started\n", rank.rank);
    } else {
      // "after weftrun stopped it" only when it died of what weftrun sent: a rank that aborted or
      // exited on its own meanwhile is reported as such.
      std::string why;
      if (rank.stopped_by_us && failed(rank.status)) {
        why = WIFSIGNALED(rank.status) && WTERMSIG(rank.status) == rank.stop_signal
                  ? " after weftrun stopped it"
                  : fmt::format(" (weftrun had sent it {})", signal_text(rank.stop_signal));
      }
      text += fmt::format("weftrun:   rank {} (pid {}) {}{}\n", rank.rank, rank.pid,
                          status_text(rank.status), why);
    }
  }
  if (first_failed_ >= 0) {
    // Its lines were relayed as they came: repeating them here would print its error twice.
    // Only when weftrun's own output was closed (nothing reached the reader) are they quoted.
    const Rank& first = ranks_[first_failed_];
    if (first.tail.empty()) {
      text += fmt::format("weftrun: rank {} printed nothing\n", first.rank);
    } else if (output_closed_[0] || output_closed_[1]) {
      text += fmt::format("weftrun: last lines of rank {}:\n", first.rank);
      for (const std::string& line : first.tail)
        text += fmt::format("  [{}]: {}\n", first.rank, line);
    } else if (!options_.prefix && ranks_.size() > 1) {
      text += fmt::format(
          "weftrun: rank {}'s output is above (weftrun --prefix marks each line with its rank)\n",
          first.rank);
    }
  }
  return text;
}

std::string Supervisor::remove_orphans() const {
  std::vector<std::string> removed = remove_orphan_segments(shm_job_prefix(options_.job_id));
  if (removed.empty()) return "";
  return fmt::format("weftrun: removed {} shared-memory {} that stopped ranks left: {}\n",
                     removed.size(), removed.size() == 1 ? "object" : "objects",
                     fmt::join(removed, " "));
}

}  // namespace weft::weftrun
