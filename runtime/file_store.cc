#include "weft/file_store.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/log.h"
#include "runtime/socket.h"
#include "runtime/store_common.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Longest key a FileStore writes. Keys are names, not data; the bound also lets the constructor
// tell a store file from some other file by its first record's key length.
constexpr uint32_t kMaxKeyBytes = 1 << 20;
// How long a call may go past its own deadline to get the file lock, so that a wait ending while
// another process appends a record still reads it rather than failing on the lock.
constexpr auto kLockGrace = 100ms;

// The key prefixes of the log's records (see file_store.h).
constexpr std::string_view kSetPrefix = "/";
constexpr std::string_view kDeletePrefix = "-/";
constexpr std::string_view kPushPrefix = "+/";
constexpr std::string_view kPopPrefix = "^/";
constexpr std::string_view kCleanupKey = "cleanup/";
constexpr std::string_view kRefCountKey = "refcount/";

bool starts_with(const std::string& text, std::string_view prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string errno_text(int error) { return fmt::format("{} (errno {})", strerror(error), error); }

void put_u32(Bytes& out, uint32_t value) {
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<uint8_t>(value >> shift));
}

uint32_t get_u32(const uint8_t* in) {
  return uint32_t{in[0]} | uint32_t{in[1]} << 8 | uint32_t{in[2]} << 16 | uint32_t{in[3]} << 24;
}

void read_at(int fd, uint8_t* data, size_t size, off_t offset, const std::string& where) {
  while (size > 0) {
    ssize_t got = ::pread(fd, data, size, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_error(ErrorCode::Io, where, "read: " + errno_text(errno));
    if (got == 0) throw_error(ErrorCode::Io, where, "read: the file ended early");
    data += got;
    size -= static_cast<size_t>(got);
    offset += got;
  }
}

void write_at(int fd, const uint8_t* data, size_t size, off_t offset, const std::string& where) {
  while (size > 0) {
    ssize_t put = ::pwrite(fd, data, size, offset);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) throw_error(ErrorCode::Io, where, "write: " + errno_text(errno));
    data += put;
    size -= static_cast<size_t>(put);
    offset += put;
  }
}

// Whether a file whose first bytes are head[0..n) (n <= 5) and whose size is `size` can be a
// store log: empty, a first record cut off by a killed writer, or a first key of a plausible
// length that starts like one of the record kinds.
bool looks_like_store_file(const uint8_t* head, size_t n, off_t size) {
  if (size == 0 || n < 4) return true;
  uint32_t key_bytes = get_u32(head);
  if (key_bytes == 0 || key_bytes > kMaxKeyBytes) return false;
  return n < 5 || std::string_view("/-+^cr").find(static_cast<char>(head[4])) != std::string::npos;
}

}  // namespace

// Holds a flock(2) on a file until destroyed.
class FileStore::FileLock {
 public:
  FileLock(int fd, int operation, Clock::time_point deadline, const std::string& where) {
    // LOCK_NB with backoff rather than a blocking flock: a process stopped while holding the
    // lock must cost this call its timeout, not hang it. Holders keep it for microseconds, so
    // the first pauses are short.
    auto pause = std::chrono::microseconds(50);
    while (::flock(fd, operation | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) throw_error(ErrorCode::Io, where, "flock: " + errno_text(errno));
      auto now = Clock::now();
      if (now >= deadline) {
        throw_error(ErrorCode::Timeout, where,
                    "the file stayed locked by another process past the deadline (is one "
                    "stopped or stuck?)");
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min<std::chrono::microseconds>(pause * 2, 10ms);
    }
    fd_ = fd;
  }
  ~FileLock() {
    if (fd_ >= 0) ::flock(fd_, LOCK_UN);
  }
  FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;

 private:
  int fd_ = -1;
};

FileStore::FileStore(std::string path, int num_workers)
    : path_(std::move(path)), num_workers_(num_workers) {
  if (num_workers_ == 0 || num_workers_ < -1) {
    throw_error(ErrorCode::InvalidArgument, where("open"),
                fmt::format("num_workers is {}: pass how many FileStores share the file, or -1 "
                            "to keep the file when they are gone",
                            num_workers_));
  }
  std::lock_guard<std::mutex> guard(mutex_);
  open_locked("open");
  bool store_file = false;
  try {
    FileLock lock(fd_, LOCK_SH, net::deadline_after(timeout()), where("open"));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_error(ErrorCode::Io, where("open"), errno_text(errno));
    uint8_t head[5] = {};
    size_t n = static_cast<size_t>(std::min<off_t>(st.st_size, sizeof(head)));
    read_at(fd_, head, n, 0, where("open"));
    store_file = looks_like_store_file(head, n, st.st_size);
  } catch (...) {
    ::close(fd_);
    throw;
  }
  if (!store_file) {
    ::close(fd_);
    throw_error(ErrorCode::InvalidArgument, where("open"),
                "the file exists but is not a store file (its first record is not a store "
                "key); refusing to write to it");
  }
  try {
    FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "open");
    append_locked({count_locked(kRefCountKey, 1, "open")}, "open");
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

FileStore::~FileStore() {
  std::lock_guard<std::mutex> guard(mutex_);
  try {
    // Someone (a test's cleanup, the last of several PyTorch workers) already removed it.
    if (::access(path_.c_str(), F_OK) == 0) {
      FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "close");
      Record finished = count_locked(kCleanupKey, 1, "close");
      Record references = count_locked(kRefCountKey, -1, "close");
      append_locked({finished, references}, "close");
      // c10d's rule: the last reference goes, and at least num_workers have finished.
      if (num_workers_ > 0 && to_string(references.second) == "0" &&
          store_detail::parse_counter(finished.second, where("close"), finished.first) >=
              num_workers_) {
        ::unlink(path_.c_str());
      }
    }
  } catch (const std::exception& e) {
    WEFT_LOG_WARN("{}", e.what());
  }
  ::close(fd_);
}

FileStore::Record FileStore::count_locked(std::string_view counter, int64_t delta, const char* op) {
  std::string key(counter);
  auto it = bookkeeping_.find(key);
  int64_t current =
      it == bookkeeping_.end() ? 0 : store_detail::parse_counter(it->second, where(op), key);
  return {key,
          store_detail::format_counter(store_detail::add_counter(current, delta, where(op), key))};
}

std::string FileStore::where(const char* op) const {
  return fmt::format("file store {} {}", path_, op);
}

void FileStore::open_locked(const char* op) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_error(ErrorCode::Io, where(op), "open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    int error = errno;
    ::close(fd_);
    fd_ = -1;
    throw_error(ErrorCode::Io, where(op), "fstat: " + errno_text(error));
  }
  fd_pid_ = ::getpid();
  inode_ = st.st_ino;
  device_ = st.st_dev;
}

FileStore::FileLock FileStore::lock_and_refresh_locked(bool exclusive, Clock::time_point deadline,
                                                       const char* op) {
  if (fd_pid_ != ::getpid()) open_locked(op);
  FileLock lock(fd_, exclusive ? LOCK_EX : LOCK_SH, deadline, where(op));
  struct stat by_path {};
  if (::stat(path_.c_str(), &by_path) != 0 || by_path.st_ino != inode_ ||
      by_path.st_dev != device_) {
    throw_error(ErrorCode::Io, where(op), "the file was deleted or replaced while in use");
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_error(ErrorCode::Io, where(op), errno_text(errno));
  if (st.st_size < pos_) {
    throw_error(ErrorCode::Io, where(op),
                fmt::format("the file shrank from {} to {} bytes: something else rewrote it", pos_,
                            st.st_size));
  }
  if (st.st_size == pos_) return lock;

  Bytes unread(static_cast<size_t>(st.st_size - pos_));
  read_at(fd_, unread.data(), unread.size(), pos_, where(op));
  size_t used = 0;
  while (unread.size() - used >= 4) {
    const uint8_t* record = unread.data() + used;
    uint64_t left = unread.size() - used;
    uint64_t key_bytes = get_u32(record);
    if (left < 8 + key_bytes) break;
    uint64_t value_bytes = get_u32(record + 4 + key_bytes);
    if (left < 8 + key_bytes + value_bytes) break;
    std::string key(reinterpret_cast<const char*>(record + 4), key_bytes);
    const uint8_t* value = record + 8 + key_bytes;
    apply(key, Bytes(value, value + value_bytes));
    used += 8 + key_bytes + value_bytes;
  }
  pos_ += static_cast<off_t>(used);
  if (exclusive && pos_ < st.st_size) {
    // Writers append only under the exclusive lock, which we hold: these bytes are what a writer
    // that died mid-append left. Cut them so that the next record starts where readers look.
    WEFT_LOG_WARN(
        "{}: dropping {} bytes of an incomplete record at offset {} (a writer died "
        "mid-append)",
        where(op), st.st_size - pos_, pos_);
    if (::ftruncate(fd_, pos_) != 0) {
      throw_error(ErrorCode::Io, where(op), "ftruncate: " + errno_text(errno));
    }
  }
  return lock;
}

void FileStore::append_locked(const std::vector<Record>& records, const char* op) {
  Bytes out;
  for (const auto& [key, value] : records) {
    // Checked before anything is written, so a refused call leaves the log unchanged.
    if (key.size() > kMaxKeyBytes) {
      throw_error(
          ErrorCode::InvalidArgument, where(op),
          fmt::format("key of {} bytes is longer than the limit, {}", key.size(), kMaxKeyBytes));
    }
    if (value.size() > std::numeric_limits<uint32_t>::max()) {
      throw_error(ErrorCode::InvalidArgument, where(op),
                  fmt::format("value of {} bytes for key \"{}\" does not fit the file format's "
                              "u32 length",
                              value.size(), key));
    }
    put_u32(out, static_cast<uint32_t>(key.size()));
    out.insert(out.end(), key.begin(), key.end());
    put_u32(out, static_cast<uint32_t>(value.size()));
    out.insert(out.end(), value.begin(), value.end());
  }
  try {
    write_at(fd_, out.data(), out.size(), pos_, where(op));
  } catch (const Error&) {
    // Best effort: leave no half record (the next writer would cut it anyway).
    (void)::ftruncate(fd_, pos_);
    throw;
  }
  pos_ += static_cast<off_t>(out.size());
  for (const auto& [key, value] : records) apply(key, value);
}

void FileStore::apply(const std::string& key, Bytes value) {
  if (starts_with(key, kSetPrefix)) {
    values_[key.substr(kSetPrefix.size())] = std::move(value);
  } else if (starts_with(key, kDeletePrefix)) {
    values_.erase(key.substr(kDeletePrefix.size()));
  } else if (starts_with(key, kPushPrefix)) {
    queues_[key.substr(kPushPrefix.size())].push_back(std::move(value));
  } else if (starts_with(key, kPopPrefix)) {
    auto queue = queues_.find(key.substr(kPopPrefix.size()));
    if (queue != queues_.end()) {
      queue->second.pop_front();
      if (queue->second.empty()) queues_.erase(queue);
    }
  } else if (key == kCleanupKey || key == kRefCountKey) {
    bookkeeping_[key] = std::move(value);
  }
}

template <typename Attempt>
bool FileStore::poll(std::chrono::milliseconds timeout, Attempt attempt) {
  auto deadline = net::deadline_after(timeout);
  auto pause = 1ms;  // doubling to 50 ms: a few looks per second at worst, per waiter
  while (true) {
    auto lock_deadline = deadline == Clock::time_point::max() ? deadline : deadline + kLockGrace;
    if (attempt(lock_deadline)) return true;
    auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min<std::chrono::milliseconds>(pause * 2, 50ms);
  }
}

std::vector<std::string> FileStore::missing_locked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (!values_.count(key) && !queues_.count(key)) missing.push_back(key);
  }
  return missing;
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "set");
  append_locked({{std::string(kSetPrefix) + key, value}}, "set");
}

Bytes FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  timeout = resolve(timeout);
  store_detail::check_timeout(timeout, where("get"));
  Bytes value;
  bool found = poll(timeout, [&](Clock::time_point deadline) {
    std::lock_guard<std::mutex> guard(mutex_);
    FileLock lock = lock_and_refresh_locked(false, deadline, "get");
    auto it = values_.find(key);
    if (it == values_.end()) return false;
    value = it->second;
    return true;
  });
  if (!found) store_detail::throw_wait_timeout(where("get"), timeout, {key}, {key});
  return value;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "add");
  auto it = values_.find(key);
  int64_t current =
      it == values_.end() ? 0 : store_detail::parse_counter(it->second, where("add"), key);
  int64_t sum = store_detail::add_counter(current, delta, where("add"), key);
  append_locked({{std::string(kSetPrefix) + key, store_detail::format_counter(sum)}}, "add");
  return sum;
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "compare_set");
  auto it = values_.find(key);
  if (it == values_.end() && !expected.empty()) return expected;
  if (it != values_.end() && it->second != expected) return it->second;
  append_locked({{std::string(kSetPrefix) + key, desired}}, "compare_set");
  return desired;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(false, net::deadline_after(timeout()), "check");
  return missing_locked(keys).empty();
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  timeout = resolve(timeout);
  store_detail::check_timeout(timeout, where("wait"));
  std::vector<std::string> missing;
  bool done = poll(timeout, [&](Clock::time_point deadline) {
    std::lock_guard<std::mutex> guard(mutex_);
    FileLock lock = lock_and_refresh_locked(false, deadline, "wait");
    missing = missing_locked(keys);
    return missing.empty();
  });
  if (!done) store_detail::throw_wait_timeout(where("wait"), timeout, keys, missing);
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "delete_key");
  if (!values_.count(key)) return false;
  append_locked({{std::string(kDeletePrefix) + key, {}}}, "delete_key");
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(false, net::deadline_after(timeout()), "num_keys");
  return static_cast<int64_t>(values_.size());
}

void FileStore::append(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "append");
  Bytes joined;
  if (auto it = values_.find(key); it != values_.end()) joined = it->second;
  joined.insert(joined.end(), value.begin(), value.end());
  append_locked({{std::string(kSetPrefix) + key, std::move(joined)}}, "append");
}

std::vector<Bytes> FileStore::multi_get(const std::vector<std::string>& keys,
                                        std::chrono::milliseconds timeout) {
  timeout = resolve(timeout);
  store_detail::check_timeout(timeout, where("multi_get"));
  std::vector<Bytes> values;
  std::vector<std::string> missing;
  bool done = poll(timeout, [&](Clock::time_point deadline) {
    std::lock_guard<std::mutex> guard(mutex_);
    FileLock lock = lock_and_refresh_locked(false, deadline, "multi_get");
    missing.clear();
    for (const auto& key : keys) {
      if (!values_.count(key)) missing.push_back(key);
    }
    if (!missing.empty()) return false;
    values.clear();
    for (const auto& key : keys) values.push_back(values_.at(key));
    return true;
  });
  if (!done) store_detail::throw_wait_timeout(where("multi_get"), timeout, keys, missing);
  return values;
}

void FileStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  store_detail::check_multi_set(keys, values, where("multi_set"));
  std::vector<Record> records;
  records.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    records.emplace_back(std::string(kSetPrefix) + keys[i], values[i]);
  }
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "multi_set");
  append_locked(records, "multi_set");
}

void FileStore::queue_push(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(true, net::deadline_after(timeout()), "queue_push");
  append_locked({{std::string(kPushPrefix) + key, value}}, "queue_push");
}

Bytes FileStore::queue_pop(const std::string& key, bool block, std::chrono::milliseconds timeout) {
  timeout = block ? resolve(timeout) : 0ms;
  store_detail::check_timeout(timeout, where("queue_pop"));
  Bytes value;
  bool popped = poll(timeout, [&](Clock::time_point deadline) {
    std::lock_guard<std::mutex> guard(mutex_);
    {
      // Look under the shared lock first: waiting pops must not queue up on the exclusive one.
      FileLock lock = lock_and_refresh_locked(false, deadline, "queue_pop");
      if (!queues_.count(key)) return false;
    }
    FileLock lock = lock_and_refresh_locked(true, deadline, "queue_pop");
    auto queue = queues_.find(key);
    if (queue == queues_.end()) return false;  // another process popped it in between
    value = queue->second.front();
    append_locked({{std::string(kPopPrefix) + key, {}}}, "queue_pop");
    return true;
  });
  if (!popped) {
    if (!block) {
      throw_error(ErrorCode::Timeout, where("queue_pop"),
                  fmt::format("queue \"{}\" is empty (block=false)", key));
    }
    throw_error(
        ErrorCode::Timeout, where("queue_pop"),
        fmt::format("after {} ms waiting for a value in queue \"{}\"", timeout.count(), key));
  }
  return value;
}

int64_t FileStore::queue_len(const std::string& key) {
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock = lock_and_refresh_locked(false, net::deadline_after(timeout()), "queue_len");
  auto queue = queues_.find(key);
  return queue == queues_.end() ? 0 : static_cast<int64_t>(queue->second.size());
}

}  // namespace weft
