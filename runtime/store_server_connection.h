// runtime/store_server_connection.h: StoreServerConnection, one client of the TCPStore server:
// its socket, where it is in the handshake, its partial query and its unsent replies.
//
// Replies are encoded here (little-endian, explicitly, as PyTorch's x86 peers send them) into an
// output buffer that the server flushes when the socket takes more; the buffer is bounded by the
// caller, who checks pending_reply_bytes() before queueing.
//
// Thread safety: none; owned by the server's loop thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/socket.h"
#include "runtime/store_auth.h"
#include "runtime/store_request_parser.h"

namespace weft {

class StoreServerConnection {
 public:
  // Where the connection is in its handshake; queries other than the one expected close it.
  enum class Phase {
    Validate,       // first message must be VALIDATE with the magic
    AuthChallenge,  // the server has a token: AUTH_CHALLENGE must come next
    AuthProof,      // nonce sent: AUTH_PROOF must come next
    Ready,          // store queries allowed
  };

  StoreServerConnection(uint64_t id, net::Socket socket, std::string peer,
                        StoreRequestLimits limits)
      : id_(id), socket_(std::move(socket)), peer_(std::move(peer)), parser_(limits) {}

  uint64_t id() const { return id_; }
  int fd() const { return socket_.fd(); }
  const std::string& peer() const { return peer_; }
  bool closed() const { return !socket_.valid(); }
  void close() { socket_.close(); }

  Phase phase = Phase::Validate;
  store_auth::Nonce nonce{};
  // Unparsed bytes held while a WAIT is parked (replies must stay in query order).
  std::string inbox;
  // Whether EPOLLOUT is registered (only while replies are pending).
  bool want_write = false;
  // Bytes this connection last added to the server's total (see buffered_bytes()).
  size_t accounted_bytes = 0;

  StoreRequestParser& parser() { return parser_; }

  // Reply encoders: append to the output buffer.
  void put_u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void put_u32(uint32_t v) { put_le(v, 4); }
  void put_u64(uint64_t v) { put_le(v, 8); }
  void put_i64(int64_t v) { put_le(static_cast<uint64_t>(v), 8); }
  void put_raw(std::string_view bytes) { out_.append(bytes); }
  // u64 length, then the bytes.
  void put_bytes(std::string_view bytes) {
    put_u64(bytes.size());
    out_.append(bytes);
  }

  size_t pending_reply_bytes() const { return out_.size() - out_head_; }
  // Request bytes, parked bytes and unsent replies held for this connection.
  size_t buffered_bytes() const {
    return parser_.held_bytes() + inbox.size() + pending_reply_bytes();
  }

  enum class FlushResult { Done, WouldBlock, Failed };
  // Sends as much of the output buffer as the socket takes now. Failed: errno says why.
  FlushResult flush();

 private:
  void put_le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }

  uint64_t id_;
  net::Socket socket_;
  std::string peer_;
  StoreRequestParser parser_;
  std::string out_;
  size_t out_head_ = 0;
};

}  // namespace weft
