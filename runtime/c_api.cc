// runtime/c_api.cc: weft's C API (weft/weft.h) over the C++ API (weft/process_group.h).
//
// Every entry point runs its body inside guarded(), which turns a weft::Error into its code and
// any other exception into WEFT_ERR_INTERNAL, records the message for weft_last_error(), and
// never lets an exception out. The handles are thin: a weft_group_t holds a shared_ptr to its
// ProcessGroup and a weft_work_t one to its Work, so a freed handle never ends the operation it
// names (the backend holds the Work too).
//
// Checks done here, not in ProcessGroup, are the ones only the C side can get wrong: NULL
// handles and out-parameters, enum values outside their enums (a C enum holds any int), the
// init options' struct_size, and size * count overflowing size_t. They name the C arguments
// (sendbuf, recvbuf) and reuse the group's error context, so the messages read like the C++ ones.
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/process_group.h"
#include "weft/reduce_op.h"
#include "weft/symmetric_buffer.h"
#include "weft/tensor.h"
#include "weft/weft.h"
#include "weft/work.h"

// The project's version (meson.build). Passed by the build when it defines it, as
// benchmarks/meson.build does for weft-perf; tests/c_api checks this copy against meson's.
#ifndef WEFT_VERSION
#define WEFT_VERSION "0.1.0"
#endif

struct weft_group {
  std::shared_ptr<weft::ProcessGroup> pg;
};

struct weft_work {
  std::shared_ptr<weft::Work> work;
};

struct weft_symmetric {
  std::shared_ptr<weft::SymmetricBuffer> buffer;
};

namespace weft {
namespace {

// The C enums are the C++ ones by value (c_types.h promises it; the C API casts between them).
// `same` compares them as ints: two different enum types may not be compared directly.
constexpr bool same(int c_value, int cpp_value) { return c_value == cpp_value; }
static_assert(same(WEFT_ERR_TIMEOUT, static_cast<int>(ErrorCode::Timeout)) &&
              same(WEFT_ERR_PEER_LOST, static_cast<int>(ErrorCode::PeerLost)) &&
              same(WEFT_ERR_INVALID_ARGUMENT, static_cast<int>(ErrorCode::InvalidArgument)) &&
              same(WEFT_ERR_UNSUPPORTED, static_cast<int>(ErrorCode::Unsupported)) &&
              same(WEFT_ERR_ABORTED, static_cast<int>(ErrorCode::Aborted)) &&
              same(WEFT_ERR_DESYNC, static_cast<int>(ErrorCode::Desync)) &&
              same(WEFT_ERR_PROTOCOL, static_cast<int>(ErrorCode::Protocol)) &&
              same(WEFT_ERR_IO, static_cast<int>(ErrorCode::Io)) &&
              same(WEFT_ERR_INTERNAL, static_cast<int>(ErrorCode::Internal)));
static_assert(same(WEFT_FLOAT32, static_cast<int>(DType::Float32)) &&
              same(WEFT_FLOAT64, static_cast<int>(DType::Float64)) &&
              same(WEFT_FLOAT16, static_cast<int>(DType::Float16)) &&
              same(WEFT_BFLOAT16, static_cast<int>(DType::BFloat16)) &&
              same(WEFT_INT8, static_cast<int>(DType::Int8)) &&
              same(WEFT_UINT8, static_cast<int>(DType::UInt8)) &&
              same(WEFT_INT32, static_cast<int>(DType::Int32)) &&
              same(WEFT_INT64, static_cast<int>(DType::Int64)) &&
              same(WEFT_BOOL, static_cast<int>(DType::Bool)) &&
              same(WEFT_UINT32, static_cast<int>(DType::UInt32)) &&
              same(WEFT_UINT64, static_cast<int>(DType::UInt64)) &&
              same(WEFT_FLOAT8_E4M3, static_cast<int>(DType::Float8E4M3)) &&
              same(WEFT_FLOAT8_E5M2, static_cast<int>(DType::Float8E5M2)) &&
              same(WEFT_FLOAT8_E5M2 + 1, kNumDTypes));
static_assert(same(WEFT_SUM, ReduceOp::Sum) && same(WEFT_PROD, ReduceOp::Prod) &&
              same(WEFT_MIN, ReduceOp::Min) && same(WEFT_MAX, ReduceOp::Max) &&
              same(WEFT_AVG, ReduceOp::Avg) && same(WEFT_PREMUL_SUM, ReduceOp::PremulSum) &&
              same(WEFT_BAND, ReduceOp::BAnd) && same(WEFT_BOR, ReduceOp::BOr) &&
              same(WEFT_BXOR, ReduceOp::BXor) && same(WEFT_BXOR + 1, ReduceOp::kNumKinds));

// The calling thread's last error message. `last_error` points into `last_error_text`, or at a
// static fallback when copying the message itself failed (out of memory), so it is never NULL.
thread_local std::string last_error_text;
thread_local const char* last_error = "";

weft_result_t record(weft_result_t result, std::string_view message) noexcept {
  try {
    last_error_text.assign(message);
    last_error = last_error_text.c_str();
  } catch (...) {
    last_error = "weft: the error message was lost (out of memory while copying it)";
  }
  return result;
}

// Runs `body`; returns WEFT_SUCCESS, or the code of what it threw after recording the message.
// `function` prefixes messages of exceptions that are not weft::Errors (those carry their own
// context).
template <typename Body>
weft_result_t guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return WEFT_SUCCESS;
  } catch (const Error& e) {
    const int code = static_cast<int>(e.code());
    const bool known = code >= WEFT_ERR_TIMEOUT && code <= WEFT_ERR_IO;
    return record(known ? static_cast<weft_result_t>(code) : WEFT_ERR_INTERNAL, e.what());
  } catch (const std::bad_alloc&) {
    return record(WEFT_ERR_INTERNAL, std::string(function) + ": Internal: out of memory");
  } catch (const std::exception& e) {
    return record(WEFT_ERR_INTERNAL, fmt::format("{}: Internal: {}", function, e.what()));
  } catch (...) {
    return record(WEFT_ERR_INTERNAL, std::string(function) + ": Internal: unknown exception");
  }
}

[[noreturn]] void invalid(const char* function, std::string_view detail) {
  throw_error(ErrorCode::InvalidArgument, function, detail);
}

template <typename T>
void require(const T* pointer, const char* function, const char* name) {
  if (pointer == nullptr) invalid(function, fmt::format("{} is NULL", name));
}

ProcessGroup& group_of(const weft_group_t* group, const char* function) {
  require(group, function, "group");
  return *group->pg;
}

Work& work_of(const weft_work_t* work, const char* function) {
  require(work, function, "work");
  return *work->work;
}

// Argument checks of one collective on `pg`, worded as ProcessGroup's own (the same context:
// rank, group, op and the sequence number the call would have taken).
class CallCheck {
 public:
  CallCheck(const ProcessGroup& pg, std::string_view op) : pg_(pg), op_(op) {}

  [[noreturn]] void fail(std::string_view detail) const {
    ErrorContext context;
    context.rank = pg_.rank();
    context.size = pg_.size();
    context.group = pg_.name();
    context.op = std::string(op_);
    context.seq = pg_.sequence_number() + 1;
    throw Error(ErrorCode::InvalidArgument, context, detail);
  }

  DType dtype(weft_dtype_t dtype) const {
    const int value = static_cast<int>(dtype);
    if (value < 0 || value >= kNumDTypes) {
      fail(fmt::format("dtype {} is not a weft_dtype_t value (WEFT_FLOAT32 .. WEFT_FLOAT8_E5M2)",
                       value));
    }
    return static_cast<DType>(value);
  }

  ReduceOp op(weft_red_op_t op) const {
    const int value = static_cast<int>(op);
    if (value < 0 || value >= ReduceOp::kNumKinds) {
      fail(fmt::format("op {} is not a weft_red_op_t value (WEFT_SUM .. WEFT_BXOR)", value));
    }
    if (value == WEFT_PREMUL_SUM) {
      fail("op WEFT_PREMUL_SUM needs a factor: call the _premul variant of this collective");
    }
    return ReduceOp(static_cast<ReduceOp::Kind>(value));
  }

  // A buffer of `count` elements of `dtype`: NULL only when empty, and a byte size that fits in
  // size_t (a wrapped one would move a few bytes and report success).
  void buffer(const void* data, size_t count, DType dtype, const char* name) const {
    if (data == nullptr && count > 0) fail(fmt::format("{} is NULL but count is {}", name, count));
    if (count > SIZE_MAX / dtype_size(dtype)) {
      fail(fmt::format("{} of {} elements of {} overflows size_t bytes", name, count,
                       dtype_name(dtype)));
    }
  }

  // count * size(), for buffers that hold one block per rank.
  size_t per_rank(size_t count, const char* name) const {
    const size_t ranks = static_cast<size_t>(pg_.size());
    if (count > SIZE_MAX / ranks) {
      fail(fmt::format("{} {} times {} ranks overflows size_t", name, count, ranks));
    }
    return count * ranks;
  }

 private:
  const ProcessGroup& pg_;
  std::string_view op_;
};

// Where this thread's buffers lie (weft_set_buffer_device): the host unless set.
thread_local Device buffer_device = Device::cpu();

Tensor view(const void* data, size_t count, DType dtype) {
  return Tensor{const_cast<void*>(data), count, dtype, buffer_device};
}

// The synchronous form: waits with the work's own timeout. If the wait gives up while the
// operation still runs, the operation still owns the caller's buffers, which the caller will
// reuse as soon as we return; aborting the group makes the backend let go of them in bounded
// time (and a group past a timeout is unusable anyway, process_group.h). We wait for that, then
// report the timeout.
// For CUDA buffers "synchronous" means the device has finished too (Work::synchronize()).
void wait_synchronously(ProcessGroup& pg, const Work& work) {
  try {
    work.synchronize();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout || work.is_completed()) throw;
    pg.abort(std::string("a synchronous call timed out: ") + e.what());
    try {
      work.synchronize();
    } catch (const Error&) {
      // Aborted, as expected: the timeout below is the result the caller needs.
    }
    throw;
  }
}

// weft_reduce_scatter and its _premul variant: `op`, or PremulSum with `factor` when op is NULL.
std::shared_ptr<Work> reduce_scatter(ProcessGroup& pg, const void* sendbuf, void* recvbuf,
                                     size_t recvcount, weft_dtype_t dtype, const weft_red_op_t* op,
                                     double factor) {
  CallCheck check(pg, "reduce_scatter_tensor");
  const DType type = check.dtype(dtype);
  const ReduceOp reduce_op = op != nullptr ? check.op(*op) : ReduceOp::premul_sum(factor);
  const size_t total = check.per_rank(recvcount, "recvcount");
  check.buffer(sendbuf, total, type, "sendbuf");
  check.buffer(recvbuf, recvcount, type, "recvbuf");
  return pg.reduce_scatter_tensor(view(recvbuf, recvcount, type), view(sendbuf, total, type),
                                  reduce_op);
}

// Issues a collective through `post` (which returns its Work), then completes the call as `work`
// asks: NULL waits, non-NULL hands out a handle.
template <typename Post>
weft_result_t issue(const char* function, weft_group_t* group, weft_work_t** work, Post&& post) {
  if (work != nullptr) *work = nullptr;
  return guarded(function, [&] {
    ProcessGroup& pg = group_of(group, function);
    std::shared_ptr<Work> posted = post(pg);
    if (work == nullptr) {
      wait_synchronously(pg, *posted);
    } else {
      *work = new weft_work_t{std::move(posted)};
    }
  });
}

weft_result_t init(const char* function, const weft_init_options_t& options, weft_group_t** group) {
  if (group != nullptr) *group = nullptr;
  return guarded(function, [&] {
    require(group, function, "group");
    if (options.timeout_ms < 0) {
      invalid(function,
              fmt::format("options->timeout_ms is {}; use 0 for the default (WEFT_TIMEOUT)",
                          options.timeout_ms));
    }
    ProcessGroupOptions pg_options;
    if (options.url != nullptr && options.url[0] != '\0') pg_options.url = options.url;
    if (options.rank >= 0) pg_options.rank = options.rank;
    if (options.world_size > 0) pg_options.world_size = options.world_size;
    if (options.backend != nullptr) pg_options.backend = options.backend;
    pg_options.timeout = std::chrono::milliseconds(options.timeout_ms);
    auto handle = std::make_unique<weft_group_t>();
    handle->pg = init_process_group(pg_options);
    *group = handle.release();
  });
}

// Hands a sub-group (possibly nullptr: not a member) to the caller.
void hand_out(std::shared_ptr<ProcessGroup> pg, weft_group_t** out) {
  if (pg == nullptr) return;
  auto handle = std::make_unique<weft_group_t>();
  handle->pg = std::move(pg);
  *out = handle.release();
}

}  // namespace
}  // namespace weft

using weft::CallCheck;
using weft::DType;
using weft::ProcessGroup;
using weft::ReduceOp;

extern "C" {

// ---- Starting up.

weft_result_t weft_init_from_env(weft_group_t** group) {
  const weft_init_options_t defaults = WEFT_INIT_OPTIONS_INIT;
  return weft::init("weft_init_from_env", defaults, group);
}

weft_result_t weft_init(const weft_init_options_t* options, weft_group_t** group) {
  constexpr const char* kFunction = "weft_init";
  if (group != nullptr) *group = nullptr;
  weft_result_t checked = weft::guarded(kFunction, [&] {
    weft::require(options, kFunction, "options");
    // Only one version of the struct exists so far; a later one accepts each earlier size and
    // reads the fields that size covers.
    if (options->struct_size != sizeof(weft_init_options_t)) {
      weft::invalid(kFunction,
                    fmt::format("options->struct_size is {}, not sizeof(weft_init_options_t) = {} "
                                "(start from WEFT_INIT_OPTIONS_INIT{})",
                                options->struct_size, sizeof(weft_init_options_t),
                                options->struct_size > sizeof(weft_init_options_t)
                                    ? "; was the program built against a newer weft.h?"
                                    : ""));
    }
  });
  if (checked != WEFT_SUCCESS) return checked;
  return weft::init(kFunction, *options, group);
}

// ---- Groups.

weft_result_t weft_group_rank(const weft_group_t* group, int32_t* rank) {
  return weft::guarded("weft_group_rank", [&] {
    const ProcessGroup& pg = weft::group_of(group, "weft_group_rank");
    weft::require(rank, "weft_group_rank", "rank");
    *rank = pg.rank();
  });
}

weft_result_t weft_group_size(const weft_group_t* group, int32_t* size) {
  return weft::guarded("weft_group_size", [&] {
    const ProcessGroup& pg = weft::group_of(group, "weft_group_size");
    weft::require(size, "weft_group_size", "size");
    *size = pg.size();
  });
}

weft_result_t weft_new_group(weft_group_t* parent, const int32_t* ranks, size_t num_ranks,
                             weft_group_t** out) {
  constexpr const char* kFunction = "weft_new_group";
  if (out != nullptr) *out = nullptr;
  return weft::guarded(kFunction, [&] {
    ProcessGroup& pg = weft::group_of(parent, kFunction);
    weft::require(out, kFunction, "out");
    if (ranks == nullptr && num_ranks > 0) {
      weft::invalid(kFunction, fmt::format("ranks is NULL but num_ranks is {}", num_ranks));
    }
    std::vector<int> list(ranks, ranks + num_ranks);
    weft::hand_out(pg.new_group(std::move(list)), out);
  });
}

weft_result_t weft_split(weft_group_t* parent, int32_t color, int32_t key, weft_group_t** out) {
  if (out != nullptr) *out = nullptr;
  return weft::guarded("weft_split", [&] {
    ProcessGroup& pg = weft::group_of(parent, "weft_split");
    weft::require(out, "weft_split", "out");
    weft::hand_out(pg.split(color, key), out);
  });
}

weft_result_t weft_group_abort(weft_group_t* group, const char* reason) {
  return weft::guarded("weft_group_abort", [&] {
    weft::group_of(group, "weft_group_abort")
        .abort(reason != nullptr ? reason : "weft_group_abort() called");
  });
}

weft_result_t weft_dump_trace(const char* reason, size_t* files_written) {
  return weft::guarded("weft_dump_trace", [&] {
    const std::vector<std::string> paths =
        weft::dump_trace(reason != nullptr ? reason : "requested by the program");
    if (files_written != nullptr) *files_written = paths.size();
  });
}

weft_result_t weft_group_destroy(weft_group_t* group) {
  if (group == nullptr) return WEFT_SUCCESS;
  std::unique_ptr<weft_group_t> owned(group);
  return weft::guarded("weft_group_destroy", [&] { owned->pg->destroy(); });
}

// ---- Symmetric memory.

weft_result_t weft_symmetric_alloc(weft_group_t* group, size_t bytes, weft_symmetric_t** buffer) {
  constexpr const char* kFunction = "weft_symmetric_alloc";
  if (buffer != nullptr) *buffer = nullptr;
  return weft::guarded(kFunction, [&] {
    ProcessGroup& pg = weft::group_of(group, kFunction);
    weft::require(buffer, kFunction, "buffer");
    auto handle = std::make_unique<weft_symmetric_t>();
    handle->buffer = pg.allocate_symmetric(bytes);
    *buffer = handle.release();
  });
}

weft_result_t weft_symmetric_data(const weft_symmetric_t* buffer, void** data, size_t* bytes) {
  return weft::guarded("weft_symmetric_data", [&] {
    weft::require(buffer, "weft_symmetric_data", "buffer");
    if (data != nullptr) *data = buffer->buffer->data();
    if (bytes != nullptr) *bytes = buffer->buffer->size();
  });
}

weft_result_t weft_symmetric_free(weft_symmetric_t* buffer) {
  if (buffer == nullptr) return WEFT_SUCCESS;
  const weft_result_t released =
      weft::guarded("weft_symmetric_free", [&] { buffer->buffer->release(); });
  if (released == WEFT_SUCCESS) delete buffer;
  return released;
}

// ---- Collectives.

weft_result_t weft_all_reduce(weft_group_t* group, const void* sendbuf, void* recvbuf, size_t count,
                              weft_dtype_t dtype, weft_red_op_t op, weft_work_t** work) {
  return weft::issue("weft_all_reduce", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "all_reduce");
    const DType type = check.dtype(dtype);
    const ReduceOp reduce_op = check.op(op);
    check.buffer(sendbuf, count, type, "sendbuf");
    check.buffer(recvbuf, count, type, "recvbuf");
    return pg.all_reduce(weft::view(sendbuf, count, type), weft::view(recvbuf, count, type),
                         reduce_op);
  });
}

weft_result_t weft_all_reduce_premul(weft_group_t* group, const void* sendbuf, void* recvbuf,
                                     size_t count, weft_dtype_t dtype, double factor,
                                     weft_work_t** work) {
  return weft::issue("weft_all_reduce_premul", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "all_reduce");
    const DType type = check.dtype(dtype);
    check.buffer(sendbuf, count, type, "sendbuf");
    check.buffer(recvbuf, count, type, "recvbuf");
    return pg.all_reduce(weft::view(sendbuf, count, type), weft::view(recvbuf, count, type),
                         ReduceOp::premul_sum(factor));
  });
}

weft_result_t weft_reduce(weft_group_t* group, const void* sendbuf, void* recvbuf, size_t count,
                          weft_dtype_t dtype, weft_red_op_t op, int32_t root, weft_work_t** work) {
  return weft::issue("weft_reduce", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "reduce");
    const DType type = check.dtype(dtype);
    const ReduceOp reduce_op = check.op(op);
    check.buffer(sendbuf, count, type, "sendbuf");
    if (root == pg.rank()) check.buffer(recvbuf, count, type, "recvbuf");
    return pg.reduce(weft::view(sendbuf, count, type), weft::view(recvbuf, count, type), root,
                     reduce_op);
  });
}

weft_result_t weft_broadcast(weft_group_t* group, void* buf, size_t count, weft_dtype_t dtype,
                             int32_t root, weft_work_t** work) {
  return weft::issue("weft_broadcast", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "broadcast");
    const DType type = check.dtype(dtype);
    check.buffer(buf, count, type, "buf");
    return pg.broadcast(weft::view(buf, count, type), root);
  });
}

weft_result_t weft_all_gather(weft_group_t* group, const void* sendbuf, void* recvbuf,
                              size_t sendcount, weft_dtype_t dtype, weft_work_t** work) {
  return weft::issue("weft_all_gather", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "all_gather_into_tensor");
    const DType type = check.dtype(dtype);
    const size_t total = check.per_rank(sendcount, "sendcount");
    check.buffer(sendbuf, sendcount, type, "sendbuf");
    check.buffer(recvbuf, total, type, "recvbuf");
    return pg.all_gather_into_tensor(weft::view(recvbuf, total, type),
                                     weft::view(sendbuf, sendcount, type));
  });
}

weft_result_t weft_reduce_scatter(weft_group_t* group, const void* sendbuf, void* recvbuf,
                                  size_t recvcount, weft_dtype_t dtype, weft_red_op_t op,
                                  weft_work_t** work) {
  return weft::issue("weft_reduce_scatter", group, work, [&](ProcessGroup& pg) {
    return weft::reduce_scatter(pg, sendbuf, recvbuf, recvcount, dtype, &op, 0.0);
  });
}

weft_result_t weft_reduce_scatter_premul(weft_group_t* group, const void* sendbuf, void* recvbuf,
                                         size_t recvcount, weft_dtype_t dtype, double factor,
                                         weft_work_t** work) {
  return weft::issue("weft_reduce_scatter_premul", group, work, [&](ProcessGroup& pg) {
    return weft::reduce_scatter(pg, sendbuf, recvbuf, recvcount, dtype, nullptr, factor);
  });
}

weft_result_t weft_all_to_all(weft_group_t* group, const void* sendbuf, void* recvbuf, size_t count,
                              weft_dtype_t dtype, weft_work_t** work) {
  return weft::issue("weft_all_to_all", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "all_to_all");
    const DType type = check.dtype(dtype);
    const size_t total = check.per_rank(count, "count");
    check.buffer(sendbuf, total, type, "sendbuf");
    check.buffer(recvbuf, total, type, "recvbuf");
    return pg.all_to_all(weft::view(recvbuf, total, type), weft::view(sendbuf, total, type));
  });
}

weft_result_t weft_gather(weft_group_t* group, const void* sendbuf, void* recvbuf, size_t sendcount,
                          weft_dtype_t dtype, int32_t root, weft_work_t** work) {
  return weft::issue("weft_gather", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "gather_into_tensor");
    const DType type = check.dtype(dtype);
    const size_t total = check.per_rank(sendcount, "sendcount");
    check.buffer(sendbuf, sendcount, type, "sendbuf");
    if (root == pg.rank()) check.buffer(recvbuf, total, type, "recvbuf");
    return pg.gather_into_tensor(weft::view(recvbuf, root == pg.rank() ? total : 0, type),
                                 weft::view(sendbuf, sendcount, type), root);
  });
}

weft_result_t weft_scatter(weft_group_t* group, const void* sendbuf, void* recvbuf,
                           size_t recvcount, weft_dtype_t dtype, int32_t root, weft_work_t** work) {
  return weft::issue("weft_scatter", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "scatter_from_tensor");
    const DType type = check.dtype(dtype);
    const size_t total = check.per_rank(recvcount, "recvcount");
    check.buffer(recvbuf, recvcount, type, "recvbuf");
    if (root == pg.rank()) check.buffer(sendbuf, total, type, "sendbuf");
    return pg.scatter_from_tensor(weft::view(recvbuf, recvcount, type),
                                  weft::view(sendbuf, root == pg.rank() ? total : 0, type), root);
  });
}

weft_result_t weft_all_to_all_v(weft_group_t* group, const void* sendbuf, const size_t* send_counts,
                                void* recvbuf, const size_t* recv_counts, weft_dtype_t dtype,
                                weft_work_t** work) {
  return weft::issue("weft_all_to_all_v", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "all_to_all");
    const DType type = check.dtype(dtype);
    if (send_counts == nullptr) check.fail("send_counts is NULL");
    if (recv_counts == nullptr) check.fail("recv_counts is NULL");
    const size_t ranks = static_cast<size_t>(pg.size());
    std::vector<size_t> input_splits(send_counts, send_counts + ranks);
    std::vector<size_t> output_splits(recv_counts, recv_counts + ranks);
    auto total = [&](const std::vector<size_t>& counts, const char* name) {
      size_t sum = 0;
      for (size_t c : counts) {
        if (c > SIZE_MAX - sum) check.fail(fmt::format("the sum of {} overflows size_t", name));
        sum += c;
      }
      return sum;
    };
    const size_t send_total = total(input_splits, "send_counts");
    const size_t recv_total = total(output_splits, "recv_counts");
    check.buffer(sendbuf, send_total, type, "sendbuf");
    check.buffer(recvbuf, recv_total, type, "recvbuf");
    return pg.all_to_all(weft::view(recvbuf, recv_total, type),
                         weft::view(sendbuf, send_total, type), std::move(output_splits),
                         std::move(input_splits));
  });
}

weft_result_t weft_barrier(weft_group_t* group, weft_work_t** work) {
  return weft::issue("weft_barrier", group, work, [](ProcessGroup& pg) { return pg.barrier(); });
}

weft_result_t weft_send(weft_group_t* group, const void* buf, size_t count, weft_dtype_t dtype,
                        int32_t peer, uint64_t tag, weft_work_t** work) {
  return weft::issue("weft_send", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "send");
    const DType type = check.dtype(dtype);
    check.buffer(buf, count, type, "buf");
    return pg.send(weft::view(buf, count, type), peer, tag);
  });
}

weft_result_t weft_recv(weft_group_t* group, void* buf, size_t count, weft_dtype_t dtype,
                        int32_t peer, uint64_t tag, weft_work_t** work) {
  return weft::issue("weft_recv", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "recv");
    const DType type = check.dtype(dtype);
    check.buffer(buf, count, type, "buf");
    return pg.recv(weft::view(buf, count, type), peer, tag);
  });
}

weft_result_t weft_recv_any(weft_group_t* group, void* buf, size_t count, weft_dtype_t dtype,
                            uint64_t tag, int32_t* source, weft_work_t** work) {
  if (source != nullptr) *source = -1;
  std::shared_ptr<weft::Work> posted;
  const weft_result_t result = weft::issue("weft_recv_any", group, work, [&](ProcessGroup& pg) {
    CallCheck check(pg, "recv");
    const DType type = check.dtype(dtype);
    check.buffer(buf, count, type, "buf");
    posted = pg.recv_any(weft::view(buf, count, type), tag);
    return posted;
  });
  if (result == WEFT_SUCCESS && work == nullptr && source != nullptr) {
    *source = posted->source_rank();
  }
  return result;
}

// ---- Work handles.

weft_result_t weft_work_wait(weft_work_t* work, int64_t timeout_ms) {
  return weft::guarded("weft_work_wait", [&] {
    const weft::Work& w = weft::work_of(work, "weft_work_wait");
    w.wait(timeout_ms < 0 ? weft::Work::kDefaultTimeout : std::chrono::milliseconds(timeout_ms));
  });
}

weft_result_t weft_work_synchronize(weft_work_t* work, int64_t timeout_ms) {
  return weft::guarded("weft_work_synchronize", [&] {
    const weft::Work& w = weft::work_of(work, "weft_work_synchronize");
    w.synchronize(timeout_ms < 0 ? weft::Work::kDefaultTimeout
                                 : std::chrono::milliseconds(timeout_ms));
  });
}

weft_result_t weft_set_buffer_device(const char* device) {
  return weft::guarded("weft_set_buffer_device", [&] {
    weft::require(device, "weft_set_buffer_device", "device");
    std::optional<weft::Device> parsed = weft::parse_device(device);
    if (!parsed) {
      weft::throw_error(
          weft::ErrorCode::InvalidArgument, "weft_set_buffer_device",
          fmt::format("\"{}\" is not a device (\"cpu\", \"cuda\" or \"cuda:N\")", device));
    }
    weft::buffer_device = *parsed;
  });
}

weft_result_t weft_set_cuda_stream(void* stream) {
  weft::set_current_cuda_stream(static_cast<weft::CudaStream>(stream));
  return WEFT_SUCCESS;
}

weft_result_t weft_work_source_rank(weft_work_t* work, int32_t* source) {
  return weft::guarded("weft_work_source_rank", [&] {
    const weft::Work& w = weft::work_of(work, "weft_work_source_rank");
    weft::require(source, "weft_work_source_rank", "source");
    *source = w.source_rank();
  });
}

weft_result_t weft_work_test(weft_work_t* work, int* done) {
  return weft::guarded("weft_work_test", [&] {
    const weft::Work& w = weft::work_of(work, "weft_work_test");
    weft::require(done, "weft_work_test", "done");
    const bool completed = w.is_completed();
    *done = completed ? 1 : 0;
    if (completed) {
      if (std::exception_ptr error = w.exception()) std::rethrow_exception(error);
    }
  });
}

weft_result_t weft_work_free(weft_work_t* work) {
  delete work;
  return WEFT_SUCCESS;
}

// ---- Errors and version.

const char* weft_last_error(void) { return weft::last_error; }

const char* weft_result_name(weft_result_t result) {
  switch (result) {
    case WEFT_SUCCESS:
      return "WEFT_SUCCESS";
    case WEFT_ERR_TIMEOUT:
      return "WEFT_ERR_TIMEOUT";
    case WEFT_ERR_PEER_LOST:
      return "WEFT_ERR_PEER_LOST";
    case WEFT_ERR_INVALID_ARGUMENT:
      return "WEFT_ERR_INVALID_ARGUMENT";
    case WEFT_ERR_UNSUPPORTED:
      return "WEFT_ERR_UNSUPPORTED";
    case WEFT_ERR_ABORTED:
      return "WEFT_ERR_ABORTED";
    case WEFT_ERR_DESYNC:
      return "WEFT_ERR_DESYNC";
    case WEFT_ERR_PROTOCOL:
      return "WEFT_ERR_PROTOCOL";
    case WEFT_ERR_IO:
      return "WEFT_ERR_IO";
    case WEFT_ERR_INTERNAL:
      return "WEFT_ERR_INTERNAL";
  }
  return "WEFT_ERR_UNKNOWN";
}

const char* weft_version(void) { return WEFT_VERSION; }

}  // extern "C"
