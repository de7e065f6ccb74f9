#include "runtime/abortable_store.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "weft/error.h"

namespace weft {

void AbortSignal::raise(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (raised_.load(std::memory_order_relaxed)) return;
  reason_ = reason;
  raised_.store(true, std::memory_order_release);
}

std::string AbortSignal::describe() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fmt::format("{} was aborted: {}", owner_, reason_);
}

AbortableStore::AbortableStore(std::shared_ptr<Store> store,
                               std::vector<std::shared_ptr<const AbortSignal>> signals)
    : store_(std::move(store)), signals_(std::move(signals)) {
  if (!store_) throw_error(ErrorCode::InvalidArgument, "abortable store", "no underlying store");
  set_timeout(store_->timeout());
}

AbortableStore::~AbortableStore() = default;

void AbortableStore::check_signals(const char* op) const {
  for (const auto& signal : signals_) {
    if (signal->raised()) {
      throw_error(ErrorCode::Aborted, fmt::format("store {}", op),
                  "stopped waiting: " + signal->describe());
    }
  }
}

template <typename Call>
auto AbortableStore::sliced(const char* op, std::chrono::milliseconds timeout, Call&& call) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    check_signals(op);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      return call(std::clamp(left, std::chrono::milliseconds(0), kSlice));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Timeout) throw;
      if (left > kSlice) continue;
      // The last slice timed out: its message gives that slice's length, not the wait's.
      if (timeout <= kSlice) throw;
      throw Error(ErrorCode::Timeout,
                  fmt::format("{} [the whole wait: {} ms, in slices of {} ms so that an abort "
                              "can end it]",
                              e.what(), timeout.count(), kSlice.count()));
    }
  }
}

void AbortableStore::set(const std::string& key, const Bytes& value) { store_->set(key, value); }

Bytes AbortableStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  sliced("get", resolve(timeout), [&](auto slice) { store_->wait({key}, slice); });
  return store_->get(key, Store::timeout());
}

int64_t AbortableStore::add(const std::string& key, int64_t delta) {
  return store_->add(key, delta);
}

Bytes AbortableStore::compare_set(const std::string& key, const Bytes& expected,
                                  const Bytes& desired) {
  return store_->compare_set(key, expected, desired);
}

bool AbortableStore::check(const std::vector<std::string>& keys) { return store_->check(keys); }

void AbortableStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  sliced("wait", resolve(timeout), [&](auto slice) { store_->wait(keys, slice); });
}

bool AbortableStore::delete_key(const std::string& key) { return store_->delete_key(key); }

int64_t AbortableStore::num_keys() { return store_->num_keys(); }

void AbortableStore::append(const std::string& key, const Bytes& value) {
  store_->append(key, value);
}

std::vector<Bytes> AbortableStore::multi_get(const std::vector<std::string>& keys,
                                             std::chrono::milliseconds timeout) {
  sliced("multi_get", resolve(timeout), [&](auto slice) { store_->wait(keys, slice); });
  return store_->multi_get(keys, Store::timeout());
}

void AbortableStore::multi_set(const std::vector<std::string>& keys,
                               const std::vector<Bytes>& values) {
  store_->multi_set(keys, values);
}

void AbortableStore::queue_push(const std::string& key, const Bytes& value) {
  store_->queue_push(key, value);
}

Bytes AbortableStore::queue_pop(const std::string& key, bool block,
                                std::chrono::milliseconds timeout) {
  if (!block) return store_->queue_pop(key, false, timeout);
  return sliced("queue_pop", resolve(timeout),
                [&](auto slice) { return store_->queue_pop(key, true, slice); });
}

int64_t AbortableStore::queue_len(const std::string& key) { return store_->queue_len(key); }

}  // namespace weft
