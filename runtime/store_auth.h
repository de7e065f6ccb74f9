// runtime/store_auth.h: the HMAC-SHA256 challenge-response of the store's authentication
// extension. The shared secret (WEFT_STORE_TOKEN) never crosses the wire: the server sends a
// random nonce, the client answers HMAC-SHA256(token, kAuthContext || nonce).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "runtime/store_protocol.h"

namespace weft::store_auth {

using Nonce = std::array<uint8_t, store_protocol::kAuthNonceBytes>;
using Mac = std::array<uint8_t, store_protocol::kAuthMacBytes>;

// Binds the MAC to this protocol so that it cannot be replayed to another HMAC-based service.
constexpr std::string_view kAuthContext = "weft-store-auth-v1";

// A fresh nonce from the OpenSSL CSPRNG. Throws Error(Io) if it cannot be had.
Nonce make_nonce();
// HMAC-SHA256(token, kAuthContext || nonce).
Mac prove(std::string_view token, const Nonce& nonce);
// Constant-time comparison of mac against prove(token, nonce).
bool verify(std::string_view token, const Nonce& nonce, const Mac& mac);

}  // namespace weft::store_auth
