#include "runtime/store_auth.h"

#include <string>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "weft/error.h"

namespace weft::store_auth {

Nonce make_nonce() {
  Nonce nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw_error(ErrorCode::Io, "store authentication", "RAND_bytes failed to produce a nonce");
  }
  return nonce;
}

Mac prove(std::string_view token, const Nonce& nonce) {
  std::string message(kAuthContext);
  message.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  Mac mac{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(), &length);
  return mac;
}

bool verify(std::string_view token, const Nonce& nonce, const Mac& mac) {
  Mac expected = prove(token, nonce);
  return CRYPTO_memcmp(expected.data(), mac.data(), mac.size()) == 0;
}

}  // namespace weft::store_auth
