#include "runtime/shm_names.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/log.h"

namespace weft {
namespace {

// When this process loaded libweft (before main): every segment of its own job is newer. Read
// from the coarse clock, the one the kernel dates files by (to the tick): the precise clock may
// run a tick ahead of a file made just after it was read.
const timespec kLoaded = [] {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME_COARSE, &now);
  return now;
}();

bool older_than_loaded(const timespec& t) {
  return t.tv_sec < kLoaded.tv_sec || (t.tv_sec == kLoaded.tv_sec && t.tv_nsec < kLoaded.tv_nsec);
}

}  // namespace

std::string shm_job_prefix(std::string_view job_id) {
  if (job_id.empty()) return "/weft-";
  const bool plain = job_id.size() <= 64 && std::all_of(job_id.begin(), job_id.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_';
                     });
  if (plain) return fmt::format("/weft-{}-", job_id);
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a 64-bit offset basis and prime
  for (char c : job_id) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ULL;
  }
  return fmt::format("/weft-h{:016x}-", hash);
}

std::vector<std::string> remove_orphan_segments(std::string_view prefix,
                                                bool only_older_than_this_process) {
  std::vector<std::string> removed;
  std::string_view stem = prefix.starts_with('/') ? prefix.substr(1) : prefix;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return removed;
  while (const dirent* entry = ::readdir(dir)) {
    std::string_view name(entry->d_name);
    if (!name.starts_with(stem)) continue;
    // "...-<pid>-r<rank>": the pid is the field before the last "-r".
    size_t r = name.rfind("-r");
    size_t dash =
        r == std::string_view::npos || r == 0 ? std::string_view::npos : name.rfind('-', r - 1);
    if (dash == std::string_view::npos || dash < stem.size() - 1) continue;
    std::string_view pid_text = name.substr(dash + 1, r - dash - 1);
    pid_t pid = 0;
    auto [end, ec] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    if (ec != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its creator runs (or is not ours)
    struct stat st {};
    if (only_older_than_this_process &&
        (::fstatat(::dirfd(dir), entry->d_name, &st, 0) != 0 || !older_than_loaded(st.st_mtim))) {
      continue;
    }
    std::string object = fmt::format("/{}", name);
    if (::shm_unlink(object.c_str()) == 0) removed.push_back(std::move(object));
  }
  ::closedir(dir);
  return removed;
}

void remove_earlier_runs_segments(std::string_view job_id) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::vector<std::string> removed = remove_orphan_segments(shm_job_prefix(job_id), true);
    if (removed.empty()) return;
    WEFT_LOG_INFO(
        "removed {} shared-memory segment(s) that killed ranks of an earlier run of "
        "this job left: {}",
        removed.size(), fmt::join(removed, " "));
  });
}

}  // namespace weft
