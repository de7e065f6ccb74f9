#include "runtime/store_query.h"

#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace weft {
namespace {

using store_protocol::QueryType;

StoreQueryResult replied() { return {StoreQueryResult::Outcome::Replied, {}}; }
StoreQueryResult no_reply() { return {StoreQueryResult::Outcome::NoReply, {}}; }
StoreQueryResult violation(std::string reason) {
  return {StoreQueryResult::Outcome::Violation, std::move(reason)};
}

std::string_view value_or_empty(const std::string* value) {
  return value ? std::string_view(*value) : std::string_view();
}

}  // namespace

StoreQueryResult execute_store_query(StoreState& state, StoreServerConnection& c, StoreRequest& r,
                                     size_t max_pending_reply_bytes) {
  auto& keys = r.keys;
  auto& values = r.values;
  // Replies that carry values are sized before they are built, so that a MULTI_GET of many large
  // values to a client that does not read cannot allocate without bound.
  auto too_big = [&](size_t reply_bytes) {
    return c.pending_reply_bytes() + reply_bytes > max_pending_reply_bytes;
  };
  switch (r.type) {
    case QueryType::Set:
      state.set(keys[0], std::move(values[0]));
      return no_reply();
    case QueryType::CompareSet: {
      std::string now = state.compare_set(keys[0], values[0], std::move(values[1]));
      if (too_big(8 + now.size())) break;
      c.put_bytes(now);
      return replied();
    }
    case QueryType::Get: {
      std::string_view value = value_or_empty(state.get(keys[0]));
      if (too_big(8 + value.size())) break;
      c.put_bytes(value);
      return replied();
    }
    case QueryType::Add: {
      auto delta = static_cast<int64_t>(r.number);
      auto sum = state.add(keys[0], delta);
      if (!sum) {
        return violation(fmt::format(
            "ADD {} to key \"{}\" whose value is not an integer or would overflow int64", delta,
            keys[0]));
      }
      c.put_i64(*sum);
      return replied();
    }
    case QueryType::Check:
      c.put_u8(static_cast<uint8_t>(state.all_exist(keys)
                                        ? store_protocol::CheckResponse::Ready
                                        : store_protocol::CheckResponse::NotReady));
      return replied();
    case QueryType::Wait:
      // Parked: the server answers when StoreState reports the wait complete.
      if (!state.park(c.id(), keys)) return no_reply();
      c.put_u8(static_cast<uint8_t>(store_protocol::WaitResponse::StopWaiting));
      return replied();
    case QueryType::GetNumKeys:
      c.put_i64(state.num_keys());
      return replied();
    case QueryType::DeleteKey:
      c.put_i64(state.delete_key(keys[0]));
      return replied();
    case QueryType::Append:
      state.append(keys[0], values[0]);
      return no_reply();
    case QueryType::MultiGet: {
      size_t total = 0;
      for (const auto& key : keys) total += 8 + value_or_empty(state.get(key)).size();
      if (too_big(total)) break;
      for (const auto& key : keys) c.put_bytes(value_or_empty(state.get(key)));
      return replied();
    }
    case QueryType::MultiSet:
      for (size_t i = 0; i < keys.size(); ++i) state.set(keys[i], std::move(values[i]));
      return no_reply();
    case QueryType::CancelWait:
      // Reached only without a parked wait (the server handles a parked one itself): it was
      // answered already, or never made. PyTorch answers anyway, and its client reads the
      // STOP_WAITING that raced the cancel first.
      c.put_u8(static_cast<uint8_t>(store_protocol::WaitResponse::WaitCanceled));
      return replied();
    case QueryType::Ping:
      c.put_u32(static_cast<uint32_t>(r.number));
      return replied();
    case QueryType::QueuePush:
      state.queue_push(keys[0], std::move(values[0]));
      return no_reply();
    case QueryType::QueuePop: {
      std::string value;
      int64_t length = state.queue_pop(keys[0], &value);
      if (too_big(8 + (length > 0 ? 8 + value.size() : 0))) break;
      c.put_i64(length);
      if (length > 0) c.put_bytes(value);
      return replied();
    }
    case QueryType::QueueLen:
      c.put_i64(state.queue_len(keys[0]));
      return replied();
    default:
      return violation(fmt::format("unexpected {} after the handshake", query_name(r.type)));
  }
  return violation(
      fmt::format("its unread replies would pass {} bytes (the client does not read "
                  "them)",
                  max_pending_reply_bytes));
}

const char* query_name(QueryType type) {
  switch (type) {
    case QueryType::Validate:
      return "VALIDATE";
    case QueryType::Set:
      return "SET";
    case QueryType::CompareSet:
      return "COMPARE_SET";
    case QueryType::Get:
      return "GET";
    case QueryType::Add:
      return "ADD";
    case QueryType::Check:
      return "CHECK";
    case QueryType::Wait:
      return "WAIT";
    case QueryType::GetNumKeys:
      return "GETNUMKEYS";
    case QueryType::DeleteKey:
      return "DELETE_KEY";
    case QueryType::Append:
      return "APPEND";
    case QueryType::MultiGet:
      return "MULTI_GET";
    case QueryType::MultiSet:
      return "MULTI_SET";
    case QueryType::CancelWait:
      return "CANCEL_WAIT";
    case QueryType::Ping:
      return "PING";
    case QueryType::QueuePush:
      return "QUEUE_PUSH";
    case QueryType::QueuePop:
      return "QUEUE_POP";
    case QueryType::QueueLen:
      return "QUEUE_LEN";
    case QueryType::AuthChallenge:
      return "AUTH_CHALLENGE";
    case QueryType::AuthProof:
      return "AUTH_PROOF";
  }
  return "unknown";
}

}  // namespace weft
