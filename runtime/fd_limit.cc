#include "runtime/fd_limit.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace weft {
namespace {

// Descriptors this process has open now (entries of /proc/self/fd, less the one reading it);
// -1 when that cannot be read (itself for want of a descriptor, at EMFILE).
int open_descriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count - 1;
}

std::string limit_text(rlim_t limit) {
  return limit == RLIM_INFINITY ? std::string("unlimited") : fmt::format("{}", limit);
}

}  // namespace

bool out_of_descriptors(int err) { return err == EMFILE || err == ENFILE; }

bool mentions_fd_limit(std::string_view message) {
  return message.find("RLIMIT_NOFILE") != std::string_view::npos ||
         message.find("fs.file-max") != std::string_view::npos;
}

int descriptors_needed(int ranks) {
  // Measured on 2 hosts x 4 ranks under weftrun (which hosts the store), weft-perf all: every
  // rank runs under `ulimit -n 16` and fails under 12 (tests/hosts/fault_net_test.py nofile).
  // Per rank of a group: one socket per peer, an epoll fd, an eventfd, a listener during set-up,
  // a store connection, and stdio; the rank that hosts the store (no weftrun) adds one
  // connection per rank. So 16 + 2P covers either rank of one group; each further group adds
  // about P + 3.
  const int p = ranks > 0 ? ranks : 0;
  return 16 + 2 * p;
}

std::string fd_error_text(int err, int ranks) {
  if (err == ENFILE) {
    return fmt::format(
        "{}: the system's file table is full (sysctl fs.file-max): close other "
        "programs' files or raise it",
        std::strerror(err));
  }
  if (err != EMFILE) return std::strerror(err);
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  const int open = open_descriptors();
  std::string need = ranks > 0 ? fmt::format("; weft needs about {} for {} ranks",
                                             descriptors_needed(ranks), ranks)
                               : std::string();
  return fmt::format(
      "too many open files: RLIMIT_NOFILE is {}{}{}: raise it with ulimit -n (the hard limit is "
      "{}), or open fewer groups",
      limit_text(limit.rlim_cur),
      open >= 0 ? fmt::format(" and this process has {} open", open) : std::string(), need,
      limit_text(limit.rlim_max));
}

}  // namespace weft
