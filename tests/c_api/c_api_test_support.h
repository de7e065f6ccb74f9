// tests/c_api/c_api_test_support.h: what the C API tests share: checking a result and the
// thread's last error, joining and leaving a group, and a one-shot signal between forked ranks.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>

#include "weft/weft.h"

#include "tests/support/multiproc.h"

namespace weft::test::capi {

using Clock = std::chrono::steady_clock;

// Checks that a call returned `expected` and that the thread's last error contains each part.
inline void expect_result(const char* call, weft_result_t got, weft_result_t expected,
                          std::initializer_list<std::string_view> parts) {
  const std::string_view message = weft_last_error();
  RANK_CHECK(got == expected, "{} returned {} (last error: \"{}\"), expected {}", call,
             weft_result_name(got), message, weft_result_name(expected));
  for (std::string_view part : parts) {
    RANK_CHECK(message.find(part) != std::string_view::npos, "{}: message \"{}\" lacks \"{}\"",
               call, message, part);
  }
}
#define EXPECT_RESULT(call, expected, ...) \
  ::weft::test::capi::expect_result(#call, (call), (expected), {__VA_ARGS__})
#define EXPECT_OK(call) EXPECT_RESULT(call, WEFT_SUCCESS)

inline weft_group_t* join(uint16_t port, int rank, int size, int64_t timeout_ms = 20000) {
  const std::string url = fmt::format("tcp://127.0.0.1:{}", port);
  weft_init_options_t options = WEFT_INIT_OPTIONS_INIT;
  options.url = url.c_str();
  options.rank = rank;
  options.world_size = size;
  options.timeout_ms = timeout_ms;
  weft_group_t* group = nullptr;
  EXPECT_OK(weft_init(&options, &group));
  RANK_CHECK(group != nullptr);
  return group;
}

// Every rank enters the barrier, then destroys the group: rank 0 hosts the store, so it must not
// go while another rank may still need it.
inline void leave(weft_group_t* group) {
  EXPECT_OK(weft_barrier(group, nullptr));
  EXPECT_OK(weft_group_destroy(group));
}

// A one-shot signal from one forked rank to another: a pipe made before the fork.
class Signal {
 public:
  Signal() { REQUIRE(pipe(fds_) == 0); }
  ~Signal() {
    close(fds_[0]);
    close(fds_[1]);
  }
  void post() {
    if (write(fds_[1], "x", 1) != 1) std::perror("Signal::post");
  }
  void wait() {
    char byte;
    RANK_CHECK(read(fds_[0], &byte, 1) == 1);
  }

  // Posts when it goes out of scope, also when a check throws: the waiting rank must not be left
  // blocked until the deadline.
  struct PostAtExit {
    Signal& signal;
    ~PostAtExit() { signal.post(); }
  };

 private:
  int fds_[2];
};

// A non-NULL value to put in an out-parameter, to see that a failing call clears it.
template <typename T>
T* garbage() {
  return reinterpret_cast<T*>(uintptr_t{0x1});
}

}  // namespace weft::test::capi
