// runtime/shm_names.h: which leftover /dev/shm segments of a job are removed, and which kept.
#include "runtime/shm_names.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

namespace weft {
namespace {

// Above any pid_max (at most 2^22 on Linux): no process has it.
constexpr const char* kDeadPid = "2147483647";

// Creates /dev/shm/<name>, dated `age_s` seconds ago when age_s > 0.
void make_segment(const std::string& name, int age_s) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  if (age_s > 0) {
    timespec times[2];
    ::clock_gettime(CLOCK_REALTIME, &times[0]);
    times[0].tv_sec -= age_s;
    times[1] = times[0];
    REQUIRE(::futimens(fd, times) == 0);
  }
  ::close(fd);
}

bool exists(const std::string& name) { return ::access(("/dev/shm" + name).c_str(), F_OK) == 0; }

TEST_CASE("a restarted job removes its earlier run's orphans but not segments newer than itself",
          "[launch][shm]") {
  const std::string prefix = shm_job_prefix(fmt::format("shmnamestest{}", ::getpid()));
  const std::string old_orphan = fmt::format("{}00000000000000aa-{}-r0", prefix, kDeadPid);
  const std::string new_orphan = fmt::format("{}00000000000000bb-{}-r1", prefix, kDeadPid);
  const std::string live = fmt::format("{}00000000000000cc-{}-r2", prefix, ::getpid());
  make_segment(old_orphan, 3600);  // left by a run killed an hour ago
  make_segment(new_orphan, 0);     // made after this process started: a peer's of this run?
  make_segment(live, 3600);        // its creator runs

  std::vector<std::string> removed = remove_orphan_segments(prefix, true);
  CHECK(removed == std::vector<std::string>{old_orphan});
  CHECK(!exists(old_orphan));
  CHECK(exists(new_orphan));
  CHECK(exists(live));

  // Without the age test (weftrun, once its ranks are gone), every dead creator's goes.
  removed = remove_orphan_segments(prefix);
  CHECK(removed == std::vector<std::string>{new_orphan});
  CHECK(exists(live));
  ::shm_unlink(live.c_str());
}

}  // namespace
}  // namespace weft
