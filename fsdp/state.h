// fsdp/state.h: a sharded model's state: full state dicts, safetensors export and import, and
// sharded checkpoints that load onto a different number of ranks.
//
// Every function here is collective over the model's mesh: all ranks call it, in the same order.
//
// Checkpoint layout (DIR):
//   rank-R.safetensors   world rank R's rows of every parameter ("<fqn>", float32, shaped
//                        [rows, ...]) and of each optimizer buffer ("<fqn>/<state name>", e.g.
//                        "transformer.h.0.attn.c_attn.weight/exp_avg"); ranks holding no rows
//                        of a parameter store none.
//   metadata.safetensors written by world rank 0: per parameter "<fqn>/shape" (int64 [ndim]) and
//                        "<fqn>/chunks" (int64 [n, 3]: file rank, first row, end row), and in
//                        __metadata__: format "weft-fsdp-checkpoint-1", world_size, optimizer,
//                        state_names, step.
// Loading intersects each rank's new rows with the saved chunks, so a checkpoint written on 4
// ranks loads on 2 or on 1 (or on 8).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp.h"
#include "fsdp/train/optim.h"

namespace weft::fsdp {

struct FullTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, numel(shape) values
};
using StateDict = std::vector<std::pair<std::string, FullTensor>>;

// Every parameter's full float32 values, in named_parameters() order, gathered from the shards
// (on every rank).
StateDict full_state_dict(kit::Module& root);
// Sets every shard from full values (each rank takes its rows). Error(InvalidArgument) naming
// the parameter when one is missing or shaped differently; extra entries are ignored.
void load_full_state_dict(kit::Module& root, const StateDict& state);

// This rank's rows of one parameter and where they sit in the full tensor (what a DTensor's local
// tensor and its Shard(0) placement say, for a dim-0 shard).
struct ShardedTensor {
  std::vector<int64_t> full_shape;
  int64_t first_row = 0;      // the full tensor's row values start at (dim 0 when rows is 0)
  int64_t rows = 0;           // rows held; trailing ranks may hold none
  std::vector<float> values;  // rows x (product of full_shape[1:]) values, row-major, no padding

  bool operator==(const ShardedTensor&) const = default;
};
using ShardedStateDict = std::vector<std::pair<std::string, ShardedTensor>>;

// This rank's rows of every parameter (copies), in named_parameters() order. Local: no
// communication, so any rank may call it alone (HSDP replicas return equal dicts).
ShardedStateDict sharded_state_dict(kit::Module& root);
// Sets this rank's rows of every parameter from `state`. An entry may hold more rows than this
// rank needs (a full tensor is the entry with first_row 0 and every row), so a dict saved by the
// same rank, or gathered from several, loads. Local. Error(InvalidArgument) naming the parameter
// when its entry is missing, shaped differently, inconsistent (values vs rows) or does not cover
// this rank's rows; extra entries are ignored.
void load_sharded_state_dict(kit::Module& root, const ShardedStateDict& state);

// World rank 0 writes every full parameter as float32 (nanoGPT's names), loadable by PyTorch
// with safetensors.torch.load_file + model.load_state_dict.
void export_safetensors(kit::Module& root, const std::string& path);
// Every rank reads `path` (float32, bfloat16 or float16 tensors) and takes its rows.
void import_safetensors(kit::Module& root, const std::string& path);

// Sharded checkpoint of the parameters and, per parameter (sharded_parameters() order), the
// optimizer state (`states`, whose buffers have the shard's length).
void save_checkpoint(kit::Module& root, const std::string& dir, const train::Optimizer& optimizer,
                     const std::vector<train::OptimizerState>& states);
// Loads a checkpoint saved on any number of ranks into the shards and `states` (resized to
// sharded_parameters().size()). Error(InvalidArgument) when it does not match the model or the
// optimizer; Error(Io) when a file cannot be read.
void load_checkpoint(kit::Module& root, const std::string& dir, const train::Optimizer& optimizer,
                     std::vector<train::OptimizerState>& states);

}  // namespace weft::fsdp
