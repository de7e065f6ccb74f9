// weft/error.h: weft::Error, the one exception type weft throws, and its codes.
//
// Every failure a caller can act on is a weft::Error carrying an ErrorCode and a message that
// says where it happened: the rank, the process group, the operation and its sequence number,
// then what went wrong and what to do about it:
//
//   rank 2/4 group "dp" all_reduce #17 (float32 x 1048576, sum): PeerLost: rank 1 gone at step 3/6
//   store 127.0.0.1:29500 get: Timeout after 30 s waiting for key "/rank_3"
//
// Bugs in weft itself (broken invariants) are not Errors: WEFT_CHECK reports them with file:line.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace weft {

// What kind of failure an Error is. The numeric values are stable: the C API returns them.
enum class ErrorCode : int {
  // The operation did not finish within its timeout. The peers may be slow or stuck; retrying
  // the same call with a longer timeout can succeed. Prefer PeerLost when a peer is known dead.
  Timeout = 1,
  // A peer process died or closed its connection. Do not retry: the group must be rebuilt.
  PeerLost = 2,
  // The caller passed something wrong (sizes, dtype, root, an op the dtype cannot do). Fix the
  // call; retrying it unchanged fails the same way.
  InvalidArgument = 3,
  // The backend or build does not implement this operation or dtype. Use another backend.
  Unsupported = 4,
  // The group was aborted (abort() from any thread); pending work completes with this code.
  Aborted = 5,
  // Ranks issued different collectives (op, dtype, count or root): a bug in the caller's program.
  Desync = 6,
  // A peer sent bytes that break the wire protocol (bad magic, oversized length, unknown type).
  Protocol = 7,
  // An operating-system call failed (socket, file, mmap). The message carries errno's text.
  Io = 8,
  // Something below weft failed in a way no retry fixes: a CUDA device error, an NCCL internal
  // error, a bug in weft or a plugin. The group is unusable; report it with the message.
  Internal = 9,
};

// The code's name as printed in messages and logs: "PeerLost".
std::string_view error_code_name(ErrorCode code);

// Where an error happened. Fields left at their defaults are omitted from the message.
struct ErrorContext {
  int rank = -1;            // this process's rank in the group, -1 when unknown
  int size = -1;            // the group's size
  std::string group{};      // the group's name ("world", "dp", ...)
  std::string op{};         // "all_reduce", "store get", ...
  uint64_t seq = 0;         // the collective's sequence number in its group, 0 when none
  std::string op_detail{};  // "float32 x 1048576, sum"

  // "rank 2/4 group "dp" all_reduce #17 (float32 x 1048576, sum)"; empty when nothing is set.
  std::string describe() const;
};

class Error : public std::runtime_error {
 public:
  // The message is used as given: "<what>: <Code>: <detail>" is built by the other constructor.
  Error(ErrorCode code, std::string message);
  // Message: "<context.describe()>: <Code>: <detail>".
  Error(ErrorCode code, const ErrorContext& context, std::string_view detail);

  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error(code, "<where>: <Code>: <detail>"), for errors outside any process group
// (stores, launchers, configuration). `where` is e.g. "store 127.0.0.1:29500 get".
[[noreturn]] void throw_error(ErrorCode code, std::string_view where, std::string_view detail);

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               std::string_view message);
}  // namespace detail

}  // namespace weft

// WEFT_CHECK(cond) / WEFT_CHECK(cond, "why"): an invariant of weft's own code. A failure is a bug
// in weft, never the user's input: it throws std::logic_error with file:line and the condition.
#define WEFT_CHECK(cond, ...)                                                             \
  do {                                                                                    \
    if (!(cond)) ::weft::detail::check_failed(__FILE__, __LINE__, #cond, "" __VA_ARGS__); \
  } while (0)
