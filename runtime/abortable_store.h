// runtime/abortable_store.h: a Store whose blocking calls end when a process group is aborted.
//
// Making a sub-group waits in the store for every member to publish its address. A member that
// never calls new_group() leaves the others waiting until the timeout; ProcessGroup::abort() on
// the parent, from another thread, must end that wait at once. The TCPStore's waits cannot be
// interrupted from outside, so an AbortableStore waits in slices (kSlice) and looks at its
// AbortSignals between them. Slices cost nothing while keys arrive in time: a wait returns as
// soon as its keys are set; only a wait that outlasts a slice pays one WAIT/CANCEL round trip
// per slice.
//
// Thread safety: as the underlying store. AbortSignal may be raised from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "weft/store.h"

namespace weft {

// Raised once, by ProcessGroup::abort(); read by every AbortableStore over that group's keys.
class AbortSignal {
 public:
  // `owner` names the group in messages: "rank 1/4 group \"world\"".
  explicit AbortSignal(std::string owner) : owner_(std::move(owner)) {}

  void raise(const std::string& reason);
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  // "rank 1/4 group \"world\" was aborted: <reason>". REQUIRES: raised().
  std::string describe() const;

 private:
  const std::string owner_;
  std::atomic<bool> raised_{false};
  mutable std::mutex mutex_;
  std::string reason_;  // guarded by mutex_
};

class AbortableStore final : public Store {
 public:
  // The longest single wait in the underlying store: the latency of an abort.
  static constexpr std::chrono::milliseconds kSlice{100};

  // Blocking calls throw Error(Aborted) once any of `signals` is raised.
  AbortableStore(std::shared_ptr<Store> store,
                 std::vector<std::shared_ptr<const AbortSignal>> signals);
  ~AbortableStore() override;

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
  std::string local_address() const override { return store_->local_address(); }

  using Store::set;

 private:
  // Throws Error(Aborted) naming `op` when a signal is raised.
  void check_signals(const char* op) const;
  // Runs call(slice) until it returns, with slices of at most kSlice adding up to `timeout`,
  // checking the signals before each; a Timeout from the last slice is the caller's.
  template <typename Call>
  auto sliced(const char* op, std::chrono::milliseconds timeout, Call&& call);

  const std::shared_ptr<Store> store_;
  const std::vector<std::shared_ptr<const AbortSignal>> signals_;
};

}  // namespace weft
