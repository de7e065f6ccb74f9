// runtime/store_state.h: StoreState, the data behind a TCPStore server: the key-value map, the
// queues, and the WAIT queries parked until their keys exist.
//
// The semantics are PyTorch's (TCPStoreLibUvBackend.cpp, the default server since 2.4), including
// its odd corners, so that a PyTorch client sees the same answers from a weft server; where
// PyTorch's behaviour is undefined (ADD on a non-integer, an overflowing ADD) the operation
// reports failure and the server closes the connection. docs/store-protocol.md lists every case.
//
// Waiters are identified by the server's connection ids; the state never touches sockets. An
// operation that makes keys exist appends the ids of the waits it completed to woken(), which the
// caller drains (take_woken()) and answers with STOP_WAITING.
//
// Thread safety: none; owned and used by the server's loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace weft {

class StoreState {
 public:
  using ConnectionId = uint64_t;

  // SET and each pair of MULTI_SET: stores value, then wakes waiters on key.
  void set(const std::string& key, std::string value);
  // COMPARE_SET (PyTorch's three cases): key absent and expected empty: stores desired and returns
  // it; key absent and expected non-empty: stores nothing and returns expected; key present:
  // replaces the value iff it equals expected, and returns the value now stored.
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired);
  // GET and MULTI_GET: the value, or nullptr when absent (answered as empty, as PyTorch does).
  const std::string* get(const std::string& key) const;
  // ADD: parses the stored value as std::stoll would (leading spaces, sign, digits; trailing bytes
  // ignored), adds delta and stores the sum as decimal text. nullopt when the stored value has no
  // number or the sum overflows int64 (PyTorch: an exception or undefined behaviour); then
  // nothing changes.
  std::optional<int64_t> add(const std::string& key, int64_t delta);
  // APPEND: appends to the value (creating it), then wakes waiters on key.
  void append(const std::string& key, const std::string& value);
  // DELETE_KEY: 1 when the key existed, else 0. Waiters are not affected.
  int64_t delete_key(const std::string& key);
  // GETNUMKEYS: keys in the map (queues are not counted, as in PyTorch).
  int64_t num_keys() const { return static_cast<int64_t>(values_.size()); }

  // A key "exists" for CHECK and WAIT when it is in the map or names a non-empty queue.
  bool exists(const std::string& key) const;
  bool all_exist(const std::vector<std::string>& keys) const;

  // QUEUE_PUSH: appends to the queue, and completes at most one waiter on it (each push feeds
  // one pop, as PyTorch's wakeupOneWaitingClient intends).
  void queue_push(const std::string& key, std::string value);
  // QUEUE_POP: the length before the pop, and the popped value when it was non-zero.
  int64_t queue_pop(const std::string& key, std::string* value);
  int64_t queue_len(const std::string& key) const;

  // WAIT: true when every key exists already (answer now); otherwise parks the connection's wait
  // until each missing key has been set once. A connection has at most one parked wait.
  bool park(ConnectionId id, const std::vector<std::string>& keys);
  // CANCEL_WAIT and connection close: forgets the connection's parked wait, if any.
  void unpark(ConnectionId id);
  bool parked(ConnectionId id) const { return waits_.count(id) != 0; }
  size_t parked_count() const { return waits_.size(); }

  // Connections whose waits completed since the last call, in completion order.
  std::vector<ConnectionId> take_woken();

  size_t value_bytes() const { return value_bytes_; }

 private:
  struct ParkedWait {
    size_t missing = 0;             // keys (with repeats) not yet set since parking
    std::vector<std::string> keys;  // the keys it is listed under in waiters_
  };

  // A key was written: every waiter on it counts it.
  void wake_all(const std::string& key);
  void key_arrived(ConnectionId id);

  std::unordered_map<std::string, std::string> values_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  size_t value_bytes_ = 0;

  // key -> connections waiting on it, oldest first (a connection appears once per repeat).
  std::unordered_map<std::string, std::vector<ConnectionId>> waiters_;
  std::unordered_map<ConnectionId, ParkedWait> waits_;
  std::vector<ConnectionId> woken_;
};

}  // namespace weft
