#include "weft/store.h"

#include "weft/config.h"

namespace weft {

Store::Store() : timeout_(config().timeout) {}

Store::~Store() = default;

void Store::set(const std::string& key, std::string_view value) { set(key, to_bytes(value)); }

std::string Store::get_string(const std::string& key, std::chrono::milliseconds timeout) {
  return to_string(get(key, timeout));
}

Bytes to_bytes(std::string_view text) { return Bytes(text.begin(), text.end()); }

std::string to_string(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace weft
