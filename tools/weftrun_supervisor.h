// tools/weftrun_supervisor.h: starts a node's ranks, relays their output, and stops them all
// when one fails.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "tools/weftrun_options.h"

namespace weft::weftrun {

// Blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP (the supervisor reads them from a signalfd) and
// ignores SIGPIPE. Call first in main, before any thread starts, so that every thread inherits
// the mask and no signal is delivered to a thread that would not handle it.
void block_launcher_signals();

// The Supervisor runs one node's ranks: children in their own process groups, stdout and stderr
// through pipes, each line relayed unchanged (with a "[RANK]: " prefix under --prefix) and the last
// kTailLines of each rank kept for the summary. One thread, one poll() over the pipes and a
// signalfd; nothing runs between events.
//
// On the first failure (non-zero exit or death by signal) every other rank's process group gets
// SIGTERM, then SIGKILL once the grace period has passed. SIGINT, SIGTERM and SIGHUP sent to
// weftrun are forwarded to every rank's group, with the same escalation. Ranks start with those
// signals' default actions and nothing blocked, whatever weftrun inherited (a script's `&` leaves
// SIGINT ignored), so a forwarded signal stops them. Once every rank has exited, the /dev/shm
// objects its killed ranks left (named after the job: runtime/shm_names.h) are removed.
//
// Thread safety: single-threaded; run() once.
class Supervisor {
 public:
  static constexpr size_t kTailLines = 20;

  // `store_port` is the port the ranks are told (MASTER_PORT): the hosted store's, possibly
  // picked by the kernel.
  Supervisor(const Options& options, uint16_t store_port);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts the ranks and returns once all have exited and their output is relayed: weftrun's
  // exit code (0, the first failed rank's code, or 128+signal).
  int run();

 private:
  struct Rank {
    int rank = 0;
    int local_rank = 0;
    std::vector<int> cpus;  // --bind-to core: the CPUs it is bound to; empty: not bound
    pid_t pid = -1;
    int fds[2] = {-1, -1};   // read ends of the rank's stdout and stderr
    std::string partial[2];  // an unfinished line per stream
    std::deque<std::string> tail;
    bool exited = false;
    int status = 0;  // from waitpid
    bool stopped_by_us = false;
    int stop_signal = 0;  // the last signal weftrun sent it (SIGKILL once the grace period ended)
  };

  std::vector<std::string> child_environment(const Rank& rank) const;
  void spawn(Rank& rank);
  void read_output(Rank& rank, int stream);
  void emit_line(Rank& rank, int stream, std::string line);
  void reap();
  void handle_signal();
  // Sends sig to every running rank's process group and arms the SIGKILL deadline.
  void stop_all(int sig);
  // Whether a rank asked the job to dump its flight recorders (docs/flight-recorder.md): then
  // the others get a moment to do so before they are stopped.
  bool dump_requested() const;
  // True when no started rank is still running.
  bool all_exited() const;
  std::string summary() const;
  // Removes the job's /dev/shm objects whose creators are gone; returns a line for the summary.
  std::string remove_orphans() const;
  int exit_code() const;

  Options options_;
  uint16_t store_port_;
  int signal_fd_ = -1;
  std::vector<Rank> ranks_;
  int first_failed_ = -1;     // index into ranks_, -1 until a rank fails
  int forwarded_signal_ = 0;  // a signal weftrun received and forwarded, 0 if none
  bool stopping_ = false;     // SIGTERM (or a forwarded signal) sent; SIGKILL at kill_deadline_
  bool killed_ = false;       // SIGKILL sent
  std::chrono::steady_clock::time_point kill_deadline_;
  // After a failure whose rank asked every rank to dump: when to stop the others.
  std::optional<std::chrono::steady_clock::time_point> stop_at_;
  bool waited_for_dumps_ = false;
  // Our stdout / stderr failed (closed pipe): relay nothing more to it, but keep the ranks' tails.
  bool output_closed_[2] = {false, false};
};

}  // namespace weft::weftrun
