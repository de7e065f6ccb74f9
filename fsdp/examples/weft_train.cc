// weft-train: trains the nanoGPT-shaped GPT with FSDP on the ranks of a launcher.
//
//   weftrun --nproc-per-node 4 --standalone weft-train --n-layer 2 --n-embd 32 --steps 20
//   weftrun --nproc-per-node 4 --standalone weft-train --mesh 2x2 --mp bf16 --save ckpt/
//
// Flags and numerics follow docs/fsdp-training-contract.md, so that a PyTorch run with the same
// flags and --init weights prints the same losses. Rank 0 prints one JSON line per step:
//   {"step": 0, "loss": 4.1743..., "tokens_per_s": 5120.0, "peak_bytes": {"params": ..., ...}}
// (peak bytes per kind on rank 0, since the previous line). The global batch is split over the
// data-parallel ranks and then into --micro-batches, so the loss does not depend on either.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/device_mesh.h"
#include "weft/error.h"
#include "weft/process_group.h"

#include "fsdp/fsdp.h"
#include "fsdp/kit/models.h"
#include "fsdp/state.h"
#include "fsdp/train/data.h"
#include "fsdp/train/optim.h"
#include "fsdp/train/safetensors.h"

namespace weft {
namespace {

struct Options {
  kit::GptConfig model{.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};
  int64_t batch_size = 8;
  int steps = 10;
  std::string optim = "adamw";
  double lr = 1e-3, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, momentum = 0;
  uint64_t seed = 1337;
  std::string init, data;
  int64_t synthetic_tokens = 262144;
  uint64_t data_seed = 0;
  int micro_batches = 1;
  std::vector<int> mesh;      // empty: 1-D over the world
  bool bf16 = false;          // --mp bf16: bfloat16 gathers, float32 reduction
  bool bf16_outputs = false;  // --mp bf16-outputs: that, and every group's output in bfloat16
  bool offload = false;
  bool prefetch = true;
  bool no_comm = false;  // benchmark only: wrong results
  std::string save, load, export_path;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "weft-train: %s\n"
               "usage: weft-train [--vocab-size V] [--block-size T] [--n-layer L] [--n-head H]\n"
               "  [--n-embd C] [--batch-size B] [--steps S] [--optim adamw|sgd] [--lr X]\n"
               "  [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X] [--momentum X]\n"
               "  [--seed N] [--init FILE.safetensors] [--data FILE] [--synthetic-tokens N]\n"
               "  [--data-seed N] [--micro-batches M] [--mesh RxS] [--mp bf16|bf16-outputs]\n"
               "  [--offload] [--no-prefetch] [--save DIR] [--load DIR]\n"
               "  [--export FILE.safetensors] [--no-comm-benchmark]\n"
               "(launch under weftrun, torchrun, srun or mpirun; docs/fsdp.md)\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(flag + " needs a value");
      return argv[++i];
    };
    auto number = [&]() -> double {
      std::string v = value();
      try {
        size_t used = 0;
        double d = std::stod(v, &used);
        if (used == v.size()) return d;
      } catch (const std::exception&) {
      }
      usage(fmt::format("{} wants a number, not \"{}\"", flag, v));
    };
    if (flag == "--vocab-size")
      o.model.vocab_size = int64_t(number());
    else if (flag == "--block-size")
      o.model.block_size = int64_t(number());
    else if (flag == "--n-layer")
      o.model.n_layer = int64_t(number());
    else if (flag == "--n-head")
      o.model.n_head = int64_t(number());
    else if (flag == "--n-embd")
      o.model.n_embd = int64_t(number());
    else if (flag == "--batch-size")
      o.batch_size = int64_t(number());
    else if (flag == "--steps")
      o.steps = int(number());
    else if (flag == "--optim")
      o.optim = value();
    else if (flag == "--lr")
      o.lr = number();
    else if (flag == "--weight-decay")
      o.weight_decay = number();
    else if (flag == "--beta1")
      o.beta1 = number();
    else if (flag == "--beta2")
      o.beta2 = number();
    else if (flag == "--eps")
      o.eps = number();
    else if (flag == "--momentum")
      o.momentum = number();
    else if (flag == "--seed")
      o.seed = uint64_t(number());
    else if (flag == "--init")
      o.init = value();
    else if (flag == "--data")
      o.data = value();
    else if (flag == "--synthetic-tokens")
      o.synthetic_tokens = int64_t(number());
    else if (flag == "--data-seed")
      o.data_seed = uint64_t(number());
    else if (flag == "--micro-batches")
      o.micro_batches = int(number());
    else if (flag == "--mesh") {
      std::string v = value();
      size_t x = v.find('x');
      if (x == std::string::npos) usage("--mesh wants RxS, e.g. 2x2");
      o.mesh = {std::atoi(v.substr(0, x).c_str()), std::atoi(v.substr(x + 1).c_str())};
      if (o.mesh[0] < 1 || o.mesh[1] < 1) usage("--mesh wants RxS with R, S >= 1");
    } else if (flag == "--mp") {
      const std::string mp = value();
      if (mp != "bf16" && mp != "bf16-outputs") usage("--mp takes bf16 or bf16-outputs");
      o.bf16 = true;
      o.bf16_outputs = mp == "bf16-outputs";
    } else if (flag == "--offload")
      o.offload = true;
    else if (flag == "--no-prefetch")
      o.prefetch = false;
    else if (flag == "--no-comm-benchmark")
      o.no_comm = true;
    else if (flag == "--save")
      o.save = value();
    else if (flag == "--load")
      o.load = value();
    else if (flag == "--export")
      o.export_path = value();
    else
      usage("unknown flag " + flag);
  }
  if (o.optim != "adamw" && o.optim != "sgd") usage("--optim is adamw or sgd");
  if (o.steps < 0 || o.micro_batches < 1 || o.batch_size < 1) usage("bad counts");
  return o;
}

std::string peak_bytes_json() {
  auto& t = kit::MemoryTracker::global();
  std::string out = "{";
  for (int k = 0; k < kit::kNumMemKinds; ++k) {
    auto kind = static_cast<kit::MemKind>(k);
    out += fmt::format("{}\"{}\": {}", k ? ", " : "", kit::mem_kind_name(kind), t.peak(kind));
  }
  return out + fmt::format(", \"total\": {}}}", t.peak_total());
}

int run(const Options& o) {
  auto world = init_process_group();
  const int rank = world->rank(), size = world->size();
  std::vector<int> shape = o.mesh.empty() ? std::vector<int>{size} : o.mesh;
  std::vector<std::string> names = shape.size() == 1
                                       ? std::vector<std::string>{"dp"}
                                       : std::vector<std::string>{"replicate", "shard"};
  DeviceMesh mesh = DeviceMesh::init(DeviceKind::Cpu, shape, names, world);

  kit::GPT model(o.model);
  kit::init_gpt(model, o.seed);  // replaced by --init or --load when given
  fsdp::FullyShardOptions shard;
  if (o.bf16) {
    shard.mp_policy.param_dtype = kit::DType::BFloat16;
    shard.mp_policy.reduce_dtype = kit::DType::Float32;
    if (o.bf16_outputs) shard.mp_policy.output_dtype = kit::DType::BFloat16;
  }
  shard.offload_policy.offload = o.offload;
  // A group per block and one each for the embeddings, the final norm and the head (the root
  // keeps none): at most the two largest groups are ever gathered at once.
  std::vector<kit::Module*> groups = {&model.transformer.wte, &model.transformer.wpe};
  for (int64_t i = 0; i < o.model.n_layer; ++i) {
    groups.push_back(&model.transformer.block(size_t(i)));
  }
  groups.push_back(&model.transformer.ln_f);
  groups.push_back(&model.lm_head);
  for (kit::Module* g : groups) fsdp::fully_shard(*g, mesh, shard);
  fsdp::fully_shard(model, mesh, shard);
  if (!o.prefetch) {
    for (kit::Module* b : groups) {
      fsdp::set_modules_to_forward_prefetch(*b, {});
      fsdp::set_modules_to_backward_prefetch(*b, {});
    }
  }
  if (!o.init.empty()) fsdp::import_safetensors(model, o.init);
  if (o.no_comm) {
    // Times compute and copies alone; the losses printed are not the model's.
    if (rank == 0) std::fprintf(stderr, "weft-train: --no-comm-benchmark: results are wrong\n");
    fsdp::set_communication_enabled_for_benchmark(false);
  }

  train::Optimizer optimizer =
      o.optim == "adamw" ? train::Optimizer(train::AdamW{.lr = o.lr,
                                                         .beta1 = o.beta1,
                                                         .beta2 = o.beta2,
                                                         .eps = o.eps,
                                                         .weight_decay = o.weight_decay})
                         : train::Optimizer(train::SGD{
                               .lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  std::vector<fsdp::ShardedParam*> params = fsdp::sharded_parameters(model);
  std::vector<train::OptimizerState> states(params.size());
  int first_step = 0;
  if (!o.load.empty()) {
    fsdp::load_checkpoint(model, o.load, optimizer, states);
    first_step = states.empty() ? 0 : int(states.front().step);
  }
  // The optimizer's state lives in plain vectors; the tracker is told about it.
  const kit::MemKind state_kind = o.offload ? kit::MemKind::Host : kit::MemKind::Optimizer;
  int64_t state_bytes = 0;
  for (fsdp::ShardedParam* p : params) state_bytes += optimizer.state_bytes(p->shard.numel());
  kit::MemoryTracker::global().add(state_kind, state_bytes);

  train::TokenSource data = o.data.empty()
                                ? train::TokenSource::synthetic({.vocab_size = o.model.vocab_size,
                                                                 .n_tokens = o.synthetic_tokens,
                                                                 .seed = o.data_seed})
                                : train::TokenSource::from_file(o.data, o.model.vocab_size);
  const train::SequenceRange mine = train::rank_sequences(o.batch_size, rank, size);
  for (int step = first_step; step < first_step + o.steps; ++step) {
    kit::MemoryTracker::global().reset_peaks();
    const auto start = std::chrono::steady_clock::now();
    train::Batch batch = data.sequences(step, o.batch_size, o.model.block_size, mine);
    float loss = 0;
    for (int m = 0; m < o.micro_batches; ++m) {
      fsdp::set_requires_gradient_sync(model, m == o.micro_batches - 1);
      train::Batch micro = train::micro_batch(batch, m, o.micro_batches);
      loss += model.forward_loss(micro.inputs, micro.targets, int(micro.sequences),
                                 int(o.model.block_size)) /
              float(o.micro_batches);
      model.backward_loss();
    }
    world->all_reduce(Tensor::of(&loss, 1), ReduceOp::Avg)->wait();
    for (size_t i = 0; i < params.size(); ++i) {
      fsdp::ShardedParam& p = *params[i];
      std::span<float> grad{p.grad.f32(), size_t(p.grad.numel())};
      if (o.micro_batches > 1) {
        for (float& g : grad) g /= float(o.micro_batches);
      }
      optimizer.step({p.shard.f32(), size_t(p.shard.numel())}, grad, states[i]);
    }
    fsdp::zero_sharded_grads(model);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rank == 0) {
      const double tokens = double(o.batch_size * o.model.block_size);
      std::printf("%s\n", fmt::format("{{\"step\": {}, \"loss\": {}, \"tokens_per_s\": {:.1f}, "
                                      "\"peak_bytes\": {}}}",
                                      step, double(loss), tokens / seconds, peak_bytes_json())
                              .c_str());
      std::fflush(stdout);
    }
  }
  if (!o.save.empty()) fsdp::save_checkpoint(model, o.save, optimizer, states);
  if (!o.export_path.empty()) fsdp::export_safetensors(model, o.export_path);
  world->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace weft

int main(int argc, char** argv) {
  weft::Options options = weft::parse(argc, argv);
  try {
    return weft::run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-train: %s\n", e.what());
    return 1;
  }
}
