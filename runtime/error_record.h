// runtime/error_record.h: an error code carried between ranks as text in the store (a rank that
// gives up records why, and the others fail with the same code).
//
// Thread safety: a pure function.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "weft/error.h"

namespace weft {

// The code whose number `text` starts with (as written by std::to_string(int(code))); a number
// that is no ErrorCode, or no number, becomes Io.
inline ErrorCode code_from(std::string_view text) {
  const int value =
      std::atoi(std::string(text.substr(0, text.find_first_not_of("0123456789"))).c_str());
  return value >= static_cast<int>(ErrorCode::Timeout) &&
                 value <= static_cast<int>(ErrorCode::Internal)
             ? static_cast<ErrorCode>(value)
             : ErrorCode::Io;
}

}  // namespace weft
