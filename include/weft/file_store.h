// weft/file_store.h: a Store kept in one file that every process of a job opens.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "weft/store.h"

namespace weft {

// A FileStore keeps its keys in a file that all processes of a job share: processes on one host,
// or on several hosts when the file is on a shared filesystem with working flock(2) (NFSv4,
// Lustre, GPFS). No server runs; rendezvous is `file:///path`.
//
// The file is an append-only log in c10d's FileStore format, byte for byte, so weft and PyTorch
// processes can share one. Each record is a key and a value, each as a u32 little-endian length
// then its bytes. A key "/k" sets k; "-/k" deletes k; "refcount/" counts the FileStores open on
// the file and "cleanup/" those destroyed so far. weft adds "+/k" (push a value on k's queue)
// and "^/k" (pop k's queue): PyTorch 2.6 does not read queues and would count those records
// among its num_keys (it counts "refcount/" and "cleanup/" there too; weft counts only "/k").
// Other keys are skipped.
// Writers hold an exclusive flock while they append, readers a shared one; every FileStore
// replays the records it has not seen yet into an in-memory cache before answering.
//
// A writer killed mid-append leaves an incomplete record at the end of the file. Readers ignore
// it, and the next writer, which holds the exclusive lock and so knows that no live writer is
// mid-append, cuts it off before appending (and logs a warning).
//
// Waits (get, wait, multi_get, blocking queue_pop) poll the file, 1 ms doubling to 50 ms between
// looks, rather than using inotify, which shared filesystems do not support. Locking a file that
// a stopped process holds fails with Error(Timeout) after the call's timeout, never hangs.
//
// Cleanup, as c10d's: each FileStore adds 1 to "refcount/" when made and, when destroyed, 1 to
// "cleanup/" and -1 to "refcount/"; the one that leaves no reference behind, once at least
// num_workers (> 0) have finished, deletes the file. The log is never compacted: it grows by one
// record per set, add, delete, push and pop, which suits rendezvous (a few records per rank), not
// a store written in a loop for hours.
//
// Thread safety: every method may be called from any thread; a mutex serialises this object's
// use of the file and its cache. A FileStore created before fork() reopens the file in the child
// on first use, since flock between a parent and child sharing one open file would not exclude.
// The file must not be deleted or replaced while a FileStore uses it: calls then throw Error(Io).
// Timeouts: as HashStore (0 checks once; negative ones are InvalidArgument).
class FileStore final : public Store {
 public:
  // Opens path, creating the file when absent. Throws Error(Io) when it cannot be opened, and
  // Error(InvalidArgument) when it exists but does not start like a store file (so that a typo'd
  // path never has its file appended to or cut).
  explicit FileStore(std::string path, int num_workers = -1);
  // Counts this FileStore out (see Cleanup above) and deletes the file when it was the last.
  // Errors are logged, never thrown.
  ~FileStore() override;

  const std::string& path() const { return path_; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = kDefaultTimeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout = kDefaultTimeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void queue_push(const std::string& key, const Bytes& value) override;
  Bytes queue_pop(const std::string& key, bool block = true,
                  std::chrono::milliseconds timeout = kDefaultTimeout) override;
  int64_t queue_len(const std::string& key) override;

  using Store::set;

 private:
  using Record = std::pair<std::string, Bytes>;  // (key as in the file, value)
  class FileLock;

  // "file store <path> <op>", for messages.
  std::string where(const char* op) const;
  // Opens path_ into fd_ (again, after a fork). REQUIRES: mutex_ held.
  void open_locked(const char* op);
  // Locks the file (shared or exclusive; Error(Timeout) past deadline) and replays the records
  // appended since pos_. REQUIRES: mutex_ held.
  FileLock lock_and_refresh_locked(bool exclusive, std::chrono::steady_clock::time_point deadline,
                                   const char* op);
  // Appends records at the end of the log and applies them to the cache. REQUIRES: mutex_ held
  // and the exclusive lock taken by lock_and_refresh_locked (so pos_ is the end of the file).
  void append_locked(const std::vector<Record>& records, const char* op);
  // The record that adds delta to the counter at raw key `counter` ("refcount/").
  // REQUIRES: as append_locked.
  Record count_locked(std::string_view counter, int64_t delta, const char* op);
  // Applies one record to the cache.
  void apply(const std::string& key, Bytes value);
  // Calls attempt() (which locks what it needs) until it returns true, sleeping with backoff
  // between calls; false when timeout passes first.
  template <typename Attempt>
  bool poll(std::chrono::milliseconds timeout, Attempt attempt);
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys) const;

  const std::string path_;
  const int num_workers_;

  std::mutex mutex_;
  // Guarded by mutex_.
  int fd_ = -1;
  pid_t fd_pid_ = -1;  // the process that opened fd_
  ino_t inode_ = 0;    // fd_'s inode, to notice the path being replaced
  dev_t device_ = 0;
  off_t pos_ = 0;  // the log's first pos_ bytes are complete records, all applied below
  std::unordered_map<std::string, Bytes> values_;              // "/k" records, keyed by k
  std::unordered_map<std::string, std::deque<Bytes>> queues_;  // non-empty queues only
  std::unordered_map<std::string, Bytes> bookkeeping_;         // "cleanup/" and "refcount/"
};

}  // namespace weft
