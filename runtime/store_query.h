// runtime/store_query.h: execute_store_query, the store queries (SET ... QUEUE_LEN) of an
// authenticated connection run against StoreState, with their replies encoded as PyTorch's server
// sends them (docs/store-protocol.md). The event loop around it lives in tcp_store_server.cc.
#pragma once

#include <cstddef>
#include <string>

#include "runtime/store_protocol.h"
#include "runtime/store_request_parser.h"
#include "runtime/store_server_connection.h"
#include "runtime/store_state.h"

namespace weft {

struct StoreQueryResult {
  enum class Outcome {
    Replied,    // a reply was queued on the connection
    NoReply,    // SET-like queries, and a WAIT that was parked
    Violation,  // the connection must be closed; reason says why (for the log line)
  };
  Outcome outcome = Outcome::NoReply;
  std::string reason;
};

// Runs one query after the handshake. Values are moved out of `request`. A reply that would take
// the connection's unsent bytes over max_pending_reply_bytes is not built: the result is a
// Violation instead (the client is not reading its replies).
StoreQueryResult execute_store_query(StoreState& state, StoreServerConnection& connection,
                                     StoreRequest& request, size_t max_pending_reply_bytes);

// "SET", "MULTI_GET", ... as PyTorch names the query types; "unknown" otherwise.
const char* query_name(store_protocol::QueryType type);

}  // namespace weft
