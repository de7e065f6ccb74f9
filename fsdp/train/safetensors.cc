#include "fsdp/train/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/error.h"
#include "weft/half.h"

#include "fsdp/train/input_file.h"

namespace weft::train {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is copied as is");

// The reference implementation's limit on N (safetensors' MAX_HEADER_SIZE): a header past it is
// refused before anything is allocated for it.
constexpr uint64_t kMaxHeaderSize = 100'000'000;
// The header nests three levels (file, tensor, shape); deeper input is refused, not recursed
// into.
constexpr int kMaxJsonDepth = 16;

std::string quoted(std::string_view s) { return fmt::format("\"{}\"", s); }

// ------------------------------------------------------------------------------------------------
// A strict JSON parser for the header (RFC 8259): objects keep their key order and refuse
// duplicate keys; numbers must be integers that fit in int64 (the header has no others); strings
// must be valid UTF-8 with \u escapes decoded (surrogate pairs joined, lone surrogates refused).
// Whitespace may follow the value (the header's padding), nothing else.

struct JsonValue {
  enum class Kind { Null, Bool, Integer, String, Array, Object } kind = Kind::Null;
  bool boolean = false;
  int64_t integer = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;
  size_t offset = 0;  // where the value starts in the header, for messages
};

const char* kind_name(JsonValue::Kind kind) {
  switch (kind) {
    case JsonValue::Kind::Null:
      return "null";
    case JsonValue::Kind::Bool:
      return "a boolean";
    case JsonValue::Kind::Integer:
      return "an integer";
    case JsonValue::Kind::String:
      return "a string";
    case JsonValue::Kind::Array:
      return "an array";
    case JsonValue::Kind::Object:
      return "an object";
  }
  return "?";
}

class JsonParser {
 public:
  JsonParser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  JsonValue parse_document() {
    skip_whitespace();
    JsonValue value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw_error(ErrorCode::InvalidArgument, fmt::format("safetensors {}", quoted(source_)),
                fmt::format("header JSON: {} at byte {} of the header", what, pos_));
  }

  void skip_whitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void expect(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) {
      fail(pos_ >= text_.size() ? fmt::format("expected '{}', found the end", c)
                                : fmt::format("expected '{}'", c));
    }
    ++pos_;
  }

  void expect_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail("invalid literal");
    pos_ += word.size();
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxJsonDepth) fail(fmt::format("nested deeper than {} levels", kMaxJsonDepth));
    JsonValue value;
    value.offset = pos_;
    switch (peek()) {
      case '{':
        parse_object(value, depth);
        break;
      case '[':
        parse_array(value, depth);
        break;
      case '"':
        value.kind = JsonValue::Kind::String;
        value.string = parse_string();
        break;
      case 't':
        expect_word("true");
        value.kind = JsonValue::Kind::Bool;
        value.boolean = true;
        break;
      case 'f':
        expect_word("false");
        value.kind = JsonValue::Kind::Bool;
        break;
      case 'n':
        expect_word("null");
        break;
      case '\0':
        if (pos_ >= text_.size()) fail("expected a value, found the end");
        fail("unexpected character");
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) {
          value.kind = JsonValue::Kind::Integer;
          value.integer = parse_integer();
          break;
        }
        fail("unexpected character");
    }
    return value;
  }

  void parse_object(JsonValue& value, int depth) {
    value.kind = JsonValue::Kind::Object;
    expect('{');
    skip_whitespace();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    std::set<std::string, std::less<>> keys;
    while (true) {
      skip_whitespace();
      if (peek() != '"') fail("expected a string key");
      const size_t key_offset = pos_;
      std::string key = parse_string();
      if (!keys.insert(key).second) {
        pos_ = key_offset;
        fail(fmt::format("duplicate key {}", quoted(key)));
      }
      skip_whitespace();
      expect(':');
      skip_whitespace();
      JsonValue member = parse_value(depth + 1);
      value.object.emplace_back(std::move(key), std::move(member));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return;
    }
  }

  void parse_array(JsonValue& value, int depth) {
    value.kind = JsonValue::Kind::Array;
    expect('[');
    skip_whitespace();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    while (true) {
      skip_whitespace();
      value.array.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  }

  int64_t parse_integer() {
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit");
    if (peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      fail("number with a leading zero");
    }
    // Accumulated as a negative number so that INT64_MIN fits.
    int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value < (std::numeric_limits<int64_t>::min() + digit) / 10) {
        fail("integer out of the int64 range");
      }
      value = value * 10 - digit;
      ++pos_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') fail("non-integer number");
    if (!negative) {
      if (value == std::numeric_limits<int64_t>::min()) fail("integer out of the int64 range");
      value = -value;
    }
    return value;
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      code <<= 4;
      if (c >= '0' && c <= '9') {
        code |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        code |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        code |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        --pos_;
        fail("invalid \\u escape");
      }
    }
    return code;
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xc0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xe0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  // The length of the valid UTF-8 sequence starting at pos_ (RFC 3629: no overlong forms, no
  // surrogates, nothing past U+10FFFF), or 0.
  size_t utf8_length() const {
    const auto byte = [&](size_t i) {
      return pos_ + i < text_.size() ? static_cast<uint8_t>(text_[pos_ + i]) : 0;
    };
    const auto cont = [&](size_t i) { return (byte(i) & 0xc0) == 0x80; };
    const uint8_t b0 = byte(0);
    if (b0 < 0x80) return 1;
    if (b0 >= 0xc2 && b0 <= 0xdf) return cont(1) ? 2 : 0;
    if (b0 >= 0xe0 && b0 <= 0xef) {
      const uint8_t b1 = byte(1);
      if ((b0 == 0xe0 && b1 < 0xa0) || (b0 == 0xed && b1 > 0x9f)) return 0;
      return cont(1) && cont(2) ? 3 : 0;
    }
    if (b0 >= 0xf0 && b0 <= 0xf4) {
      const uint8_t b1 = byte(1);
      if ((b0 == 0xf0 && b1 < 0x90) || (b0 == 0xf4 && b1 > 0x8f)) return 0;
      return cont(1) && cont(2) && cont(3) ? 4 : 0;
    }
    return 0;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<uint8_t>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        const size_t length = utf8_length();
        if (length == 0) fail("invalid UTF-8");
        out.append(text_.substr(pos_, length));
        pos_ += length;
        continue;
      }
      ++pos_;
      const char escape = peek();
      ++pos_;
      switch (escape) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t code = parse_hex4();
          if (code >= 0xdc00 && code <= 0xdfff) fail("lone low surrogate in a \\u escape");
          if (code >= 0xd800 && code <= 0xdbff) {
            if (text_.substr(pos_, 2) != "\\u") fail("high surrogate without its low half");
            pos_ += 2;
            const uint32_t low = parse_hex4();
            if (low < 0xdc00 || low > 0xdfff) fail("high surrogate without its low half");
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, code);
          break;
        }
        default:
          --pos_;
          fail("invalid escape");
      }
    }
  }

  std::string_view text_;
  std::string_view source_;
  size_t pos_ = 0;
};

// JSON string as serde_json writes it: '"' and '\\' escaped, control characters as \b \f \n \r
// \t or \u00XX, everything else (UTF-8 included) as is.
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<uint8_t>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// ------------------------------------------------------------------------------------------------

int64_t checked_numel(const std::vector<int64_t>& shape, std::string_view where) {
  int64_t numel = 1;
  for (const int64_t dim : shape) {
    if (dim < 0) {
      throw_error(ErrorCode::InvalidArgument, where, fmt::format("negative dimension {}", dim));
    }
    if (dim != 0 && numel > std::numeric_limits<int64_t>::max() / dim) {
      throw_error(ErrorCode::InvalidArgument, where,
                  fmt::format("shape [{}] has more than 2^63 elements", fmt::join(shape, ", ")));
    }
    numel *= dim;
  }
  return numel;
}

template <typename T>
TensorEntry make_entry(std::string dtype, std::vector<int64_t> shape, std::span<const T> values) {
  TensorEntry entry{std::move(dtype), std::move(shape), {}};
  const int64_t numel = entry.numel();
  if (static_cast<size_t>(numel) != values.size()) {
    throw_error(ErrorCode::InvalidArgument, "safetensors tensor",
                fmt::format("{} values for shape [{}] ({} elements)", values.size(),
                            fmt::join(entry.shape, ", "), numel));
  }
  entry.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(entry.data.data(), values.data(), entry.data.size());
  return entry;
}

template <typename T>
std::vector<T> load_elements(const TensorEntry& entry) {
  std::vector<T> out(entry.data.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), entry.data.data(), out.size() * sizeof(T));
  return out;
}

void check_data_size(const TensorEntry& entry, std::string_view where) {
  const int64_t numel = entry.numel();
  const size_t element = safetensors_dtype_size(entry.dtype);
  if (element == 0) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("unknown dtype {}", quoted(entry.dtype)));
  }
  if (static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / element ||
      entry.data.size() != static_cast<uint64_t>(numel) * element) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{} bytes of data but {} [{}] needs {}", entry.data.size(), entry.dtype,
                            fmt::join(entry.shape, ", "), static_cast<uint64_t>(numel) * element));
  }
}

[[noreturn]] void malformed(const std::string& where, const std::string& detail) {
  throw_error(ErrorCode::InvalidArgument, where, detail);
}

[[noreturn]] void throw_errno(std::string_view where, std::string_view what) {
  const int err = errno;
  throw_error(ErrorCode::Io, where, fmt::format("{}: {}", what, std::strerror(err)));
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

size_t safetensors_dtype_size(std::string_view dtype) {
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E5M2" ||
      dtype == "F8_E4M3") {
    return 1;
  }
  if (dtype == "I16" || dtype == "U16" || dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I32" || dtype == "U32" || dtype == "F32") return 4;
  if (dtype == "I64" || dtype == "U64" || dtype == "F64") return 8;
  return 0;
}

int64_t TensorEntry::numel() const { return checked_numel(shape, "safetensors tensor"); }

TensorEntry TensorEntry::f32(std::vector<int64_t> shape, std::span<const float> values) {
  return make_entry<float>("F32", std::move(shape), values);
}

TensorEntry TensorEntry::bf16(std::vector<int64_t> shape, std::span<const float> values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
  return make_entry<uint16_t>("BF16", std::move(shape), bits);
}

TensorEntry TensorEntry::i32(std::vector<int64_t> shape, std::span<const int32_t> values) {
  return make_entry<int32_t>("I32", std::move(shape), values);
}

TensorEntry TensorEntry::i64(std::vector<int64_t> shape, std::span<const int64_t> values) {
  return make_entry<int64_t>("I64", std::move(shape), values);
}

std::vector<float> TensorEntry::to_f32() const {
  check_data_size(*this, "safetensors tensor to_f32");
  if (dtype == "F32") return load_elements<float>(*this);
  if (dtype == "BF16" || dtype == "F16") {
    const std::vector<uint16_t> bits = load_elements<uint16_t>(*this);
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      out[i] = dtype == "BF16" ? bf16_to_float(bits[i]) : half_to_float(bits[i]);
    }
    return out;
  }
  throw_error(ErrorCode::InvalidArgument, "safetensors tensor to_f32",
              fmt::format("{} is not a floating-point dtype it converts (F32, BF16, F16)", dtype));
}

std::vector<int64_t> TensorEntry::to_i64() const {
  check_data_size(*this, "safetensors tensor to_i64");
  if (dtype == "I64") return load_elements<int64_t>(*this);
  if (dtype == "I32") {
    const std::vector<int32_t> narrow = load_elements<int32_t>(*this);
    return std::vector<int64_t>(narrow.begin(), narrow.end());
  }
  throw_error(ErrorCode::InvalidArgument, "safetensors tensor to_i64",
              fmt::format("{} is not an integer dtype it converts (I32, I64)", dtype));
}

const TensorEntry* SafeTensors::find(std::string_view name) const {
  for (const auto& [tensor_name, entry] : tensors) {
    if (tensor_name == name) return &entry;
  }
  return nullptr;
}

const TensorEntry& SafeTensors::at(std::string_view name) const {
  if (const TensorEntry* entry = find(name)) return *entry;
  throw_error(ErrorCode::InvalidArgument, "safetensors",
              fmt::format("no tensor {} among the {} in the file", quoted(name), tensors.size()));
}

std::vector<uint8_t> serialize_safetensors(const TensorList& tensors, const Metadata& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    append_json_string(header, "__metadata__");
    header += ":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      append_json_string(header, key);
      header += ':';
      append_json_string(header, value);
    }
    header += '}';
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& [name, entry] : tensors) {
    const std::string where = fmt::format("safetensors write tensor {}", quoted(name));
    if (name.empty() || name == "__metadata__") {
      throw_error(ErrorCode::InvalidArgument, where, "reserved or empty name");
    }
    if (!names.insert(name).second) {
      throw_error(ErrorCode::InvalidArgument, where, "name given twice");
    }
    check_data_size(entry, where);
    if (header.size() > 1) header += ',';
    append_json_string(header, name);
    header += fmt::format(R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", entry.dtype,
                          fmt::join(entry.shape, ","), offset, offset + entry.data.size());
    offset += entry.data.size();
  }
  header += '}';
  // Padded with spaces so that the buffer starts 8-byte aligned, as the reference writer does.
  header.append((8 - header.size() % 8) % 8, ' ');

  std::vector<uint8_t> out(8 + header.size() + offset);
  const uint64_t header_size = header.size();
  std::memcpy(out.data(), &header_size, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  uint8_t* buffer = out.data() + 8 + header.size();
  for (const auto& [name, entry] : tensors) {
    if (!entry.data.empty()) std::memcpy(buffer, entry.data.data(), entry.data.size());
    buffer += entry.data.size();
  }
  return out;
}

SafeTensors parse_safetensors(std::span<const uint8_t> bytes, std::string_view source) {
  const std::string where = fmt::format("safetensors {}", quoted(source));
  if (bytes.size() < 8) {
    malformed(where, fmt::format("{} bytes: too short for the 8-byte header size", bytes.size()));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > kMaxHeaderSize) {
    malformed(where,
              fmt::format("header size {} is over the limit of {} bytes (not a safetensors file?)",
                          header_size, kMaxHeaderSize));
  }
  if (header_size > bytes.size() - 8) {
    malformed(where, fmt::format("header size {} runs past the end of the {}-byte file",
                                 header_size, bytes.size()));
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + 8, header_size);
  if (header.empty() || header[0] != '{') malformed(where, "header does not start with '{'");
  const JsonValue root = JsonParser(header, source).parse_document();
  const std::span<const uint8_t> buffer = bytes.subspan(8 + header_size);

  struct Placed {
    std::string name;
    TensorEntry entry;
    uint64_t begin, end;
  };
  std::vector<Placed> placed;
  SafeTensors result;
  for (const auto& [name, value] : root.object) {
    if (name == "__metadata__") {
      if (value.kind != JsonValue::Kind::Object) {
        malformed(where, fmt::format("__metadata__ is {}, not an object", kind_name(value.kind)));
      }
      for (const auto& [key, item] : value.object) {
        if (item.kind != JsonValue::Kind::String) {
          malformed(where, fmt::format("__metadata__ {} is {}, not a string", quoted(key),
                                       kind_name(item.kind)));
        }
        result.metadata.emplace(key, item.string);
      }
      continue;
    }
    const std::string tensor = fmt::format("tensor {}", quoted(name));
    if (value.kind != JsonValue::Kind::Object) {
      malformed(where, fmt::format("{} is {}, not an object", tensor, kind_name(value.kind)));
    }
    const JsonValue* dtype = nullptr;
    const JsonValue* shape = nullptr;
    const JsonValue* offsets = nullptr;
    for (const auto& [key, item] : value.object) {
      if (key == "dtype") {
        dtype = &item;
      } else if (key == "shape") {
        shape = &item;
      } else if (key == "data_offsets") {
        offsets = &item;
      } else {
        malformed(where,
                  fmt::format("{} has an unknown key {} (expected dtype, shape, data_offsets)",
                              tensor, quoted(key)));
      }
    }
    if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
      malformed(where, fmt::format("{} lacks \"{}\"", tensor,
                                   dtype == nullptr   ? "dtype"
                                   : shape == nullptr ? "shape"
                                                      : "data_offsets"));
    }
    if (dtype->kind != JsonValue::Kind::String) {
      malformed(where,
                fmt::format("{}: dtype is {}, not a string", tensor, kind_name(dtype->kind)));
    }
    const size_t element = safetensors_dtype_size(dtype->string);
    if (element == 0)
      malformed(where, fmt::format("{}: unknown dtype {}", tensor, quoted(dtype->string)));
    const auto integers = [&](const JsonValue& array, const char* what) {
      if (array.kind != JsonValue::Kind::Array) {
        malformed(where,
                  fmt::format("{}: {} is {}, not an array", tensor, what, kind_name(array.kind)));
      }
      std::vector<int64_t> out;
      for (const JsonValue& item : array.array) {
        if (item.kind != JsonValue::Kind::Integer || item.integer < 0) {
          malformed(where,
                    fmt::format("{}: {} holds {}, not only non-negative integers", tensor, what,
                                item.kind == JsonValue::Kind::Integer ? "a negative number"
                                                                      : kind_name(item.kind)));
        }
        out.push_back(item.integer);
      }
      return out;
    };
    Placed entry{name, {dtype->string, integers(*shape, "shape"), {}}, 0, 0};
    const std::vector<int64_t> range = integers(*offsets, "data_offsets");
    if (range.size() != 2) {
      malformed(where, fmt::format("{}: data_offsets has {} numbers, not 2", tensor, range.size()));
    }
    entry.begin = static_cast<uint64_t>(range[0]);
    entry.end = static_cast<uint64_t>(range[1]);
    if (entry.end < entry.begin) {
      malformed(where, fmt::format("{}: data_offsets [{}, {}] end before they begin", tensor,
                                   entry.begin, entry.end));
    }
    const uint64_t numel = static_cast<uint64_t>(checked_numel(entry.entry.shape, where));
    if (numel > std::numeric_limits<uint64_t>::max() / element ||
        entry.end - entry.begin != numel * element) {
      malformed(where,
                fmt::format("{}: data_offsets [{}, {}] hold {} bytes but {} [{}] needs {}", tensor,
                            entry.begin, entry.end, entry.end - entry.begin, dtype->string,
                            fmt::join(entry.entry.shape, ", "), numel * element));
    }
    placed.push_back(std::move(entry));
  }

  // The tensors must tile the buffer: sorted by offset, each begins where the previous ended,
  // the first at 0 and the last at the buffer's end. Each tensor's size was checked against its
  // shape above, so when they do not tile, an offset is wrong: name the tensor whose offsets are
  // wrong (not the neighbour that the wrong one pushed out of place) when one can tell.
  std::stable_sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t total = 0;  // what the tensors' sizes add up to
  for (const Placed& p : placed) {
    if (__builtin_add_overflow(total, p.end - p.begin, &total)) {
      malformed(where, fmt::format("the tensors' sizes add up to more than 2^64 bytes (tensor {} "
                                   "takes {})",
                                   quoted(p.name), p.end - p.begin));
    }
  }
  // Whether the tensors other than placed[skip] tile [0, total) but for one hole of exactly
  // placed[skip]'s size (where it should be: *hole), overlapping nothing. (Compared by
  // differences: offsets may be anything below 2^64.)
  const auto fits_without = [&](size_t skip, uint64_t* hole) {
    const uint64_t size = placed[skip].end - placed[skip].begin;
    uint64_t covered = 0;
    bool holed = false;
    for (size_t i = 0; i < placed.size(); ++i) {
      if (i == skip) continue;
      if (placed[i].begin != covered) {
        if (holed || placed[i].begin < covered || placed[i].begin - covered != size) return false;
        *hole = covered;
        holed = true;
      }
      covered = placed[i].end;
    }
    if (!holed) {
      if (covered > total || total - covered != size) return false;
      *hole = covered;
    }
    return true;
  };
  // How placed[i]'s range breaks the tiling, in words.
  const auto fault = [&](size_t i) {
    const Placed& p = placed[i];
    if (p.end > total) {
      return fmt::format("run past the {} bytes the tensors take together", total);
    }
    for (size_t j = 0; j < placed.size(); ++j) {
      if (j != i && placed[j].begin < p.end && p.begin < placed[j].end) {
        return fmt::format("overlap tensor {}'s [{}, {}]", quoted(placed[j].name), placed[j].begin,
                           placed[j].end);
      }
    }
    return std::string("leave a gap");
  };
  uint64_t covered = 0;
  for (size_t i = 0; i < placed.size(); ++i) {
    if (placed[i].begin == covered) {
      covered = placed[i].end;
      continue;
    }
    // The tiling breaks at placed[i]. It is the one to blame if moving it alone would mend the
    // tiling; else the one (or ones) that would.
    std::vector<size_t> culprits;
    uint64_t hole = 0, culprit_hole = 0;
    for (size_t k = 0; k < placed.size(); ++k) {
      if (fits_without(k, &hole)) {
        culprits.push_back(k);
        culprit_hole = hole;
      }
    }
    const bool this_one = std::find(culprits.begin(), culprits.end(), i) != culprits.end();
    if (!this_one && culprits.size() == 1) {
      const Placed& p = placed[culprits[0]];
      malformed(where, fmt::format("tensor {}: data_offsets [{}, {}] {}; the other tensors leave "
                                   "[{}, {}] for it",
                                   quoted(p.name), p.begin, p.end, fault(culprits[0]), culprit_hole,
                                   culprit_hole + (p.end - p.begin)));
    }
    if (!this_one && culprits.size() > 1) {
      std::vector<std::string> names;
      for (size_t k : culprits) {
        names.push_back(
            fmt::format("{} [{}, {}]", quoted(placed[k].name), placed[k].begin, placed[k].end));
      }
      malformed(where, fmt::format("the data_offsets of one of the tensors {} are wrong (they do "
                                   "not tile the buffer, and either one moved would)",
                                   fmt::join(names, ", ")));
    }
    // placed[i] is wrong, or more than one offset is: say where the tiling first breaks.
    const Placed& p = placed[i];
    if (p.begin < covered) {
      malformed(where, fmt::format("tensor {}: data_offsets [{}, {}] overlap tensor {}'s [{}, {}]",
                                   quoted(p.name), p.begin, p.end, quoted(placed[i - 1].name),
                                   placed[i - 1].begin, placed[i - 1].end));
    }
    malformed(where, fmt::format("tensor {}: data_offsets [{}, {}] leave bytes [{}, {}) unused{}",
                                 quoted(p.name), p.begin, p.end, covered, p.begin,
                                 i == 0 || this_one
                                     ? std::string()
                                     : fmt::format(" after tensor {}'s [{}, {}]",
                                                   quoted(placed[i - 1].name), placed[i - 1].begin,
                                                   placed[i - 1].end)));
  }
  if (covered != buffer.size()) {
    malformed(where,
              fmt::format("the tensors cover {} bytes but the buffer after the header has {}",
                          covered, buffer.size()));
  }
  result.tensors.reserve(placed.size());
  for (Placed& p : placed) {
    p.entry.data.assign(buffer.begin() + static_cast<ptrdiff_t>(p.begin),
                        buffer.begin() + static_cast<ptrdiff_t>(p.end));
    result.tensors.emplace_back(std::move(p.name), std::move(p.entry));
  }
  return result;
}

void write_safetensors(const std::string& path, const TensorList& tensors,
                       const Metadata& metadata) {
  const std::vector<uint8_t> bytes = serialize_safetensors(tensors, metadata);
  const std::string where = fmt::format("safetensors write {}", quoted(path));
  const std::string tmp = path + ".tmp";
  {
    // O_NONBLOCK: a FIFO in the way fails (ENXIO) instead of waiting for a reader.
    Fd file{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK, 0644)};
    if (file.fd < 0) throw_errno(where, fmt::format("open {}", quoted(tmp)));
    struct stat st {};
    if (::fstat(file.fd, &st) == 0 && !S_ISREG(st.st_mode)) {
      throw_error(ErrorCode::InvalidArgument, where,
                  fmt::format("{} is {}, not a regular file", quoted(tmp), file_kind(st.st_mode)));
    }
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(file.fd, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno(where, fmt::format("write {}", quoted(tmp)));
      }
      done += static_cast<size_t>(n);
    }
    if (::fsync(file.fd) != 0) throw_errno(where, fmt::format("fsync {}", quoted(tmp)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw_errno(where, fmt::format("rename {} to it", quoted(tmp)));
  }
}

SafeTensors read_safetensors(const std::string& path) {
  const std::string where = fmt::format("safetensors {}", quoted(path));
  int64_t size = 0;
  Fd file{open_regular_file(path, where, &size)};
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(file.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(where, "read");
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return parse_safetensors(bytes, path);
}

}  // namespace weft::train
