#include "runtime/store_state.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <utility>

namespace weft {
namespace {

// std::stoll's reading of text (what PyTorch's ADD uses), without exceptions: leading white space,
// an optional sign, then at least one decimal digit; whatever follows the digits is ignored.
std::optional<int64_t> parse_like_stoll(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  size_t first_digit = i;
  // Accumulate as a negative number so that INT64_MIN fits.
  int64_t value = 0;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    int digit = text[i] - '0';
    if (value < (kMin + digit) / 10) return std::nullopt;
    value = value * 10 - digit;
  }
  if (i == first_digit) return std::nullopt;
  if (!negative) {
    if (value == kMin) return std::nullopt;
    value = -value;
  }
  return value;
}

}  // namespace

void StoreState::set(const std::string& key, std::string value) {
  auto [it, inserted] = values_.try_emplace(key);
  value_bytes_ += value.size() - (inserted ? 0 : it->second.size());
  it->second = std::move(value);
  wake_all(key);
}

std::string StoreState::compare_set(const std::string& key, const std::string& expected,
                                    std::string desired) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    // PyTorch answers `expected` when the key is absent and expected is not empty: the caller
    // cannot tell this from success, which is PyTorch's documented quirk, kept for compatibility.
    if (!expected.empty()) return expected;
    set(key, desired);
    return desired;
  }
  if (it->second == expected) {
    value_bytes_ += desired.size() - it->second.size();
    it->second = std::move(desired);
  }
  return it->second;
}

const std::string* StoreState::get(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::optional<int64_t> StoreState::add(const std::string& key, int64_t delta) {
  int64_t sum = delta;
  auto it = values_.find(key);
  if (it != values_.end()) {
    std::optional<int64_t> current = parse_like_stoll(it->second);
    if (!current || __builtin_add_overflow(*current, delta, &sum)) return std::nullopt;
  }
  set(key, std::to_string(sum));
  return sum;
}

void StoreState::append(const std::string& key, const std::string& value) {
  auto [it, inserted] = values_.try_emplace(key);
  (void)inserted;
  it->second.append(value);
  value_bytes_ += value.size();
  wake_all(key);
}

int64_t StoreState::delete_key(const std::string& key) {
  auto it = values_.find(key);
  if (it == values_.end()) return 0;
  value_bytes_ -= it->second.size();
  values_.erase(it);
  return 1;
}

bool StoreState::exists(const std::string& key) const {
  if (values_.count(key) != 0) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool StoreState::all_exist(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [this](const std::string& k) { return exists(k); });
}

void StoreState::queue_push(const std::string& key, std::string value) {
  value_bytes_ += value.size();
  queues_[key].push_back(std::move(value));
  auto w = waiters_.find(key);
  if (w == waiters_.end()) return;
  ConnectionId first = w->second.front();
  w->second.erase(w->second.begin());
  if (w->second.empty()) waiters_.erase(w);
  key_arrived(first);
}

int64_t StoreState::queue_pop(const std::string& key, std::string* value) {
  auto q = queues_.find(key);
  if (q == queues_.end()) return 0;
  auto length = static_cast<int64_t>(q->second.size());
  *value = std::move(q->second.front());
  q->second.pop_front();
  value_bytes_ -= value->size();
  // Empty queues are dropped (PyTorch keeps them) so that popping many names cannot grow memory.
  if (q->second.empty()) queues_.erase(q);
  return length;
}

int64_t StoreState::queue_len(const std::string& key) const {
  auto q = queues_.find(key);
  return q == queues_.end() ? 0 : static_cast<int64_t>(q->second.size());
}

bool StoreState::park(ConnectionId id, const std::vector<std::string>& keys) {
  if (all_exist(keys)) return true;
  unpark(id);
  ParkedWait wait;
  for (const std::string& key : keys) {
    // Keys present now are not awaited. A missing key listed twice is listed twice in waiters_,
    // and one SET of it counts both, as in PyTorch.
    if (exists(key)) continue;
    waiters_[key].push_back(id);
    wait.keys.push_back(key);
    ++wait.missing;
  }
  waits_.emplace(id, std::move(wait));
  return false;
}

void StoreState::unpark(ConnectionId id) {
  auto it = waits_.find(id);
  if (it == waits_.end()) return;
  for (const std::string& key : it->second.keys) {
    auto w = waiters_.find(key);
    if (w == waiters_.end()) continue;
    auto& ids = w->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) waiters_.erase(w);
  }
  waits_.erase(it);
}

std::vector<StoreState::ConnectionId> StoreState::take_woken() {
  std::vector<ConnectionId> out;
  out.swap(woken_);
  return out;
}

void StoreState::wake_all(const std::string& key) {
  auto w = waiters_.find(key);
  if (w == waiters_.end()) return;
  std::vector<ConnectionId> ids = std::move(w->second);
  waiters_.erase(w);
  for (ConnectionId id : ids) key_arrived(id);
}

void StoreState::key_arrived(ConnectionId id) {
  auto it = waits_.find(id);
  if (it == waits_.end()) return;
  if (--it->second.missing > 0) return;
  // Every listing is already out of waiters_: each one was removed as its key arrived.
  waits_.erase(it);
  woken_.push_back(id);
}

}  // namespace weft
