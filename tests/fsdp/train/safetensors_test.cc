// fsdp/train/safetensors.h: round trips, files written by hand per the format, a file from the
// reference implementation, and every malformed case refused with its reason.
#include "fsdp/train/safetensors.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

namespace weft::train {
namespace {

// A file: the 8-byte little-endian size of `header`, `header` as is, then `data`.
std::vector<uint8_t> make_file(std::string_view header, const std::vector<uint8_t>& data = {}) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

std::vector<uint8_t> f32_bytes(std::initializer_list<float> values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

// A temporary directory removed at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "/tmp/weft-safetensors-test-XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    path = name;
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path + "'";
    if (std::system(cmd.c_str()) != 0) WARN("could not remove " << path);
  }
};

TEST_CASE("safetensors round trip keeps order, dtypes, shapes, bytes and metadata",
          "[fsdp][safetensors]") {
  const std::vector<float> weight = {1.0f, -2.5f, 3.25f, 0.0f, 1e-20f, -7.0f};
  const std::vector<float> bias = {0.5f, 1.0f / 3.0f};
  const std::vector<int64_t> step = {42};
  const std::vector<int32_t> ids = {1, -2, 3};
  TensorEntry half{"F16", {2}, {0x00, 0x3c, 0x00, 0xc0}};  // 1.0, -2.0
  TensorList tensors = {
      {"transformer.h.0.attn.c_attn.weight", TensorEntry::f32({2, 3}, weight)},
      {"transformer.h.0.attn.c_attn.bias", TensorEntry::bf16({2}, bias)},
      {"step", TensorEntry::i64({}, step)},
      {"ids", TensorEntry::i32({3}, ids)},
      {"half", half},
      {"empty", TensorEntry::f32({0, 4}, {})},
      {"name with \"quotes\", \\ and é", TensorEntry::f32({1}, std::vector<float>{9.0f})},
  };
  const Metadata metadata = {{"format", "pt"}, {"note", "line\nbreak \"q\" é"}};
  const std::vector<uint8_t> file = serialize_safetensors(tensors, metadata);
  const SafeTensors back = parse_safetensors(file, "roundtrip");
  CHECK(back.metadata == metadata);
  REQUIRE(back.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO("tensor " << i << " " << tensors[i].first);
    CHECK(back.tensors[i].first == tensors[i].first);
    CHECK(back.tensors[i].second.dtype == tensors[i].second.dtype);
    CHECK(back.tensors[i].second.shape == tensors[i].second.shape);
    CHECK(back.tensors[i].second.data == tensors[i].second.data);
  }
  CHECK(back.at("transformer.h.0.attn.c_attn.weight").to_f32() == weight);
  // bfloat16 keeps 8 bits of mantissa: 1/3 rounds to 0.333984375.
  CHECK(back.at("transformer.h.0.attn.c_attn.bias").to_f32() ==
        std::vector<float>{0.5f, 0.333984375f});
  CHECK(back.at("step").to_i64() == step);
  CHECK(back.at("step").numel() == 1);
  CHECK(back.at("ids").to_i64() == std::vector<int64_t>{1, -2, 3});
  CHECK(back.at("half").to_f32() == std::vector<float>{1.0f, -2.0f});
  CHECK(back.at("empty").numel() == 0);
  CHECK(back.find("missing") == nullptr);
  CHECK_THROWS_WITH(back.at("missing"), Catch::Contains("no tensor \"missing\""));
  CHECK_THROWS_WITH(back.at("ids").to_f32(), Catch::Contains("I32 is not a floating-point"));
}

TEST_CASE("safetensors writer emits the reference layout byte for byte", "[fsdp][safetensors]") {
  const std::vector<uint8_t> file =
      serialize_safetensors({{"w", TensorEntry::f32({2}, std::vector<float>{1.0f, 2.0f})}});
  // 54 bytes of JSON padded with 2 spaces to 56, a multiple of 8.
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"
                             "  ";
  CHECK(file == make_file(header, f32_bytes({1.0f, 2.0f})));
}

TEST_CASE("safetensors header is padded with spaces so the data starts 8-byte aligned",
          "[fsdp][safetensors]") {
  for (size_t length = 1; length <= 17; ++length) {
    const std::string name(length, 'x');
    const std::vector<uint8_t> file =
        serialize_safetensors({{name, TensorEntry::f32({1}, std::vector<float>{1.0f})}});
    uint64_t n = 0;
    std::memcpy(&n, file.data(), 8);
    INFO("name length " << length << ", header " << n);
    CHECK(n % 8 == 0);
    CHECK(file.size() == 8 + n + 4);
    const std::string header(file.begin() + 8, file.begin() + 8 + static_cast<ptrdiff_t>(n));
    const size_t end = header.rfind('}');
    CHECK(n - (end + 1) < 8);
    CHECK(header.find_first_not_of(' ', end + 1) == std::string::npos);
  }
}

TEST_CASE("safetensors file from safetensors 0.4.5 (PyTorch 2.6) is the writer's output",
          "[fsdp][safetensors][pytorch]") {
  // Produced with ../shared/tools/pytorch-peer/pytorch-python (PyTorch 2.6.0, safetensors 0.4.5):
  //   save_file({"a.weight": torch.tensor([[1., 2.], [3., 4.]]), "a.bias": torch.tensor([1.5,
  //   -2.]),
  //              "b": torch.tensor([1., -0.5, 3.140625], dtype=torch.bfloat16),
  //              "step": torch.tensor(7)}, path, metadata={"format": "pt"})
  // The reference sorts by dtype (largest first), then name; our list is given in that order.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"step":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("a.bias":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("a.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[32,38]}})"
      "      ";
  const std::vector<uint8_t> data = {
      0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // step = 7
      0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0,  // a.bias = 1.5, -2
      0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40,  // a.weight = 1, 2,
      0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0x40,  //            3, 4
      0x80, 0x3f, 0x00, 0xbf, 0x49, 0x40};             // b = 1, -0.5, 3.140625 (bfloat16)
  const std::vector<uint8_t> reference = make_file(header, data);
  REQUIRE(reference.size() == 318);  // the size of the reference's file

  const SafeTensors read = parse_safetensors(reference, "reference");
  CHECK(read.metadata == Metadata{{"format", "pt"}});
  REQUIRE(read.tensors.size() == 4);
  CHECK(read.tensors[0].first == "step");
  CHECK(read.at("a.weight").to_f32() == std::vector<float>{1, 2, 3, 4});
  CHECK(read.at("b").to_f32() == std::vector<float>{1.0f, -0.5f, 3.140625f});

  const std::vector<uint8_t> written = serialize_safetensors(read.tensors, read.metadata);
  CHECK(written == reference);
}

TEST_CASE("safetensors reader takes a hand-written file with spaces, escapes and any key order",
          "[fsdp][safetensors]") {
  // Tensors listed out of offset order, keys reordered, a \u escape for "é", a surrogate pair for
  // U+1F600, no padding at all: all valid per the format.
  const std::string header =
      "{ \"z\" : {\"data_offsets\": [0, 4], \"shape\": [1], \"dtype\": \"F32\"},\n"
      "  \"caf\\u00e9.\\ud83d\\ude00\": {\"dtype\":\"BF16\",\"shape\":[2,1],"
      "\"data_offsets\":[4,8]},\t\"__metadata__\": {\"k\\/x\": \"v\\n\"} }";
  const std::vector<uint8_t> data = {0x00, 0x00, 0x20, 0x41, 0x80, 0x3f, 0x00, 0xc0};
  const SafeTensors read = parse_safetensors(make_file(header, data), "hand");
  REQUIRE(read.tensors.size() == 2);
  CHECK(read.tensors[0].first == "z");
  CHECK(read.tensors[0].second.to_f32() == std::vector<float>{10.0f});
  CHECK(read.tensors[1].first == "caf\xc3\xa9.\xf0\x9f\x98\x80");
  CHECK(read.tensors[1].second.shape == std::vector<int64_t>{2, 1});
  CHECK(read.tensors[1].second.to_f32() == std::vector<float>{1.0f, -2.0f});
  CHECK(read.metadata == Metadata{{"k/x", "v\n"}});

  // Data offsets in the opposite order of the JSON: the result is in buffer order.
  const std::string reversed = R"({"second":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                               R"("first":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const SafeTensors r = parse_safetensors(make_file(reversed, f32_bytes({1.0f, 2.0f})), "rev");
  REQUIRE(r.tensors.size() == 2);
  CHECK(r.tensors[0].first == "first");
  CHECK(r.at("second").to_f32() == std::vector<float>{2.0f});

  // No tensors at all.
  CHECK(parse_safetensors(make_file("{}"), "empty").tensors.empty());
}

// Parses `header` + `data` and expects a refusal whose message contains `message`.
void check_refused(std::string_view header, const std::vector<uint8_t>& data,
                   std::string_view message) {
  INFO("header: " << header);
  try {
    parse_safetensors(make_file(header, data), "bad.safetensors");
    FAIL("accepted");
  } catch (const weft::Error& e) {
    INFO("message: " << e.what());
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::StartsWith("safetensors \"bad.safetensors\": InvalidArgument: "));
    CHECK_THAT(e.what(), Catch::Contains(std::string(message)));
  }
}

TEST_CASE("safetensors reader refuses a bad header size", "[fsdp][safetensors]") {
  const std::vector<uint8_t> short_file = {1, 0, 0};
  CHECK_THROWS_WITH(parse_safetensors(short_file, "f"), Catch::Contains("3 bytes: too short"));
  std::vector<uint8_t> huge = make_file("{}");
  huge[4] = 1;  // 2^32 + 2
  CHECK_THROWS_WITH(parse_safetensors(huge, "f"), Catch::Contains("over the limit"));
  std::vector<uint8_t> past = make_file("{}");
  past[0] = 3;
  CHECK_THROWS_WITH(parse_safetensors(past, "f"),
                    Catch::Contains("header size 3 runs past the end of the 10-byte file"));
  check_refused("[]", {}, "header does not start with '{'");
  check_refused(" {}", {}, "header does not start with '{'");
  check_refused("", {}, "header does not start with '{'");
}

TEST_CASE("safetensors reader refuses malformed JSON with the byte it stopped at",
          "[fsdp][safetensors]") {
  check_refused("{\"a\":1,}", {}, "expected a string key at byte 7");
  check_refused("{\"a\" 1}", {}, "expected ':' at byte 5");
  check_refused("{\"a\":\"x}", {}, "unterminated string");
  check_refused("{\"a\":\"\\q\"}", {}, "invalid escape");
  check_refused("{\"a\":\"\\u12g4\"}", {}, "invalid \\u escape");
  check_refused("{\"a\":\"\\udc00\"}", {}, "lone low surrogate");
  check_refused("{\"a\":\"\\ud800x\"}", {}, "high surrogate without its low half");
  check_refused("{\"a\":\"tab\there\"}", {}, "control character in a string");
  check_refused("{\"a\":\"\xff\"}", {}, "invalid UTF-8");
  check_refused("{\"a\":\"\xc0\xaf\"}", {}, "invalid UTF-8");  // overlong '/'
  check_refused("{\"a\":01}", {}, "leading zero");
  check_refused("{\"a\":1.5}", {}, "non-integer number");
  check_refused("{\"a\":1e3}", {}, "non-integer number");
  check_refused("{\"a\":99999999999999999999}", {}, "out of the int64 range");
  check_refused("{\"a\":tru}", {}, "invalid literal");
  check_refused("{\"a\":}", {}, "unexpected character");
  check_refused("{\"a\":{}} x", {}, "unexpected text after the JSON value");
  check_refused("{\"a\":{}", {}, "expected '}', found the end");
  check_refused(R"({"a":{},"a":{}})", {}, "duplicate key \"a\"");
  check_refused("{\"a\":" + std::string(20, '[') + std::string(20, ']') + "}", {},
                "nested deeper than 16 levels");
}

TEST_CASE("safetensors reader refuses entries that break the schema", "[fsdp][safetensors]") {
  const std::vector<uint8_t> four = f32_bytes({1.0f});
  check_refused(R"({"a":[1]})", four, "tensor \"a\" is an array, not an object");
  check_refused(R"({"a":{"dtype":"F32","shape":[1]}})", four,
                "tensor \"a\" lacks \"data_offsets\"");
  check_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", four,
                "unknown key \"extra\"");
  check_refused(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", four,
                "dtype is an integer, not a string");
  check_refused(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", four,
                "tensor \"a\": unknown dtype \"Q7\"");
  check_refused(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four,
                "shape holds a negative number");
  check_refused(R"({"a":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", four,
                "shape holds a string");
  check_refused(R"({"a":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", four,
                "shape is an integer, not an array");
  check_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", four,
                "data_offsets has 3 numbers, not 2");
  check_refused(R"({"__metadata__":{"k":1}})", {},
                "__metadata__ \"k\" is an integer, not a string");
  check_refused(R"({"__metadata__":[]})", {}, "__metadata__ is an array, not an object");
}

TEST_CASE("safetensors reader refuses offsets out of range, overlapping or not tiling the buffer",
          "[fsdp][safetensors]") {
  const std::vector<uint8_t> eight = f32_bytes({1.0f, 2.0f});
  // dtype and shape against the bytes the offsets give.
  check_refused(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight,
                "tensor \"a\": data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12");
  check_refused(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", eight,
                "hold 8 bytes but BF16 [2] needs 4");
  check_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight,
                "data_offsets [8, 0] end before they begin");
  // Past the buffer's end.
  check_refused(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight,
                "the tensors cover 16 bytes but the buffer after the header has 8");
  // Bytes left over at the end.
  check_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight,
                "the tensors cover 4 bytes but the buffer after the header has 8");
  // A gap, at the start and between two tensors.
  check_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight,
                "tensor \"a\": data_offsets [4, 8] leave bytes [0, 4) unused");
  check_refused(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                eight, "tensor \"b\": data_offsets [4, 8] leave bytes [2, 4) unused");
  // Overlap.
  check_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                eight, "tensor \"b\": data_offsets [4, 8] overlap tensor \"a\"'s [0, 8]");
  // Element count overflow.
  check_refused(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                eight, "more than 2^63 elements");
}

TEST_CASE("safetensors reader names the tensor whose offsets are wrong, not its neighbour",
          "[fsdp][safetensors]") {
  const std::vector<uint8_t> twelve = f32_bytes({1.0f, 2.0f, 3.0f});
  // b belongs at [4, 8]; moved to [12, 16] it leaves a gap before c, which took the blame
  // ("tensor "c": data_offsets [8, 12] leave bytes [4, 8) unused").
  check_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]},)"
                R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                twelve,
                "tensor \"b\": data_offsets [12, 16] run past the 12 bytes the tensors take "
                "together; the other tensors leave [4, 8] for it");
  // b (first in the file) at [16, 20], past the end: c is where b should be.
  const std::vector<uint8_t> sixteen = f32_bytes({1.0f, 2.0f, 3.0f, 4.0f});
  check_refused(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},)"
                R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("c":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                sixteen,
                "tensor \"b\": data_offsets [16, 20] run past the 16 bytes the tensors take "
                "together; the other tensors leave [4, 8] for it");
  // a moved onto c's bytes: a overlaps c, and b is left where the gap starts.
  check_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                twelve,
                "the data_offsets of one of the tensors \"a\" [8, 12], \"c\" [8, 12] are wrong");
  // Two wrong: the first break is named, with the tensor before it.
  check_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[20,24]},)"
                R"("c":{"dtype":"F32","shape":[1],"data_offsets":[28,32]}})",
                twelve,
                "tensor \"b\": data_offsets [20, 24] leave bytes [4, 20) unused after tensor "
                "\"a\"'s [0, 4]");
}

TEST_CASE("safetensors writer refuses bad names, dtypes and sizes", "[fsdp][safetensors]") {
  const TensorEntry one = TensorEntry::f32({1}, std::vector<float>{1.0f});
  CHECK_THROWS_WITH(serialize_safetensors({{"a", one}, {"a", one}}),
                    Catch::Contains("tensor \"a\"") && Catch::Contains("name given twice"));
  CHECK_THROWS_WITH(serialize_safetensors({{"__metadata__", one}}),
                    Catch::Contains("reserved or empty name"));
  CHECK_THROWS_WITH(serialize_safetensors({{"", one}}), Catch::Contains("reserved or empty name"));
  CHECK_THROWS_WITH(serialize_safetensors({{"a", TensorEntry{"F32", {2}, {0, 0, 0, 0}}}}),
                    Catch::Contains("4 bytes of data but F32 [2] needs 8"));
  CHECK_THROWS_WITH(serialize_safetensors({{"a", TensorEntry{"F31", {1}, {0, 0, 0, 0}}}}),
                    Catch::Contains("unknown dtype \"F31\""));
  CHECK_THROWS_WITH(TensorEntry::f32({2, 2}, std::vector<float>{1.0f}),
                    Catch::Contains("1 values for shape [2, 2] (4 elements)"));
  CHECK(safetensors_dtype_size("F32") == 4);
  CHECK(safetensors_dtype_size("BF16") == 2);
  CHECK(safetensors_dtype_size("I64") == 8);
  CHECK(safetensors_dtype_size("BOOL") == 1);
  CHECK(safetensors_dtype_size("f32") == 0);
}

TEST_CASE("safetensors files are written whole and read back; a missing file is an Io error",
          "[fsdp][safetensors]") {
  TempDir dir;
  const std::string path = dir.path + "/model.safetensors";
  const TensorList tensors = {
      {"lm_head.weight", TensorEntry::f32({2, 2}, std::vector<float>{1, 2, 3, 4})},
      {"transformer.ln_f.bias", TensorEntry::bf16({2}, std::vector<float>{0.5f, -1.0f})}};
  write_safetensors(path, tensors, {{"step", "3"}});
  CHECK(access((path + ".tmp").c_str(), F_OK) != 0);
  const SafeTensors read = read_safetensors(path);
  CHECK(read.metadata.at("step") == "3");
  REQUIRE(read.tensors.size() == 2);
  CHECK(read.tensors[1].second.to_f32() == std::vector<float>{0.5f, -1.0f});
  // Overwriting replaces the file.
  write_safetensors(path, {tensors[0]});
  CHECK(read_safetensors(path).tensors.size() == 1);

  try {
    read_safetensors(dir.path + "/missing.safetensors");
    FAIL("read a missing file");
  } catch (const weft::Error& e) {
    CHECK(e.code() == ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::Contains("missing.safetensors") &&
                             Catch::Contains("No such file or directory"));
  }
  {
    std::ofstream truncated(dir.path + "/truncated.safetensors", std::ios::binary);
    truncated.write("\x10\0\0\0\0\0\0\0{\"a\"", 12);
  }
  CHECK_THROWS_WITH(read_safetensors(dir.path + "/truncated.safetensors"),
                    Catch::Contains("truncated.safetensors") &&
                        Catch::Contains("header size 16 runs past the end of the 12-byte file"));
  // A FIFO (which open() would wait on for a writer): refused without opening it; as the file
  // to write, it fails instead of waiting for a reader.
  const std::string fifo = dir.path + "/fifo.safetensors";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  try {
    read_safetensors(fifo);
    FAIL("read a FIFO");
  } catch (const weft::Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("fifo.safetensors") &&
                             Catch::Contains("a FIFO, not a regular file: refused without "
                                             "reading it"));
  }
  REQUIRE(mkfifo((dir.path + "/out.safetensors.tmp").c_str(), 0600) == 0);
  CHECK_THROWS_AS(write_safetensors(dir.path + "/out.safetensors", tensors), weft::Error);
}

}  // namespace
}  // namespace weft::train
