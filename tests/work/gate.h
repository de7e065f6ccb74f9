// tests/work/gate.h: a one-shot signal between test threads, so tests wait on events, not time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace weft::testing {

// A Gate starts closed; open() lets every present and future wait() through.
// Thread safety: any thread may open or wait.
class Gate {
 public:
  // Notifies with the mutex held: a waiter may destroy the Gate as soon as it sees open_, so
  // open() must not touch cv_ after releasing the mutex.
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }

  // True when the gate opened before `timeout` passed.
  bool wait(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [this] { return open_; });
  }

  bool is_open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;  // guarded by mutex_
};

}  // namespace weft::testing
