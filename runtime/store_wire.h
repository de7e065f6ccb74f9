// runtime/store_wire.h: encoding of TCPStore requests (runtime/store_protocol.h gives the types,
// docs/store-protocol.md the layout): integers little-endian as x86 holds them, strings and byte
// values as a u64 length then the bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#include "runtime/store_protocol.h"

namespace weft::store_wire {

// The prefix PyTorch's client puts before every user key; weft's client does the same, so
// both see the same keys on one server.
constexpr std::string_view kKeyPrefix = "/";

// One request, built in one buffer so that it goes out in one write.
//
//   Request(QueryType::Set).key("rank_0").bytes(value)
class Request {
 public:
  explicit Request(store_protocol::QueryType type) {
    // Most requests are a type byte, a key and a small value.
    bytes_.reserve(64);
    bytes_.push_back(static_cast<uint8_t>(type));
  }

  template <typename T>
  Request& value(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return raw(&v, sizeof(v));
  }
  Request& string(std::string_view s) {
    value<uint64_t>(s.size());
    return raw(s.data(), s.size());
  }
  Request& bytes(const std::vector<uint8_t>& b) {
    value<uint64_t>(b.size());
    return raw(b.data(), b.size());
  }
  // A user key, "/"-prefixed.
  Request& key(std::string_view k) {
    value<uint64_t>(kKeyPrefix.size() + k.size());
    raw(kKeyPrefix.data(), kKeyPrefix.size());
    return raw(k.data(), k.size());
  }
  Request& raw(const void* data, size_t size) {
    size_t at = bytes_.size();
    bytes_.resize(at + size);
    if (size > 0) std::memcpy(bytes_.data() + at, data, size);
    return *this;
  }
  // Another request after this one, for pipelined requests sent in one write.
  Request& append(const Request& other) { return raw(other.data().data(), other.data().size()); }

  const std::vector<uint8_t>& data() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace weft::store_wire
