#include "weft/hash_store.h"

#include <utility>

#include "runtime/socket.h"
#include "runtime/store_common.h"

namespace weft {

using store_detail::check_timeout;
using store_detail::throw_wait_timeout;

HashStore::HashStore() = default;

HashStore::~HashStore() = default;

template <typename Ready>
bool HashStore::wait_locked(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout,
                            Ready ready) {
  // wait_until on steady_clock: a wall-clock jump neither ends the wait early nor stretches it.
  return changed_.wait_until(lock, net::deadline_after(timeout), ready);
}

std::vector<std::string> HashStore::missing_locked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (!values_.count(key) && !queues_.count(key)) missing.push_back(key);
  }
  return missing;
}

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  timeout = resolve(timeout);
  check_timeout(timeout, "hash store get");
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = values_.find(key);
  if (found == values_.end()) {
    bool ready = wait_locked(lock, timeout, [&] {
      found = values_.find(key);
      return found != values_.end();
    });
    if (!ready) throw_wait_timeout("hash store get", timeout, {key}, {key});
  }
  return found->second;
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t sum = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = values_.find(key);
    int64_t current = found == values_.end()
                          ? 0
                          : store_detail::parse_counter(found->second, "hash store add", key);
    sum = store_detail::add_counter(current, delta, "hash store add", key);
    values_[key] = store_detail::format_counter(sum);
  }
  changed_.notify_all();
  return sum;
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = values_.find(key);
  if (found == values_.end()) {
    if (!expected.empty()) return expected;
    values_.emplace(key, desired);
  } else {
    if (found->second != expected) return found->second;
    found->second = desired;
  }
  lock.unlock();
  changed_.notify_all();
  return desired;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return missing_locked(keys).empty();
}

void HashStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  timeout = resolve(timeout);
  check_timeout(timeout, "hash store wait");
  std::unique_lock<std::mutex> lock(mutex_);
  if (!wait_locked(lock, timeout, [&] { return missing_locked(keys).empty(); })) {
    throw_wait_timeout("hash store wait", timeout, keys, missing_locked(keys));
  }
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.erase(key) == 1;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(values_.size());
}

void HashStore::append(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Bytes& stored = values_[key];
    stored.insert(stored.end(), value.begin(), value.end());
  }
  changed_.notify_all();
}

std::vector<Bytes> HashStore::multi_get(const std::vector<std::string>& keys,
                                        std::chrono::milliseconds timeout) {
  timeout = resolve(timeout);
  check_timeout(timeout, "hash store multi_get");
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_set = [&] {
    for (const auto& key : keys) {
      if (!values_.count(key)) return false;
    }
    return true;
  };
  if (!wait_locked(lock, timeout, all_set)) {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (!values_.count(key)) missing.push_back(key);
    }
    throw_wait_timeout("hash store multi_get", timeout, keys, missing);
  }
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(values_.at(key));
  return values;
}

void HashStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  store_detail::check_multi_set(keys, values, "hash store multi_set");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) values_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

void HashStore::queue_push(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queues_[key].push_back(value);
  }
  changed_.notify_all();
}

Bytes HashStore::queue_pop(const std::string& key, bool block, std::chrono::milliseconds timeout) {
  timeout = block ? resolve(timeout) : std::chrono::milliseconds(0);
  check_timeout(timeout, "hash store queue_pop");
  std::unique_lock<std::mutex> lock(mutex_);
  if (!wait_locked(lock, timeout, [&] { return queues_.count(key) != 0; })) {
    if (!block) {
      throw_error(ErrorCode::Timeout, "hash store queue_pop",
                  fmt::format("queue \"{}\" is empty (block=false)", key));
    }
    throw_error(
        ErrorCode::Timeout, "hash store queue_pop",
        fmt::format("after {} ms waiting for a value in queue \"{}\"", timeout.count(), key));
  }
  auto found = queues_.find(key);
  Bytes value = std::move(found->second.front());
  found->second.pop_front();
  if (found->second.empty()) queues_.erase(found);
  return value;
}

int64_t HashStore::queue_len(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = queues_.find(key);
  return found == queues_.end() ? 0 : static_cast<int64_t>(found->second.size());
}

}  // namespace weft
