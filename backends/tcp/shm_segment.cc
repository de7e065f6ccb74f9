#include "backends/tcp/shm_segment.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/fd_limit.h"

namespace weft::tcp {
namespace {

// Closes a descriptor when the scope ends; the mapping keeps the object alive without it.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

std::string where(const std::string& name) { return fmt::format("shm segment \"{}\"", name); }

[[noreturn]] void throw_errno(const std::string& name, const char* call, int err) {
  throw_error(ErrorCode::Io, where(name),
              fmt::format("{} failed: {} (errno {})", call, fd_error_text(err), err));
}

// What to tell the user when reserving `size` bytes found no room in /dev/shm (ENOSPC): how much
// room there is, and the two ways out. (glibc's shm_open puts every object in /dev/shm.)
std::string no_space_text(size_t size) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string room;
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) == 0) {
    room = fmt::format(" (it has {:.1f} MiB free of {:.1f} MiB)",
                       static_cast<double>(fs.f_bavail) * fs.f_frsize / kMiB,
                       static_cast<double>(fs.f_blocks) * fs.f_frsize / kMiB);
  }
  return fmt::format(
      "/dev/shm is too small: no room for {:.1f} MiB ({} bytes): {}{}; give the job a bigger "
      "/dev/shm "
      "(docker run --shm-size, or mount -o remount,size=... /dev/shm), or set WEFT_SHM=0 to use "
      "TCP between the ranks of a host",
      static_cast<double>(size) / kMiB, size, std::strerror(ENOSPC), room);
}

// "/name" from "name" or "/name"; refuses what shm_open would misread or reject.
std::string normalize_name(std::string_view name) {
  std::string out;
  if (!name.starts_with('/')) out.push_back('/');
  out.append(name);
  if (out.size() < 2 || out.size() - 1 > NAME_MAX || out.find('/', 1) != std::string::npos) {
    throw_error(
        ErrorCode::InvalidArgument, where(out),
        fmt::format("bad name: needs 1 to {} characters and no '/' after the first", NAME_MAX));
  }
  return out;
}

// Maps the object and makes every page cheap to write from this process. MAP_POPULATE saves the
// guest's page faults (1 per 16 pages instead of 1 per page, measured), but on these VMs the
// first user-mode write through a new mapping still costs about 13 us per 4 KiB page, even when
// the page is resident and written already by another process, and even after
// MADV_POPULATE_WRITE (measured on 64 MiB: 220 ms for the first memset, 4 ms for the second).
// Only a write from this process moves that cost here, so we write one word per page: an atomic
// add of 0, which leaves whatever a peer may have written there already intact.
std::byte* map(const std::string& name, int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) throw_errno(name, "mmap", errno);
  auto* data = static_cast<std::byte*>(p);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t offset = 0; offset < size; offset += page) {
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(data + offset))
        .fetch_add(0, std::memory_order_relaxed);
  }
  return data;
}

}  // namespace

ShmSegment ShmSegment::create(std::string_view name_in, size_t size) {
  std::string name = normalize_name(name_in);
  if (size == 0) throw_error(ErrorCode::InvalidArgument, where(name), "size must not be 0");
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw_errno(name, "shm_open(O_CREAT | O_EXCL)", errno);
  FdCloser closer(fd);
  try {
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) throw_errno(name, "ftruncate", errno);
    // Reserve the pages now: a full /dev/shm then fails here with ENOSPC instead of killing a
    // rank with SIGBUS at its first write in the middle of a collective.
    int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (err == ENOSPC) throw_error(ErrorCode::Io, where(name), no_space_text(size));
    if (err != 0) throw_errno(name, "posix_fallocate", err);
    std::byte* data = map(name, fd, size);
    return ShmSegment(std::move(name), data, size, ::getpid());
  } catch (...) {
    ::shm_unlink(name.c_str());
    throw;
  }
}

ShmSegment ShmSegment::open(std::string_view name, size_t expected_size) {
  std::optional<ShmSegment> segment = open_if_present(name, expected_size);
  if (!segment) throw_errno(normalize_name(name), "shm_open", ENOENT);
  return std::move(*segment);
}

std::optional<ShmSegment> ShmSegment::open_if_present(std::string_view name_in,
                                                      size_t expected_size) {
  std::string name = normalize_name(name_in);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  if (fd < 0) throw_errno(name, "shm_open", errno);
  FdCloser closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(name, "fstat", errno);
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    // The creator has shm_open'ed but not yet sized it: the name was published too early.
    throw_error(ErrorCode::Io, where(name), "object has size 0 (not yet sized by its creator)");
  }
  if (expected_size != 0 && size != expected_size) {
    throw_error(ErrorCode::InvalidArgument, where(name),
                fmt::format("object has {} bytes, expected {}: the ranks disagree on its layout",
                            size, expected_size));
  }
  std::byte* data = map(name, fd, size);
  return ShmSegment(std::move(name), data, size, 0);
}

ShmSegment::ShmSegment(std::string name, std::byte* data, size_t size, pid_t creator_pid)
    : name_(std::move(name)), data_(data), size_(size), creator_pid_(creator_pid) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      creator_pid_(std::exchange(other.creator_pid_, 0)),
      unlinked_(std::exchange(other.unlinked_, true)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    creator_pid_ = std::exchange(other.creator_pid_, 0);
    unlinked_ = std::exchange(other.unlinked_, true);
  }
  return *this;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  // Only the creating process removes the name: a forked child holds a copy of the handle.
  if (creator_pid_ != 0 && !unlinked_ && creator_pid_ == ::getpid()) {
    ::shm_unlink(name_.c_str());
  }
  unlinked_ = true;
}

void ShmSegment::unlink() {
  if (unlinked_) return;
  if (::shm_unlink(name_.c_str()) != 0 && errno != ENOENT) throw_errno(name_, "shm_unlink", errno);
  unlinked_ = true;
}

}  // namespace weft::tcp
