// fsdp/state.cc: full state dicts, safetensors export/import and resharding checkpoints
// (state.h).
#include "fsdp/state.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/error.h"

#include "fsdp/train/safetensors.h"

namespace weft::fsdp {

namespace {

constexpr const char* kFormat = "weft-fsdp-checkpoint-1";

int64_t dim0(const ShardedParam& p) { return p.full_shape.empty() ? 1 : p.full_shape[0]; }

int world_rank(const ShardedParam& p) {
  return p.shard_group->global_ranks()[p.shard_group->rank()];
}

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::InvalidArgument, fmt::format("fsdp state: InvalidArgument: {}", what));
}

// The first row this rank holds, and its shard's row range within the full tensor.
int64_t first_row(const ShardedParam& p) { return p.shard_group->rank() * p.chunk_rows; }

// The full padded tensor of `p`, gathered over its shard group, trimmed to dim0 rows.
FullTensor gather_full(ShardedParam& p) {
  const int n = p.shard_group->size();
  const int64_t per_rank = p.chunk_rows * p.row_elements;
  std::vector<float> all(static_cast<size_t>(per_rank * n));
  p.shard_group
      ->all_gather_into_tensor(Tensor::of(all.data(), all.size()),
                               Tensor::of(p.shard.f32(), static_cast<size_t>(per_rank)))
      ->wait();
  all.resize(static_cast<size_t>(dim0(p) * p.row_elements));
  FullTensor out;
  out.shape = p.full_shape;
  out.values = std::move(all);
  return out;
}

// Copies this rank's rows into p's shard (padding zero) from `values`, rows of the full tensor
// starting at row `values_first_row` that cover this rank's (checked by the callers).
void take_rows(ShardedParam& p, std::span<const float> values, int64_t values_first_row = 0) {
  std::fill(p.shard.f32(), p.shard.f32() + p.shard.numel(), 0.0f);
  if (p.rows == 0) return;  // a trailing rank past the last row: its first row may be too
  std::memcpy(p.shard.f32(), values.data() + (first_row(p) - values_first_row) * p.row_elements,
              static_cast<size_t>(p.rows * p.row_elements) * sizeof(float));
}

void check_shape(const ShardedParam& p, const std::vector<int64_t>& shape, const char* where) {
  if (shape != p.full_shape) {
    invalid(fmt::format("{}: parameter {} has shape {}, the model's is {}", where, p.fqn, shape,
                        p.full_shape));
  }
}

std::vector<int64_t> shard_shape(const ShardedParam& p) {
  std::vector<int64_t> shape = p.full_shape.empty() ? std::vector<int64_t>{1} : p.full_shape;
  shape[0] = p.rows;
  return shape;
}

}  // namespace

StateDict full_state_dict(kit::Module& root) {
  StateDict out;
  for (ShardedParam* p : sharded_parameters(root)) out.emplace_back(p->fqn, gather_full(*p));
  return out;
}

void load_full_state_dict(kit::Module& root, const StateDict& state) {
  std::map<std::string, const FullTensor*> by_name;
  for (const auto& [name, tensor] : state) by_name[name] = &tensor;
  for (ShardedParam* p : sharded_parameters(root)) {
    auto it = by_name.find(p->fqn);
    if (it == by_name.end()) invalid(fmt::format("load_full_state_dict: {} is missing", p->fqn));
    check_shape(*p, it->second->shape, "load_full_state_dict");
    take_rows(*p, it->second->values);
  }
}

ShardedStateDict sharded_state_dict(kit::Module& root) {
  ShardedStateDict out;
  for (ShardedParam* p : sharded_parameters(root)) {
    ShardedTensor t;
    t.full_shape = p->full_shape;
    t.first_row = std::min(first_row(*p), dim0(*p));  // a trailing rank may start past the end
    t.rows = p->rows;
    t.values.assign(p->shard.f32(), p->shard.f32() + p->rows * p->row_elements);
    out.emplace_back(p->fqn, std::move(t));
  }
  return out;
}

void load_sharded_state_dict(kit::Module& root, const ShardedStateDict& state) {
  std::map<std::string, const ShardedTensor*> by_name;
  for (const auto& [name, tensor] : state) by_name[name] = &tensor;
  // Every entry is checked before any shard changes: a bad dict leaves the model as it was.
  std::vector<std::pair<ShardedParam*, const ShardedTensor*>> plan;
  for (ShardedParam* p : sharded_parameters(root)) {
    auto it = by_name.find(p->fqn);
    if (it == by_name.end()) invalid(fmt::format("load_sharded_state_dict: {} is missing", p->fqn));
    const ShardedTensor& t = *it->second;
    check_shape(*p, t.full_shape, "load_sharded_state_dict");
    if (t.first_row < 0 || t.rows < 0 || t.first_row + t.rows > dim0(*p) ||
        static_cast<int64_t>(t.values.size()) != t.rows * p->row_elements) {
      invalid(fmt::format(
          "load_sharded_state_dict: {} holds rows [{}, {}) with {} values; its "
          "dim 0 is {} and a row has {} values",
          p->fqn, t.first_row, t.first_row + t.rows, t.values.size(), dim0(*p), p->row_elements));
    }
    const int64_t begin = first_row(*p), end = begin + p->rows;
    if (p->rows > 0 && (t.first_row > begin || t.first_row + t.rows < end)) {
      invalid(
          fmt::format("load_sharded_state_dict: {} holds rows [{}, {}); this rank (shard {} "
                      "of {}) needs rows [{}, {})",
                      p->fqn, t.first_row, t.first_row + t.rows, p->shard_group->rank(),
                      p->shard_group->size(), begin, end));
    }
    plan.emplace_back(p, &t);
  }
  for (auto [p, t] : plan) take_rows(*p, t->values, t->first_row);
}

void export_safetensors(kit::Module& root, const std::string& path) {
  std::vector<ShardedParam*> params = sharded_parameters(root);
  train::TensorList tensors;
  for (ShardedParam* p : params) {
    FullTensor full = gather_full(*p);
    tensors.emplace_back(p->fqn, train::TensorEntry::f32(full.shape, full.values));
  }
  if (!params.empty() && world_rank(*params.front()) == 0) {
    train::write_safetensors(path, tensors, {{"format", "pt"}});
  }
  if (!params.empty()) params.front()->shard_group->barrier()->wait();
}

void import_safetensors(kit::Module& root, const std::string& path) {
  train::SafeTensors file = train::read_safetensors(path);
  for (ShardedParam* p : sharded_parameters(root)) {
    const train::TensorEntry& entry = file.at(p->fqn);
    check_shape(*p, entry.shape, path.c_str());
    take_rows(*p, entry.to_f32());
  }
}

void save_checkpoint(kit::Module& root, const std::string& dir, const train::Optimizer& optimizer,
                     const std::vector<train::OptimizerState>& states) {
  std::vector<ShardedParam*> params = sharded_parameters(root);
  if (states.size() != params.size()) {
    invalid(fmt::format("save_checkpoint: {} optimizer states for {} parameters", states.size(),
                        params.size()));
  }
  if (params.empty()) return;
  std::filesystem::create_directories(dir);
  auto names = optimizer.state_names();
  train::TensorList mine;
  for (size_t i = 0; i < params.size(); ++i) {
    ShardedParam& p = *params[i];
    if (p.rows == 0) continue;
    const size_t n = static_cast<size_t>(p.rows * p.row_elements);
    mine.emplace_back(p.fqn, train::TensorEntry::f32(shard_shape(p), {p.shard.f32(), n}));
    for (size_t k = 0; k < names.size(); ++k) {
      std::vector<float> buffer(n, 0.0f);
      if (k < states[i].buffers.size()) {
        std::copy_n(states[i].buffers[k].begin(), std::min(n, states[i].buffers[k].size()),
                    buffer.begin());
      }
      mine.emplace_back(fmt::format("{}/{}", p.fqn, names[k]),
                        train::TensorEntry::f32(shard_shape(p), buffer));
    }
  }
  const int me = world_rank(*params.front());
  train::write_safetensors(fmt::format("{}/rank-{}.safetensors", dir, me), mine);

  // Everyone's row ranges, gathered: per parameter and rank, (world rank, first, end).
  std::shared_ptr<ProcessGroup> world_like = params.front()->shard_group;
  std::shared_ptr<ProcessGroup> replicas = params.front()->replicate_group;
  std::vector<int64_t> ranges;
  for (ShardedParam* p : params) {
    ranges.insert(ranges.end(), {me, first_row(*p), first_row(*p) + p->rows});
  }
  const int shard_n = world_like->size();
  std::vector<int64_t> all(ranges.size() * shard_n);
  world_like
      ->all_gather_into_tensor(Tensor::of(all.data(), all.size()),
                               Tensor::of(ranges.data(), ranges.size()))
      ->wait();
  const bool writer = me == 0;
  if (writer) {
    train::TensorList meta;
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<int64_t> chunks;
      for (int r = 0; r < shard_n; ++r) {
        const int64_t* c = &all[(r * params.size() + i) * 3];
        if (c[2] > c[1]) chunks.insert(chunks.end(), {c[0], c[1], c[2]});
      }
      meta.emplace_back(
          params[i]->fqn + "/shape",
          train::TensorEntry::i64({int64_t(params[i]->full_shape.size())}, params[i]->full_shape));
      meta.emplace_back(params[i]->fqn + "/chunks",
                        train::TensorEntry::i64({int64_t(chunks.size() / 3), 3}, chunks));
    }
    int64_t step = states.empty() ? 0 : states.front().step;
    int world_size = shard_n * (replicas ? replicas->size() : 1);
    train::write_safetensors(fmt::format("{}/metadata.safetensors", dir), meta,
                             {{"format", kFormat},
                              {"world_size", std::to_string(world_size)},
                              {"optimizer", std::string(optimizer.name())},
                              {"state_names", fmt::format("{}", fmt::join(names, ","))},
                              {"step", std::to_string(step)}});
  }
  world_like->barrier()->wait();
  if (replicas) replicas->barrier()->wait();
}

void load_checkpoint(kit::Module& root, const std::string& dir, const train::Optimizer& optimizer,
                     std::vector<train::OptimizerState>& states) {
  std::vector<ShardedParam*> params = sharded_parameters(root);
  train::SafeTensors meta = train::read_safetensors(dir + "/metadata.safetensors");
  if (meta.metadata["format"] != kFormat) {
    invalid(fmt::format("{}/metadata.safetensors is not a weft FSDP checkpoint (format \"{}\")",
                        dir, meta.metadata["format"]));
  }
  auto names = optimizer.state_names();
  if (meta.metadata["optimizer"] != optimizer.name()) {
    invalid(fmt::format("{} holds {} state, the optimizer is {}", dir, meta.metadata["optimizer"],
                        optimizer.name()));
  }
  const int64_t step = std::stoll(meta.metadata["step"]);
  std::map<int64_t, train::SafeTensors> files;  // by saved rank, read when first needed
  auto file = [&](int64_t rank) -> const train::SafeTensors& {
    auto it = files.find(rank);
    if (it == files.end()) {
      it = files
               .emplace(rank,
                        train::read_safetensors(fmt::format("{}/rank-{}.safetensors", dir, rank)))
               .first;
    }
    return it->second;
  };
  states.assign(params.size(), {});
  for (size_t i = 0; i < params.size(); ++i) {
    ShardedParam& p = *params[i];
    std::vector<int64_t> shape = meta.at(p.fqn + "/shape").to_i64();
    check_shape(p, shape, dir.c_str());
    std::vector<int64_t> chunks = meta.at(p.fqn + "/chunks").to_i64();
    const size_t n = static_cast<size_t>(p.shard.numel());
    std::vector<std::vector<float>> buffers(names.size(), std::vector<float>(n, 0.0f));
    std::fill(p.shard.f32(), p.shard.f32() + n, 0.0f);
    const int64_t want_begin = first_row(p), want_end = want_begin + p.rows;
    int64_t covered = 0;
    for (size_t c = 0; c + 2 < chunks.size(); c += 3) {
      const int64_t begin = std::max(want_begin, chunks[c + 1]);
      const int64_t end = std::min(want_end, chunks[c + 2]);
      if (begin >= end) continue;
      const train::SafeTensors& saved = file(chunks[c]);
      auto copy = [&](const std::string& name, float* dst) {
        std::vector<float> values = saved.at(name).to_f32();
        std::memcpy(dst + (begin - want_begin) * p.row_elements,
                    values.data() + (begin - chunks[c + 1]) * p.row_elements,
                    static_cast<size_t>((end - begin) * p.row_elements) * sizeof(float));
      };
      copy(p.fqn, p.shard.f32());
      for (size_t k = 0; k < names.size(); ++k) {
        copy(fmt::format("{}/{}", p.fqn, names[k]), buffers[k].data());
      }
      covered += end - begin;
    }
    if (covered < p.rows) {
      invalid(fmt::format("{}: the saved chunks of {} cover {} of rows [{}, {})", dir, p.fqn,
                          covered, want_begin, want_end));
    }
    states[i].step = step;
    states[i].buffers = std::move(buffers);
  }
}

}  // namespace weft::fsdp
