// runtime/store_protocol.h: constants of PyTorch's TCPStore wire protocol (PyTorch 2.x), shared
// by weft's client and server. docs/store-protocol.md gives the byte layout of every message.
//
// Integers are little-endian (x86 native, as PyTorch sends them); strings and byte values are a
// u64 length then the bytes. A connection opens with VALIDATE; then each query is one type byte
// and its arguments, answered in order.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weft::store_protocol {

constexpr uint32_t kValidationMagic = 0x3C85F7CE;

enum class QueryType : uint8_t {
  Validate = 0,
  Set = 1,
  CompareSet = 2,
  Get = 3,
  Add = 4,
  Check = 5,
  Wait = 6,
  GetNumKeys = 7,
  DeleteKey = 8,
  Append = 9,
  MultiGet = 10,
  MultiSet = 11,
  CancelWait = 12,
  Ping = 13,
  QueuePush = 14,
  QueuePop = 15,
  QueueLen = 16,
  // weft's authentication extension (off unless the server has a token). Values far above
  // PyTorch's so that a future PyTorch query type cannot collide with them.
  AuthChallenge = 0xC0,  // reply: kAuthNonceBytes raw bytes
  AuthProof = 0xC1,      // + kAuthMacBytes raw bytes; reply: u8 1 accepted, 0 refused (then closed)
};

enum class CheckResponse : uint8_t { Ready = 0, NotReady = 1 };
enum class WaitResponse : uint8_t { StopWaiting = 0, WaitCanceled = 1 };

// Server-side limits (weft's, not PyTorch's): a query over them closes its connection.
constexpr size_t kMaxKeyBytes = 8 * 1024;
constexpr size_t kMaxValueBytes = 8 * 1024 * 1024;
constexpr size_t kMaxKeysPerQuery = 131072;

constexpr size_t kAuthNonceBytes = 32;
constexpr size_t kAuthMacBytes = 32;

}  // namespace weft::store_protocol
