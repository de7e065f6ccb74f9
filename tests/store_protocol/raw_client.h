// tests/store_protocol/raw_client.h: a byte-level TCPStore test client. Tests build frames by
// hand (Frame) and check the exact bytes the server answers, so that the wire format is tested
// independently of weft's own client.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/socket.h"

namespace weft::test {

using namespace std::chrono_literals;

// Little-endian frame builder: Frame().u8(1).str("/k").bytes("v").
class Frame {
 public:
  Frame& u8(uint8_t v);
  Frame& u32(uint32_t v);
  Frame& u64(uint64_t v);
  Frame& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  Frame& str(std::string_view s);  // u64 length + bytes (keys and byte values alike)
  Frame& raw(std::string_view s);
  Frame& then(const Frame& other) { return raw(other.data()); }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
};

// The VALIDATE frame every connection opens with.
Frame validate_frame();

// Expected reply encodings, for exact comparison with what the server sent.
std::string le_u64(uint64_t v);
std::string le_i64(int64_t v);
std::string le_u32(uint32_t v);
std::string reply_bytes(std::string_view value);  // u64 length + bytes

class RawClient {
 public:
  // Connects to 127.0.0.1:port and, when `send_validate`, sends VALIDATE.
  explicit RawClient(uint16_t port, bool send_validate = true);

  void send(const Frame& frame) { send(frame.data()); }
  void send(std::string_view bytes);
  // One write per byte: the server must reassemble the query.
  void send_bytewise(std::string_view bytes);
  // Exactly n bytes within timeout; throws std::runtime_error naming what arrived otherwise.
  std::string read(size_t n, std::chrono::milliseconds timeout = 5s);
  // True when no byte arrives within window (for replies that must not come yet).
  bool silent_for(std::chrono::milliseconds window);
  // True when the server closes the connection within timeout (EOF or reset); bytes it sent
  // first are discarded.
  bool closed_by_server(std::chrono::milliseconds timeout = 5s);
  void shutdown_write();

  // Everything this client wrote, for checks on what crossed the wire.
  const std::string& sent() const { return sent_; }
  const std::string& received() const { return received_; }
  int fd() const { return socket_.fd(); }

 private:
  net::Socket socket_;
  std::string sent_;
  std::string received_;
};

// The process's resident memory (VmRSS) in bytes.
size_t resident_bytes();

}  // namespace weft::test
