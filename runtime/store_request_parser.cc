#include "runtime/store_request_parser.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace weft {
namespace {

using store_protocol::QueryType;

// Per-string bookkeeping charged on top of its bytes (sizeof(std::string) on libstdc++).
constexpr size_t kStringOverhead = sizeof(std::string);
// What a string field reserves before its bytes arrive (see StringBytes below).
constexpr uint64_t kInitialReserve = 64 * 1024;

uint64_t load_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

static_assert(store_protocol::kAuthMacBytes <= 32, "scratch_ holds the MAC");

}  // namespace

StoreRequest StoreRequestParser::take_request() {
  StoreRequest out = std::move(request_);
  request_ = StoreRequest{};
  return out;
}

StoreRequestParser::Status StoreRequestParser::violation(std::string message) {
  error_ = std::move(message);
  return Status::Violation;
}

void StoreRequestParser::reset_for_next() {
  step_ = Step::Type;
  prefix_ = group_ = nullptr;
  prefix_size_ = group_size_ = 0;
  repeat_left_ = 0;
  in_group_ = false;
  field_index_ = 0;
  target_ = nullptr;
  held_bytes_ = 0;
}

StoreRequestParser::Status StoreRequestParser::start(uint8_t type_byte) {
  // Field layouts of every query, as PyTorch's client writes them.
  static constexpr Field kU32[] = {Field::U32};
  static constexpr Field kKey[] = {Field::Key};
  static constexpr Field kKeyValue[] = {Field::Key, Field::Value};
  static constexpr Field kCompareSet[] = {Field::Key, Field::Value, Field::Value};
  static constexpr Field kAdd[] = {Field::Key, Field::I64};
  static constexpr Field kCount[] = {Field::Count};
  static constexpr Field kMac[] = {Field::Mac};

  request_ = StoreRequest{};
  request_.type = static_cast<QueryType>(type_byte);
  auto layout = [this](const Field* prefix, size_t prefix_size, const Field* group,
                       size_t group_size) {
    prefix_ = prefix;
    prefix_size_ = prefix_size;
    group_ = group;
    group_size_ = group_size;
  };
  switch (request_.type) {
    case QueryType::Validate:
    case QueryType::Ping:
      layout(kU32, 1, nullptr, 0);
      break;
    case QueryType::Set:
    case QueryType::Append:
    case QueryType::QueuePush:
      layout(kKeyValue, 2, nullptr, 0);
      break;
    case QueryType::CompareSet:
      layout(kCompareSet, 3, nullptr, 0);
      break;
    case QueryType::Get:
    case QueryType::DeleteKey:
    case QueryType::QueuePop:
    case QueryType::QueueLen:
      layout(kKey, 1, nullptr, 0);
      break;
    case QueryType::Add:
      layout(kAdd, 2, nullptr, 0);
      break;
    case QueryType::Check:
    case QueryType::Wait:
    case QueryType::MultiGet:
      layout(kCount, 1, kKey, 1);
      break;
    case QueryType::MultiSet:
      layout(kCount, 1, kKeyValue, 2);
      break;
    case QueryType::GetNumKeys:
    case QueryType::CancelWait:
    case QueryType::AuthChallenge:
      layout(nullptr, 0, nullptr, 0);
      break;
    case QueryType::AuthProof:
      layout(kMac, 1, nullptr, 0);
      break;
    default:
      return violation(fmt::format("unknown query type {}", type_byte));
  }
  field_index_ = 0;
  in_group_ = false;
  repeat_left_ = 0;
  return next_field();
}

StoreRequestParser::Status StoreRequestParser::next_field() {
  // repeat_left_ counts the repetitions of the group still to come after the current one.
  for (;;) {
    if (!in_group_) {
      if (field_index_ < prefix_size_) {
        field_ = prefix_[field_index_];
        break;
      }
      if (group_size_ == 0 || repeat_left_ == 0) return Status::Complete;
      in_group_ = true;
    } else {
      if (field_index_ < group_size_) {
        field_ = group_[field_index_];
        break;
      }
      if (repeat_left_ == 0) return Status::Complete;
    }
    --repeat_left_;
    field_index_ = 0;
  }
  step_ = Step::Fixed;
  scratch_have_ = 0;
  reading_length_ = false;
  switch (field_) {
    case Field::U32:
      scratch_need_ = 4;
      break;
    case Field::Mac:
      scratch_need_ = store_protocol::kAuthMacBytes;
      break;
    case Field::Key:
    case Field::Value:
      reading_length_ = true;
      scratch_need_ = 8;
      break;
    case Field::I64:
    case Field::Count:
      scratch_need_ = 8;
      break;
  }
  return Status::NeedMore;
}

StoreRequestParser::Status StoreRequestParser::field_done() {
  ++field_index_;
  return next_field();
}

StoreRequestParser::Status StoreRequestParser::feed(const uint8_t* data, size_t size,
                                                    size_t* used) {
  size_t pos = 0;
  Status status = Status::NeedMore;
  while (status == Status::NeedMore && pos < size) {
    switch (step_) {
      case Step::Type:
        status = start(data[pos++]);
        break;
      case Step::Fixed: {
        size_t take = std::min(scratch_need_ - scratch_have_, size - pos);
        std::memcpy(scratch_ + scratch_have_, data + pos, take);
        scratch_have_ += take;
        pos += take;
        if (scratch_have_ < scratch_need_) break;
        if (reading_length_) {
          uint64_t length = load_le(scratch_, 8);
          bool is_key = field_ == Field::Key;
          size_t limit = is_key ? limits_.max_key_bytes : limits_.max_value_bytes;
          if (length > limit) {
            status = violation(fmt::format("{} of {} bytes is over the limit of {}",
                                           is_key ? "key" : "value", length, limit));
            break;
          }
          if (held_bytes_ + kStringOverhead + length > limits_.max_request_bytes) {
            status = violation(fmt::format("query holds over {} bytes (limit per connection)",
                                           limits_.max_request_bytes));
            break;
          }
          held_bytes_ += kStringOverhead + length;
          auto& list = is_key ? request_.keys : request_.values;
          list.emplace_back();
          target_ = &list.back();
          // Reserve at most kInitialReserve: a client that declares 8 MiB and stalls must not
          // make the server hold 8 MiB (malloc may touch or reuse resident memory for it);
          // larger values grow geometrically as their bytes arrive.
          target_->reserve(std::min(length, kInitialReserve));
          string_left_ = length;
          step_ = Step::StringBytes;
          if (length == 0) status = field_done();
          break;
        }
        switch (field_) {
          case Field::U32:
            request_.number = load_le(scratch_, 4);
            break;
          case Field::I64:
            request_.number = load_le(scratch_, 8);
            break;
          case Field::Mac:
            request_.mac.assign(reinterpret_cast<const char*>(scratch_), scratch_need_);
            break;
          case Field::Count: {
            uint64_t count = load_le(scratch_, 8);
            if (count > limits_.max_keys_per_query) {
              status = violation(fmt::format("{} keys in one query is over the limit of {}", count,
                                             limits_.max_keys_per_query));
              break;
            }
            repeat_left_ = count;
            break;
          }
          default:
            break;
        }
        if (status != Status::Violation) status = field_done();
        break;
      }
      case Step::StringBytes: {
        size_t take = static_cast<size_t>(std::min<uint64_t>(string_left_, size - pos));
        target_->append(reinterpret_cast<const char*>(data + pos), take);
        pos += take;
        string_left_ -= take;
        if (string_left_ == 0) status = field_done();
        break;
      }
    }
  }
  // Queries without arguments complete on their type byte; zero-length strings on their length.
  *used = pos;
  if (status == Status::Complete) reset_for_next();
  return status;
}

}  // namespace weft
