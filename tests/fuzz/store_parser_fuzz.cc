// libFuzzer target: the TCPStore server's request parser (runtime/store_request_parser.h) on
// arbitrary bytes, fed in chunks whose sizes the input's first byte picks (a query may arrive one
// byte at a time or many in one read). Checks what the parser promises besides not crashing:
// it takes no more than it is given, a complete query respects the limits, and feeding the same
// bytes in one piece or in chunks gives the same queries and the same verdict.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/store_request_parser.h"

namespace {

weft::StoreRequestLimits small_limits() {
  weft::StoreRequestLimits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 256;
  limits.max_keys_per_query = 16;
  limits.max_request_bytes = 4096;
  return limits;
}

void require(bool condition) {
  if (!condition) std::abort();
}

// One summary line per complete query, then the verdict.
std::vector<std::string> parse(const uint8_t* data, size_t size, size_t chunk) {
  weft::StoreRequestParser parser(small_limits());
  const weft::StoreRequestLimits limits = small_limits();
  std::vector<std::string> out;
  size_t at = 0;
  while (at < size) {
    const size_t given = std::min(chunk, size - at);
    size_t used = 0;
    auto status = parser.feed(data + at, given, &used);
    require(used <= given);
    at += used;
    if (status == weft::StoreRequestParser::Status::Violation) {
      require(!parser.error().empty());
      out.push_back("violation");
      return out;
    }
    if (status == weft::StoreRequestParser::Status::Complete) {
      weft::StoreRequest request = parser.take_request();
      require(request.keys.size() <= limits.max_keys_per_query + 1);
      std::string line = std::to_string(static_cast<int>(request.type));
      for (const std::string& k : request.keys) {
        require(k.size() <= limits.max_key_bytes);
        line += "|k" + k;
      }
      for (const std::string& v : request.values) {
        require(v.size() <= limits.max_value_bytes);
        line += "|v" + v;
      }
      line += "|n" + std::to_string(request.number) + "|m" + request.mac;
      out.push_back(line);
    } else {
      require(used == given);  // NeedMore takes everything it was given
    }
  }
  out.push_back(parser.mid_request() ? "partial" : "idle");
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 17;
  auto whole = parse(data + 1, size - 1, size);
  auto pieces = parse(data + 1, size - 1, chunk);
  require(whole == pieces);
  return 0;
}
