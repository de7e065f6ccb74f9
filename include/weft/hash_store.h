// weft/hash_store.h: a Store held in this process's memory.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/store.h"

namespace weft {

// A HashStore is a Store whose keys live in this process's memory, like c10d's HashStore: for
// tests, and for a group of threads (not processes) that rendezvous with each other. Its contents
// die with it.
//
// Thread safety: every method may be called from any thread; one mutex guards all state and one
// condition variable wakes every waiter on each change (waiters re-check their own keys), so a
// blocked get, wait, multi_get or queue_pop costs no CPU until something changes or its deadline
// passes.
// Timeouts: a timeout of 0 checks once and throws Error(Timeout) if the keys are absent; a
// negative one other than kDefaultTimeout throws Error(InvalidArgument).
class HashStore final : public Store {
 public:
  HashStore();
  ~HashStore() override;

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
  // The keys among `keys` that check() would not find. REQUIRES: mutex_ held.
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys) const;
  // Blocks on changed_ until ready() holds or `timeout` passes; returns ready()'s last answer.
  // REQUIRES: lock holds mutex_.
  template <typename Ready>
  bool wait_locked(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout,
                   Ready ready);

  std::mutex mutex_;
  // Notified (all) whenever a key gets a value or a queue a new element. One variable for every
  // key keeps waits simple; the cost, waking waiters of other keys, is small at test scale.
  std::condition_variable changed_;
  // Guarded by mutex_.
  std::unordered_map<std::string, Bytes> values_;
  // Guarded by mutex_. An emptied queue is erased, so every entry here is non-empty.
  std::unordered_map<std::string, std::deque<Bytes>> queues_;
};

}  // namespace weft
