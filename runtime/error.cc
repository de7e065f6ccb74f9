#include "weft/error.h"

#include <fmt/format.h>

namespace weft {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::Timeout:
      return "Timeout";
    case ErrorCode::PeerLost:
      return "PeerLost";
    case ErrorCode::InvalidArgument:
      return "InvalidArgument";
    case ErrorCode::Unsupported:
      return "Unsupported";
    case ErrorCode::Aborted:
      return "Aborted";
    case ErrorCode::Desync:
      return "Desync";
    case ErrorCode::Protocol:
      return "Protocol";
    case ErrorCode::Io:
      return "Io";
    case ErrorCode::Internal:
      return "Internal";
  }
  return "Unknown";
}

std::string ErrorContext::describe() const {
  std::string out;
  auto sep = [&out] {
    if (!out.empty()) out += ' ';
  };
  if (rank >= 0) {
    out += size >= 0 ? fmt::format("rank {}/{}", rank, size) : fmt::format("rank {}", rank);
  }
  if (!group.empty()) {
    sep();
    out += fmt::format("group \"{}\"", group);
  }
  if (!op.empty()) {
    sep();
    out += op;
    if (seq != 0) out += fmt::format(" #{}", seq);
  }
  if (!op_detail.empty()) {
    sep();
    out += fmt::format("({})", op_detail);
  }
  return out;
}

Error::Error(ErrorCode code, std::string message)
    : std::runtime_error(std::move(message)), code_(code) {}

Error::Error(ErrorCode code, const ErrorContext& context, std::string_view detail)
    : Error(code, [&] {
        std::string where = context.describe();
        return where.empty() ? fmt::format("{}: {}", error_code_name(code), detail)
                             : fmt::format("{}: {}: {}", where, error_code_name(code), detail);
      }()) {}

void throw_error(ErrorCode code, std::string_view where, std::string_view detail) {
  throw Error(code, fmt::format("{}: {}: {}", where, error_code_name(code), detail));
}

namespace detail {
void check_failed(const char* file, int line, const char* condition, std::string_view message) {
  throw std::logic_error(fmt::format("weft internal error at {}:{}: check failed: {}{}{}", file,
                                     line, condition, message.empty() ? "" : ": ", message));
}
}  // namespace detail

}  // namespace weft
