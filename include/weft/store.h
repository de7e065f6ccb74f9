// weft/store.h: the key-value store that ranks use to find each other.
//
// A Store maps string keys to byte values and lets a process wait until keys exist. Rendezvous,
// process-group setup and the backends exchange addresses through it. Implementations:
//   TCPStore   (weft/tcp_store.h)   a client of a TcpStoreServer or of PyTorch's TCPStore server
//   FileStore  (weft/file_store.h)  one shared file, for one host or a shared filesystem
//   PrefixStore(weft/prefix_store.h) namespaces another store's keys
//   HashStore  (weft/hash_store.h)  in-process, for tests and single-process use
//
// Semantics follow PyTorch's c10d::Store so that weft and PyTorch processes can share a store:
// add() stores its counter as decimal text; compare_set() has c10d's three cases; get() waits.
//
// Thread safety: every method may be called from any thread. A TCPStore serialises calls on its
// one connection; the others lock internally.
// Timeouts: every blocking call takes a timeout; kDefaultTimeout means the store's own, which
// starts as WEFT_TIMEOUT (300 s) and can be changed with set_timeout(). On expiry the call throws
// Error(Timeout) naming the keys it was waiting for.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  // Passed as a timeout: use the store's own timeout().
  static constexpr std::chrono::milliseconds kDefaultTimeout{-1};

  Store();
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Sets key to value, replacing any previous value, and wakes its waiters.
  virtual void set(const std::string& key, const Bytes& value) = 0;

  // Waits until key exists, then returns its value.
  virtual Bytes get(const std::string& key,
                    std::chrono::milliseconds timeout = kDefaultTimeout) = 0;

  // Adds delta to the integer stored at key as decimal text (absent counts as 0) and returns
  // the new value. Throws Error(InvalidArgument) when the value there is not an integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // c10d's compare-and-set:
  //   key absent, expected empty      -> stores desired, returns desired
  //   key absent, expected non-empty  -> stores nothing, returns expected
  //   key present                     -> stores desired iff the value equals expected;
  //                                      returns the value now stored
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;

  // True when every key exists. Does not wait.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout = kDefaultTimeout) = 0;

  // Removes key; true when it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // How many keys the store holds (for a PrefixStore, the whole underlying store's count, as
  // in c10d).
  virtual int64_t num_keys() = 0;

  // Appends value to key's value (creating it when absent).
  virtual void append(const std::string& key, const Bytes& value) = 0;

  // Waits until every key exists, then returns their values in order.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout = kDefaultTimeout) = 0;

  // Sets every key to its value. REQUIRES: keys.size() == values.size().
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<Bytes>& values) = 0;

  // Queues (c10d's queuePush/queuePop/queueLen, PyTorch 2.6): a FIFO of values per key. Queues
  // live apart from the key-value pairs: get, set, delete_key and num_keys never see a queue, and
  // a key may hold a value and a queue at once. One overlap, kept from c10d because a TCPStore's
  // blocking pop is built on it: check() and wait() count a key as present while its queue is
  // non-empty.
  //   queue_push: appends value at the back and wakes the blocked pops of that key.
  //   queue_pop:  removes and returns the front value. block=true waits up to timeout for a
  //               value and throws Error(Timeout) naming the key if none comes. block=false
  //               never waits: an empty queue throws Error(Timeout) at once (c10d throws its
  //               DistQueueEmptyError; Timeout is weft's code for "nothing there in time, a later
  //               retry can succeed").
  //   queue_len:  how many values the queue holds; 0 for a key never pushed.
  virtual void queue_push(const std::string& key, const Bytes& value) = 0;
  virtual Bytes queue_pop(const std::string& key, bool block = true,
                          std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  virtual int64_t queue_len(const std::string& key) = 0;

  // The local address ("10.0.0.5") over which this process reaches the store's server, when the
  // store is a network client; "" when it is not (HashStore, FileStore). A backend publishes it so
  // that peers on other hosts reach this rank the way it reaches the store. Wrappers forward it.
  virtual std::string local_address() const { return ""; }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // Conveniences for text values.
  void set(const std::string& key, std::string_view value);
  std::string get_string(const std::string& key,
                         std::chrono::milliseconds timeout = kDefaultTimeout);

 protected:
  // timeout, or the store's own when it is kDefaultTimeout.
  std::chrono::milliseconds resolve(std::chrono::milliseconds timeout) const {
    return timeout == kDefaultTimeout ? timeout_ : timeout;
  }

 private:
  std::chrono::milliseconds timeout_;
};

// Bytes from text and back.
Bytes to_bytes(std::string_view text);
std::string to_string(const Bytes& bytes);

}  // namespace weft
