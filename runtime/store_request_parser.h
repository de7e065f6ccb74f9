// runtime/store_request_parser.h: StoreRequestParser, the TCPStore server's incremental decoder of
// client queries (docs/store-protocol.md has the byte layout).
//
// Bytes are fed as they arrive: a query may come one byte at a time or several in one read. The
// parser keeps its place inside a partial query (which field, how many bytes of it) so that no byte
// is looked at twice, and checks every length against the limits as soon as the length itself
// has arrived, before anything is allocated for it.
//
// Thread safety: none; one parser per connection, used by the server's loop thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/store_protocol.h"

namespace weft {

// One complete query. Which fields are filled depends on the type (see store-protocol.md).
struct StoreRequest {
  store_protocol::QueryType type = store_protocol::QueryType::Validate;
  // Keys in wire order: one for SET/GET/ADD/..., count of them for CHECK/WAIT/MULTI_*.
  std::vector<std::string> keys;
  // Byte values in wire order: SET/APPEND/QUEUE_PUSH one, COMPARE_SET two (expected, desired),
  // MULTI_SET one per key.
  std::vector<std::string> values;
  // VALIDATE's magic and PING's nonce (u32), ADD's amount (i64, stored as its bits).
  uint64_t number = 0;
  // AUTH_PROOF's MAC.
  std::string mac;
};

struct StoreRequestLimits {
  size_t max_key_bytes = store_protocol::kMaxKeyBytes;
  size_t max_value_bytes = store_protocol::kMaxValueBytes;
  size_t max_keys_per_query = store_protocol::kMaxKeysPerQuery;
  // Bytes one partial query may hold (keys, values and their bookkeeping) before it completes.
  size_t max_request_bytes = 64 * 1024 * 1024;
};

class StoreRequestParser {
 public:
  enum class Status {
    NeedMore,   // every byte given was taken; the query is not complete yet
    Complete,   // a query is ready in request(); bytes after it were not taken
    Violation,  // the bytes break the protocol or a limit; error() says how
  };

  explicit StoreRequestParser(StoreRequestLimits limits) : limits_(limits) {}

  // Takes bytes from data[0, size) and stores in *used how many it took. After Complete, read
  // request() (or take_request()) before feeding again; after Violation, the parser is unusable.
  Status feed(const uint8_t* data, size_t size, size_t* used);

  const StoreRequest& request() const { return request_; }
  StoreRequest take_request();
  const std::string& error() const { return error_; }

  // True between the first byte of a query and its completion.
  bool mid_request() const { return step_ != Step::Type; }
  // Approximate heap bytes held by the partial query (for the server's memory accounting).
  size_t held_bytes() const { return held_bytes_; }

 private:
  // Fields a query is made of, in wire order.
  enum class Field : uint8_t { Key, Value, U32, I64, Count, Mac };
  enum class Step : uint8_t {
    Type,         // waiting for the query type byte
    Fixed,        // filling scratch_ with a fixed-size field (integer, count, or string length)
    StringBytes,  // copying the bytes of a key or value
  };

  Status start(uint8_t type_byte);
  // Moves to the next field of the query, or completes it.
  Status next_field();
  Status field_done();
  Status violation(std::string message);
  void reset_for_next();

  StoreRequestLimits limits_;
  StoreRequest request_;
  std::string error_;

  // The query's layout: `prefix_` fields once, then `group_` fields `repeat_` times (the count).
  const Field* prefix_ = nullptr;
  size_t prefix_size_ = 0;
  const Field* group_ = nullptr;
  size_t group_size_ = 0;
  uint64_t repeat_left_ = 0;
  bool in_group_ = false;
  size_t field_index_ = 0;

  Step step_ = Step::Type;
  Field field_ = Field::Key;
  bool reading_length_ = false;  // Fixed step: the u64 length prefix of a key or value
  uint8_t scratch_[32] = {};
  size_t scratch_need_ = 0;
  size_t scratch_have_ = 0;
  std::string* target_ = nullptr;  // StringBytes step: where the bytes go
  uint64_t string_left_ = 0;
  size_t held_bytes_ = 0;
};

}  // namespace weft
