// weft-train: trains the nanoGPT-shaped GPT with FSDP on the ranks of a launcher.
//
//   weftrun --nproc-per-node 4 --standalone weft-train --n-layer 2 --n-embd 32 --steps 20
//   weftrun --nproc-per-node 4 --standalone weft-train --mesh 2x2 --mp bf16 --save ckpt/
//
// Flags and numerics follow docs/fsdp-training-contract.md, so that a PyTorch run with the same
// flags and --init weights prints the same losses. Rank 0 prints one JSON line per step:
//   {"step": 0, "loss": 4.1743..., "tokens_per_s": 5120.0, "exposed_comm_ms": 1.25,
//    "exposed_all_gather_ms": 0.5, "blocking_waits": 3, "peak_bytes": {"params": ..., ...}}
// (rank 0's: the time its training thread was blocked waiting for FSDP's collectives this step,
// FsdpStats::exposed_comm_ns, the all-gathers' part of it, and how many waits blocked; peak
// bytes per kind since the previous line). The global batch is split over the
// data-parallel ranks and then into --micro-batches, so the loss does not depend on either.
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <new>
#include <stdexcept>
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
  bool symmetric = true;  // --no-symmetric: FullyShardOptions::symmetric_buffers off
  bool no_comm = false;   // benchmark only: wrong results
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
               "  [--offload] [--no-prefetch] [--no-symmetric] [--save DIR] [--load DIR]\n"
               "  [--export FILE.safetensors] [--no-comm-benchmark]\n"
               "(launch under weftrun, torchrun, srun or mpirun; docs/fsdp.md)\n",
               why.c_str());
  std::exit(2);
}

// A run refused for its flags once the job has started (every rank refuses it alike): main()
// prints it and exits 2, after the groups were destroyed in order.
struct FlagError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

// `text` as an integer in [lo, hi], or usage() naming the flag, the value and the range. Written
// in decimal, or as a number with an exponent whose value is a whole number ("1e6").
int64_t parse_integer(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  const auto out_of_range = [&] {
    usage(fmt::format("{} {} is out of range: it must be an integer in [{}, {}]", flag, text, lo,
                      hi));
  };
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range && ptr == end) out_of_range();
  if (ec != std::errc() || ptr != end) {
    char* stop = nullptr;
    const double d = std::strtod(text.c_str(), &stop);
    if (text.empty() || stop != text.c_str() + text.size() || !std::isfinite(d) ||
        d != std::trunc(d)) {
      usage(fmt::format("{} wants an integer in [{}, {}], not \"{}\"", flag, lo, hi, text));
    }
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) out_of_range();
    value = static_cast<int64_t>(d);
  }
  if (value < lo || value > hi) out_of_range();
  return value;
}

uint64_t parse_seed(const std::string& flag, const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    usage(fmt::format("{} wants an integer in [0, {}], not \"{}\"", flag,
                      std::numeric_limits<uint64_t>::max(), text));
  }
  return value;
}

// `text` as a finite number, or usage() naming the flag and the value.
double parse_real(const std::string& flag, const std::string& text) {
  char* stop = nullptr;
  errno = 0;
  const double d = std::strtod(text.c_str(), &stop);
  if (text.empty() || stop != text.c_str() + text.size()) {
    usage(fmt::format("{} wants a number, not \"{}\"", flag, text));
  }
  if (!std::isfinite(d) || errno == ERANGE) {
    usage(fmt::format("{} {} is not a finite number (training would produce NaN)", flag, text));
  }
  return d;
}

// A real flag's range, checked after parsing: "must be >= 0", "must be in [0, 1)".
void check_real(const std::string& flag, double value, bool ok, std::string_view rule) {
  if (!ok) usage(fmt::format("{} {} is out of range: it must be {}", flag, value, rule));
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(flag + " needs a value");
      return argv[++i];
    };
    auto integer = [&](int64_t lo, int64_t hi) { return parse_integer(flag, value(), lo, hi); };
    auto real = [&]() { return parse_real(flag, value()); };
    if (flag == "--vocab-size")
      o.model.vocab_size = integer(1, kIntMax);  // tokens are int32
    else if (flag == "--block-size")
      o.model.block_size = integer(1, kIntMax);
    else if (flag == "--n-layer")
      o.model.n_layer = integer(1, kIntMax);
    else if (flag == "--n-head")
      o.model.n_head = integer(1, kIntMax);
    else if (flag == "--n-embd")
      o.model.n_embd = integer(1, kIntMax);
    else if (flag == "--batch-size")
      o.batch_size = integer(1, kIntMax);
    else if (flag == "--steps")
      o.steps = static_cast<int>(integer(0, kIntMax));
    else if (flag == "--optim")
      o.optim = value();
    else if (flag == "--lr")
      o.lr = real();
    else if (flag == "--weight-decay")
      o.weight_decay = real();
    else if (flag == "--beta1")
      o.beta1 = real();
    else if (flag == "--beta2")
      o.beta2 = real();
    else if (flag == "--eps")
      o.eps = real();
    else if (flag == "--momentum")
      o.momentum = real();
    else if (flag == "--seed")
      o.seed = parse_seed(flag, value());
    else if (flag == "--init")
      o.init = value();
    else if (flag == "--data")
      o.data = value();
    else if (flag == "--synthetic-tokens")
      o.synthetic_tokens = integer(0, int64_t{1} << 40);
    else if (flag == "--data-seed")
      o.data_seed = parse_seed(flag, value());
    else if (flag == "--micro-batches")
      o.micro_batches = static_cast<int>(integer(1, kIntMax));
    else if (flag == "--mesh") {
      const std::string v = value();
      const size_t x = v.find('x');
      if (x == std::string::npos) usage(fmt::format("--mesh wants RxS, e.g. 2x2, not \"{}\"", v));
      o.mesh = {
          static_cast<int>(parse_integer("--mesh " + v + ": R", v.substr(0, x), 1, kIntMax)),
          static_cast<int>(parse_integer("--mesh " + v + ": S", v.substr(x + 1), 1, kIntMax))};
    } else if (flag == "--mp") {
      const std::string mp = value();
      if (mp != "bf16" && mp != "bf16-outputs") {
        usage(fmt::format("--mp takes bf16 or bf16-outputs, not \"{}\"", mp));
      }
      o.bf16 = true;
      o.bf16_outputs = mp == "bf16-outputs";
    } else if (flag == "--offload")
      o.offload = true;
    else if (flag == "--no-prefetch")
      o.prefetch = false;
    else if (flag == "--no-symmetric")
      o.symmetric = false;
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
  if (o.optim != "adamw" && o.optim != "sgd") {
    usage(fmt::format("--optim is adamw or sgd, not \"{}\"", o.optim));
  }
  // PyTorch's own checks (torch.optim.AdamW, SGD), plus eps > 0: with eps 0, a parameter whose
  // gradient is 0 (an unused token's embedding) gets 0 / 0 = NaN.
  check_real("--lr", o.lr, o.lr >= 0, ">= 0");
  check_real("--weight-decay", o.weight_decay, o.weight_decay >= 0, ">= 0");
  check_real("--beta1", o.beta1, o.beta1 >= 0 && o.beta1 < 1, "in [0, 1)");
  check_real("--beta2", o.beta2, o.beta2 >= 0 && o.beta2 < 1, "in [0, 1)");
  check_real("--eps", o.eps, o.eps > 0,
             "> 0 (AdamW divides by sqrt(v) + eps: with 0, a parameter whose gradient is 0 gets "
             "0/0 = NaN)");
  check_real("--momentum", o.momentum, o.momentum >= 0, ">= 0");
  if (o.model.n_embd % o.model.n_head != 0) {
    usage(
        fmt::format("--n-head {} does not divide --n-embd {} (each head takes n-embd / n-head "
                    "of the embedding)",
                    o.model.n_head, o.model.n_embd));
  }
  if (o.data.empty() && o.synthetic_tokens < o.model.block_size + 2) {
    usage(
        fmt::format("--synthetic-tokens {} is too few for --block-size {}: each window is "
                    "block-size + 1 tokens and the corpus needs at least block-size + 2 = {}",
                    o.synthetic_tokens, o.model.block_size, o.model.block_size + 2));
  }
  return o;
}

// ---- What a run needs in memory, checked before anything is allocated.

// Bytes of memory this process may use: the machine's, or less under a cgroup (v2) limit.
double memory_available() {
  double bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (FILE* f = std::fopen("/sys/fs/cgroup/memory.max", "r")) {
    char text[64] = {};
    if (std::fgets(text, sizeof text, f) != nullptr) {
      char* end = nullptr;
      const double limit = std::strtod(text, &end);
      if (end != text && limit > 0) bytes = std::min(bytes, limit);  // "max" parses as nothing
    }
    std::fclose(f);
  }
  return bytes;
}

std::string bytes_text(double bytes) {
  return fmt::format("{:.0f} bytes ({:.3g} GiB)", bytes, bytes / double(1ull << 30));
}

// The model's parameter count, in double: the flags' product may not fit an int64.
double parameter_count(const kit::GptConfig& m) {
  const double V = double(m.vocab_size), T = double(m.block_size), L = double(m.n_layer),
               C = double(m.n_embd);
  return 2 * V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
}

// Refuses the run, naming the flags to change, when `need` bytes per process (times the ranks
// sharing this machine) do not fit in memory.
void check_memory(const Options& o, double need, const std::string& what) {
  int local = 1;
  if (const char* env = std::getenv("LOCAL_WORLD_SIZE")) local = std::max(1, std::atoi(env));
  const double available = memory_available();
  if (need * local <= available) return;
  throw FlagError(
      fmt::format("the model does not fit in memory: it needs about {} per rank ({}){}, and "
                  "this machine has {}; make it smaller (--n-layer {}, --n-embd {}, "
                  "--block-size {}, --vocab-size {}, --batch-size {}, --micro-batches {})",
                  bytes_text(need), what,
                  local > 1 ? fmt::format(", with {} ranks on this machine", local) : "",
                  bytes_text(available), o.model.n_layer, o.model.n_embd, o.model.block_size,
                  o.model.vocab_size, o.batch_size, o.micro_batches));
}

// The flags that need the job's size, and the memory estimate, checked on every rank alike.
// Activations per token and layer: the attention probabilities (n_head x block_size floats) and
// about 16 x n_embd more (measured with the tracker: within 10% of its peak for the benchmark's
// model); the logits and their gradient besides.
void check_run(const Options& o, int world_size) {
  if (!o.mesh.empty() && int64_t(o.mesh[0]) * o.mesh[1] != world_size) {
    throw FlagError(fmt::format("--mesh {}x{} has {} ranks but the job has {}", o.mesh[0],
                                o.mesh[1], int64_t(o.mesh[0]) * o.mesh[1], world_size));
  }
  if (o.batch_size % world_size != 0) {
    throw FlagError(
        fmt::format("--batch-size {} does not split evenly over the {} ranks (the global batch, "
                    "in sequences: make it a multiple of {})",
                    o.batch_size, world_size, world_size));
  }
  const int64_t per_rank = o.batch_size / world_size;
  if (per_rank % o.micro_batches != 0) {
    throw FlagError(
        fmt::format("--micro-batches {} does not divide the {} sequence(s) each rank trains on "
                    "(--batch-size {} over {} ranks)",
                    o.micro_batches, per_rank, o.batch_size, world_size));
  }
  const kit::GptConfig& m = o.model;
  const double params = parameter_count(m);
  const double sequences = double(per_rank / o.micro_batches);
  const double T = double(m.block_size), C = double(m.n_embd);
  const double activations =
      4 * sequences * T *
      (double(m.n_layer) * (double(m.n_head) * T + 16 * C) + 3 * double(m.vocab_size) + 4 * C);
  const double corpus = o.data.empty() ? 4 * double(o.synthetic_tokens) : 0;
  // The whole model is built on every rank before it is sharded; gradients and optimizer state
  // are sharded, gathered groups and their gradients about one model more at worst.
  const double need = 2 * 4 * params + 3 * 4 * params / world_size + activations + corpus;
  check_memory(o, need,
               fmt::format("{:.0f} parameters, {} in float32, and the activations of {:.0f} "
                           "sequence(s) of {} tokens, {}",
                           params, bytes_text(4 * params), sequences, m.block_size,
                           bytes_text(activations)));
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
  // The model's weights alone, before any rank is started.
  check_memory(o, 2 * 4 * parameter_count(o.model),
               fmt::format("{:.0f} parameters, before any activation", parameter_count(o.model)));
  auto world = init_process_group();
  const int rank = world->rank(), size = world->size();
  check_run(o, size);
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
  shard.symmetric_buffers = o.symmetric;
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
  int64_t first_step = 0;
  if (!o.load.empty()) {
    fsdp::load_checkpoint(model, o.load, optimizer, states);
    first_step = states.empty() ? 0 : states.front().step;
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
  for (int64_t step = first_step; step < first_step + o.steps; ++step) {
    kit::MemoryTracker::global().reset_peaks();
    const fsdp::FsdpStats before = fsdp::stats(model);
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
    if (!std::isfinite(loss)) {
      // The same mean on every rank: all stop here.
      throw std::runtime_error(
          fmt::format("step {}: the loss is {}: training diverged (--lr {}, --optim {}); stopping",
                      step, loss, o.lr, o.optim));
    }
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
      const fsdp::FsdpStats after = fsdp::stats(model);
      std::printf(
          "%s\n",
          fmt::format("{{\"step\": {}, \"loss\": {}, \"tokens_per_s\": {:.1f}, "
                      "\"exposed_comm_ms\": {:.3f}, \"exposed_all_gather_ms\": {:.3f}, "
                      "\"blocking_waits\": {}, \"peak_bytes\": {}}}",
                      step, double(loss), tokens / seconds,
                      double(after.exposed_comm_ns - before.exposed_comm_ns) / 1e6,
                      double(after.exposed_all_gather_ns - before.exposed_all_gather_ns) / 1e6,
                      after.blocking_waits - before.blocking_waits, peak_bytes_json())
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
  } catch (const weft::FlagError& e) {
    std::fprintf(stderr, "weft-train: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    const weft::kit::GptConfig& m = options.model;
    std::fprintf(stderr,
                 "weft-train: out of memory (std::bad_alloc): the model (--n-layer %lld "
                 "--n-embd %lld --n-head %lld --vocab-size %lld --block-size %lld), its state or "
                 "its activations (--batch-size %lld, --micro-batches %d) do not fit; make them "
                 "smaller\n",
                 static_cast<long long>(m.n_layer), static_cast<long long>(m.n_embd),
                 static_cast<long long>(m.n_head), static_cast<long long>(m.vocab_size),
                 static_cast<long long>(m.block_size), static_cast<long long>(options.batch_size),
                 options.micro_batches);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-train: %s\n", e.what());
    return 1;
  }
}
