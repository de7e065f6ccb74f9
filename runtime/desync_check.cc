#include "runtime/desync_check.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace weft {
namespace {

// A fixed-size summary of a collective call, exchanged under WEFT_DEBUG=detail.
struct Fingerprint {
  uint64_t seq = 0;
  uint64_t kind = 0;
  uint64_t dtype = 0;
  uint64_t op = 0;
  uint64_t root = 0;
  uint64_t input_elements = 0;
  uint64_t output_elements = 0;
  uint64_t counts_hash = 0;

  bool operator==(const Fingerprint&) const = default;

  std::string describe() const {
    std::string text = fmt::format("{} #{} {}", collective_name(static_cast<CollectiveKind>(kind)),
                                   seq, dtype_name(static_cast<DType>(dtype)));
    text += fmt::format(" in {} out {} elements", input_elements, output_elements);
    const auto k = static_cast<CollectiveKind>(kind);
    if (k == CollectiveKind::AllReduce || k == CollectiveKind::Reduce ||
        k == CollectiveKind::ReduceScatter) {
      text += fmt::format(" op {}", reduce_op_name(ReduceOp(static_cast<ReduceOp::Kind>(op))));
    }
    if (k == CollectiveKind::Reduce || k == CollectiveKind::Broadcast ||
        k == CollectiveKind::Gather || k == CollectiveKind::Scatter) {
      text += fmt::format(" root {}", root);
    }
    if (counts_hash != 0) text += fmt::format(" counts#{:016x}", counts_hash);
    return text;
  }
};

uint64_t hash_counts(const Collective& c) {
  uint64_t h = 0;
  auto mix = [&](const std::vector<size_t>& v) {
    for (size_t x : v) h = (h ^ x) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
  };
  mix(c.counts);
  // all_to_all: what this rank sends to j must be what j receives from it; the hash of the
  // transposed matrix is not local, so only the totals are compared there.
  return c.kind == CollectiveKind::AllToAll ? 0 : h;
}

Fingerprint fingerprint_of(const Collective& c, DType dtype) {
  Fingerprint f;
  f.seq = c.seq;
  f.kind = static_cast<uint64_t>(c.kind);
  f.dtype = static_cast<uint64_t>(dtype);
  f.op = c.kind == CollectiveKind::AllReduce || c.kind == CollectiveKind::Reduce ||
                 c.kind == CollectiveKind::ReduceScatter
             ? static_cast<uint64_t>(c.op.kind)
             : 0;
  f.root = c.root;
  size_t in = 0, out = 0;
  for (const Tensor& t : c.inputs) in += t.count;
  for (const Tensor& t : c.outputs) out += t.count;
  // Rooted collectives have different buffers on root and elsewhere; compare the per-rank part.
  switch (c.kind) {
    case CollectiveKind::Broadcast:
    case CollectiveKind::Reduce:
      f.input_elements = f.output_elements = std::max(in, out);
      break;
    case CollectiveKind::Gather:
      f.input_elements = f.output_elements = in;
      break;
    case CollectiveKind::Scatter:
      f.input_elements = f.output_elements = out;
      break;
    case CollectiveKind::AllToAll:
      f.input_elements = f.output_elements = 0;  // splits differ legitimately per rank
      break;
    case CollectiveKind::AllGather:  // this rank's block is counts[rank]: the hash compares counts
      f.input_elements = 0;
      f.output_elements = out;
      break;
    case CollectiveKind::ReduceScatter:
      f.input_elements = in;
      f.output_elements = 0;
      break;
    default:
      f.input_elements = in;
      f.output_elements = out;
  }
  f.counts_hash = hash_counts(c);
  return f;
}

}  // namespace

uint16_t call_fingerprint(const Collective& c, DType dtype) {
  const Fingerprint f = fingerprint_of(c, dtype);
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the fields, then folded to 16 bits
  for (uint64_t field :
       {f.kind, f.dtype, f.op, f.root, f.input_elements, f.output_elements, f.counts_hash}) {
    h = (h ^ field) * 0x100000001b3ULL;
  }
  h ^= h >> 32;
  h ^= h >> 16;
  const auto digest = static_cast<uint16_t>(h);
  return digest != 0 ? digest : 1;
}

void check_fingerprints(ProcessGroup::State& s, const Collective& c, DType dtype,
                        const ErrorContext& context) {
  Fingerprint mine = fingerprint_of(c, dtype);
  std::vector<Fingerprint> all(s.size);
  Collective exchange;
  exchange.kind = CollectiveKind::AllGather;
  exchange.seq = c.seq | kInternalSeqBit;
  const size_t words = sizeof(Fingerprint) / sizeof(uint64_t);
  exchange.inputs = {Tensor::of(reinterpret_cast<int64_t*>(&mine), words)};
  exchange.outputs = {Tensor::of(reinterpret_cast<int64_t*>(all.data()), words * s.size)};
  exchange.counts.assign(s.size, words);
  ErrorContext where = context;
  where.op += " fingerprint check";
  s.backend_for(DeviceKind::Cpu, where).post(exchange, where)->wait();
  if (std::all_of(all.begin(), all.end(), [&](const Fingerprint& f) { return f == all[0]; })) {
    return;
  }
  std::string detail = "ranks issued different collectives:";
  for (int r = 0; r < s.size; ++r) {
    detail += fmt::format("\n  rank {}: {}", r, all[r].describe());
  }
  throw Error(ErrorCode::Desync, context, detail);
}

}  // namespace weft
