// fsdp/train/safetensors.h: reading and writing the safetensors format, for init weights and
// checkpoints exchanged with PyTorch (safetensors.torch.save_file / load_file).
//
// The layout (https://github.com/huggingface/safetensors, README "Format"):
//
//   8 bytes    N, the header's size: unsigned 64-bit little-endian
//   N bytes    the header: UTF-8 JSON, padded with spaces to a multiple of 8
//                {"__metadata__": {"format": "pt"},
//                 "transformer.wte.weight": {"dtype": "F32", "shape": [64, 32],
//                                            "data_offsets": [0, 8192]}, ...}
//   the rest   the byte buffer: each tensor's elements, row-major, little-endian, at
//              [begin, end) of the buffer; the tensors tile the buffer without gap or overlap
//
// The writer emits what the reference implementation (safetensors 0.4, serde_json) emits for
// the same tensors in the same order: compact JSON, "__metadata__" first (left out when there is
// none), then the tensors in the order given, each with "dtype", "shape", "data_offsets", and
// the data in that order. The reference writer sorts tensors by dtype (widest first), then name; a
// list already in that order, with at most one metadata key (the reference writes metadata in hash
// order, this writer in key order), gives a byte-identical file
// (tests/fsdp/train/safetensors_test.cc checks one against safetensors 0.4.5 under PyTorch 2.6).
//
// The reader accepts any file the reference accepts, except that it refuses (as the reference
// does not) duplicate keys and a tensor entry with keys other than the three above. Every refusal
// is a weft::Error naming the file:
//
//   safetensors "ckpt.safetensors": InvalidArgument: tensor "lm_head.weight": data_offsets [0, 96]
//   hold 96 bytes but F32 [4, 8] needs 128
//
// Codes: InvalidArgument for a malformed file (or a bad argument to the writer), Io when the
// operating system fails (open, read, write, rename), with errno's text.
//
// Thread safety: free functions over values; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::train {

// Bytes per element of a safetensors dtype: "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3" (1), "I16",
// "U16", "F16", "BF16" (2), "I32", "U32", "F32" (4), "I64", "U64", "F64" (8). 0 for any other
// name. Every one of them may be read and written; TensorEntry converts F32, BF16, F16, I32, I64.
size_t safetensors_dtype_size(std::string_view dtype);

struct TensorEntry {
  std::string dtype;           // "F32", "BF16", ...
  std::vector<int64_t> shape;  // {} for a scalar (one element)
  std::vector<uint8_t> data;   // numel() * dtype size bytes, row-major, little-endian

  // The product of shape (1 for a scalar). Throws weft::Error (InvalidArgument) on a negative
  // dimension or an overflow.
  int64_t numel() const;

  static TensorEntry f32(std::vector<int64_t> shape, std::span<const float> values);
  // float32 values rounded to bfloat16 (nearest, ties to even; NaN stays NaN).
  static TensorEntry bf16(std::vector<int64_t> shape, std::span<const float> values);
  static TensorEntry i32(std::vector<int64_t> shape, std::span<const int32_t> values);
  static TensorEntry i64(std::vector<int64_t> shape, std::span<const int64_t> values);

  // The elements as float32: F32 as stored, BF16 and F16 widened (exact). Throws weft::Error
  // (InvalidArgument) for another dtype or when data's size does not match the shape.
  std::vector<float> to_f32() const;
  // The elements as int64: I64 as stored, I32 widened. Throws like to_f32().
  std::vector<int64_t> to_i64() const;
};

// Tensors by name, in the order they are written or were found in the file.
using TensorList = std::vector<std::pair<std::string, TensorEntry>>;
// The header's "__metadata__": string to string. Written in key order.
using Metadata = std::map<std::string, std::string>;

struct SafeTensors {
  Metadata metadata;
  TensorList tensors;  // in the order of their data in the buffer

  // The tensor called `name`, or nullptr.
  const TensorEntry* find(std::string_view name) const;
  // The tensor called `name`; throws weft::Error (InvalidArgument) naming it when absent.
  const TensorEntry& at(std::string_view name) const;
};

// The whole file's bytes for `tensors` (in their order) and `metadata`. Throws weft::Error
// (InvalidArgument) on an empty, duplicate or "__metadata__" name, an unknown dtype, or data
// whose size is not the shape's.
std::vector<uint8_t> serialize_safetensors(const TensorList& tensors,
                                           const Metadata& metadata = {});

// Parses and validates a whole file's bytes; `source` names them in errors (the file name).
SafeTensors parse_safetensors(std::span<const uint8_t> bytes, std::string_view source = "<memory>");

// serialize_safetensors() to `path`: written to "<path>.tmp", flushed, then renamed over `path`,
// so a reader never sees half a file.
void write_safetensors(const std::string& path, const TensorList& tensors,
                       const Metadata& metadata = {});

// Reads `path` whole and parses it.
SafeTensors read_safetensors(const std::string& path);

}  // namespace weft::train
