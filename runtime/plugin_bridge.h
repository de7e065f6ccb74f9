// runtime/plugin_bridge.h: what a backend plugin (weft/plugin.h) sees of weft, the group's store
// and weft's log as C tables, and how what it reports becomes weft's errors. Internal to libweft:
// runtime/plugin_core.cc and plugin_backend.cc use it.
//
// Thread safety: the bridges' functions may be called from any thread (the plugin's own ones
// too), as plugin.h promises; they touch nothing but the group's Store, which is thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "weft/backend.h"
#include "weft/error.h"
#include "weft/plugin.h"
#include "weft/store.h"
#include "weft/weft.h"

#include "runtime/log.h"

namespace weft::plugin_detail {

// The size of the buffers a plugin writes its error messages into.
constexpr size_t kMessageSize = 1024;

static_assert(WEFT_SUCCESS == 0 && WEFT_ERR_TIMEOUT == int(ErrorCode::Timeout) &&
              WEFT_ERR_PEER_LOST == int(ErrorCode::PeerLost) &&
              WEFT_ERR_INVALID_ARGUMENT == int(ErrorCode::InvalidArgument) &&
              WEFT_ERR_UNSUPPORTED == int(ErrorCode::Unsupported) &&
              WEFT_ERR_ABORTED == int(ErrorCode::Aborted) &&
              WEFT_ERR_DESYNC == int(ErrorCode::Desync) &&
              WEFT_ERR_PROTOCOL == int(ErrorCode::Protocol) && WEFT_ERR_IO == int(ErrorCode::Io));
static_assert(WEFT_COLL_RECV == int(CollectiveKind::Recv) &&
              WEFT_COLL_ALL_TO_ALL == int(CollectiveKind::AllToAll));
static_assert(WEFT_BOOL == int(DType::Bool) && WEFT_UINT64 == int(DType::UInt64) &&
              WEFT_FLOAT8_E4M3 == int(DType::Float8E4M3) &&
              WEFT_FLOAT8_E5M2 == int(DType::Float8E5M2) && WEFT_BXOR == int(ReduceOp::BXor));

// A plugin's failure as a weft error code: the C codes are ErrorCode's; Internal (and anything
// unknown) is reported as Protocol, the code for "the other side broke its contract".
inline ErrorCode code_of(weft_result_t result) {
  if (result >= WEFT_ERR_TIMEOUT && result <= WEFT_ERR_IO) return static_cast<ErrorCode>(result);
  return ErrorCode::Protocol;
}

inline weft_result_t result_of(const Error& e) { return static_cast<weft_result_t>(e.code()); }

struct StoreBridge {
  std::shared_ptr<Store> store;
  std::chrono::milliseconds group_timeout;
  weftStore_v2_t table{};
  weftStore_v1_t table_v1{};  // the same calls without delete_key, for v1 plugins

  std::chrono::milliseconds timeout(int64_t ms) const {
    return ms < 0 ? group_timeout : std::chrono::milliseconds(ms);
  }

  template <typename F>
  weft_result_t call(F&& body) {
    try {
      body();
      return WEFT_SUCCESS;
    } catch (const Error& e) {
      WEFT_LOG_DEBUG("plugin store call failed: {}", e.what());
      return result_of(e);
    } catch (const std::exception& e) {
      WEFT_LOG_WARN("plugin store call failed: {}", e.what());
      return WEFT_ERR_INTERNAL;
    }
  }

  static StoreBridge& of(void* ctx) { return *static_cast<StoreBridge*>(ctx); }

  static weft_result_t set(void* ctx, const char* key, const void* value, size_t size) {
    if (key == nullptr || (value == nullptr && size > 0)) return WEFT_ERR_INVALID_ARGUMENT;
    auto* bytes = static_cast<const uint8_t*>(value);
    return of(ctx).call([&] { of(ctx).store->set(key, Bytes(bytes, bytes + size)); });
  }
  static weft_result_t get(void* ctx, const char* key, int64_t timeout_ms, void** value,
                           size_t* size) {
    if (key == nullptr || value == nullptr || size == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
    return of(ctx).call([&] {
      Bytes bytes = of(ctx).store->get(key, of(ctx).timeout(timeout_ms));
      *value = copy_out(bytes);
      *size = bytes.size();
    });
  }
  static void free_value(void*, void* value) { std::free(value); }
  static weft_result_t add(void* ctx, const char* key, int64_t delta, int64_t* result) {
    if (key == nullptr || result == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
    return of(ctx).call([&] { *result = of(ctx).store->add(key, delta); });
  }
  static weft_result_t wait(void* ctx, const char* const* keys, size_t num_keys,
                            int64_t timeout_ms) {
    if (keys == nullptr && num_keys > 0) return WEFT_ERR_INVALID_ARGUMENT;
    std::vector<std::string> list;
    for (size_t i = 0; i < num_keys; ++i) {
      if (keys[i] == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
      list.emplace_back(keys[i]);
    }
    return of(ctx).call([&] { of(ctx).store->wait(list, of(ctx).timeout(timeout_ms)); });
  }
  static weft_result_t check(void* ctx, const char* const* keys, size_t num_keys, int32_t* exists) {
    std::vector<std::string> list;
    if (!key_list(keys, num_keys, list) || exists == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
    return of(ctx).call([&] { *exists = of(ctx).store->check(list) ? 1 : 0; });
  }
  static weft_result_t multi_get(void* ctx, const char* const* keys, size_t num_keys,
                                 int64_t timeout_ms, void** values, size_t* sizes) {
    std::vector<std::string> list;
    if (!key_list(keys, num_keys, list) ||
        (num_keys > 0 && (values == nullptr || sizes == nullptr))) {
      return WEFT_ERR_INVALID_ARGUMENT;
    }
    return of(ctx).call([&] {
      std::vector<Bytes> got = of(ctx).store->multi_get(list, of(ctx).timeout(timeout_ms));
      for (size_t i = 0; i < got.size(); ++i) {
        values[i] = copy_out(got[i]);
        sizes[i] = got[i].size();
      }
    });
  }
  static weft_result_t delete_key(void* ctx, const char* key, int32_t* deleted) {
    if (key == nullptr || deleted == nullptr) return WEFT_ERR_INVALID_ARGUMENT;
    return of(ctx).call([&] { *deleted = of(ctx).store->delete_key(key) ? 1 : 0; });
  }
  static weft_result_t compare_set(void* ctx, const char* key, const void* expected,
                                   size_t expected_size, const void* desired, size_t desired_size,
                                   void** current, size_t* current_size) {
    if (key == nullptr || (expected == nullptr && expected_size > 0) ||
        (desired == nullptr && desired_size > 0) || current == nullptr || current_size == nullptr) {
      return WEFT_ERR_INVALID_ARGUMENT;
    }
    auto* e = static_cast<const uint8_t*>(expected);
    auto* d = static_cast<const uint8_t*>(desired);
    return of(ctx).call([&] {
      Bytes now =
          of(ctx).store->compare_set(key, Bytes(e, e + expected_size), Bytes(d, d + desired_size));
      *current = copy_out(now);
      *current_size = now.size();
    });
  }

 private:
  static bool key_list(const char* const* keys, size_t num_keys, std::vector<std::string>& out) {
    if (keys == nullptr && num_keys > 0) return false;
    for (size_t i = 0; i < num_keys; ++i) {
      if (keys[i] == nullptr) return false;
      out.emplace_back(keys[i]);
    }
    return true;
  }
  static void* copy_out(const Bytes& bytes) {
    void* out = std::malloc(std::max<size_t>(bytes.size(), 1));
    if (out == nullptr) throw std::bad_alloc();
    std::memcpy(out, bytes.data(), bytes.size());
    return out;
  }
};

struct LogBridge {
  std::string prefix;  // "rank 2/4 group \"world\" plugin mpi"
  static void log(void* ctx, int32_t level, const char* message) {
    const std::string& prefix = static_cast<LogBridge*>(ctx)->prefix;
    const char* text = message == nullptr ? "" : message;
    switch (level) {
      case WEFT_LOG_ERROR:
        WEFT_LOG_ERROR("{}: {}", prefix, text);
        break;
      case WEFT_LOG_WARN:
        WEFT_LOG_WARN("{}: {}", prefix, text);
        break;
      case WEFT_LOG_INFO:
        WEFT_LOG_INFO("{}: {}", prefix, text);
        break;
      default:
        WEFT_LOG_DEBUG("{}: {}", prefix, text);
        break;
    }
  }
};

// "WEFT_ERR_IO (8)", or for a value that is no weft_result_t, "result 42 (no weft_result_t)".
inline std::string result_text(weft_result_t result) {
  if (result >= WEFT_SUCCESS && result <= WEFT_ERR_INTERNAL) {
    return fmt::format("{} ({})", weft_result_name(result), static_cast<int>(result));
  }
  return fmt::format("result {} (no weft_result_t)", static_cast<int>(result));
}

// What an Error raised for a plugin's failure says after the code: the plugin's own message; when
// it gave none, which plugin, call and code; for WEFT_ERR_INTERNAL or a value weft does not know
// (raised as Protocol), the code the plugin gave too.
inline std::string failure_detail(std::string_view plugin, std::string_view call,
                                  weft_result_t result, const std::string& message) {
  if (message.empty()) {
    return fmt::format("plugin {} failed {} with {} and gave no message", plugin, call,
                       result_text(result));
  }
  if (code_of(result) == ErrorCode::Protocol && result != WEFT_ERR_PROTOCOL) {
    return fmt::format("plugin {} reported {} from {}: {}", plugin, result_text(result), call,
                       message);
  }
  return message;
}

inline std::string text_of(const char* buffer, size_t size) {
  return buffer == nullptr ? std::string() : std::string(buffer, strnlen(buffer, size));
}

// "all_reduce #3", "send", "a coalesced unit of 4 (all_reduce #3 first)".
inline std::string op_text(CollectiveKind kind, uint64_t seq, size_t count) {
  std::string text(collective_name(kind));
  if (seq != 0) text += fmt::format(" #{}", seq);
  if (count > 1) text = fmt::format("a coalesced unit of {} ({} first)", count, text);
  return text;
}

// One post_unit(), queued until the plugin thread posts it.

}  // namespace weft::plugin_detail
