// fsdp/fsdp.cc: fully_shard and its hooks (fsdp.h).
//
// Each fully_shard() call makes a Group: its parameters' shards, their place in the packed
// per-rank buffer, and the collectives in flight. Groups of one model share a Context, made anew
// by each enclosing call, so the last (root) call's Context ends up holding every group: the
// forward order seen in the last step (for prefetch), the gradient-sync switch and the
// reduce-scatters the root's post-backward waits for.
#include "fsdp/fsdp.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/error.h"
#include "weft/symmetric_buffer.h"

namespace weft::fsdp {

namespace {

using kit::MemKind;

weft::DType wire_dtype(kit::DType t) {
  return t == kit::DType::BFloat16 ? weft::DType::BFloat16 : weft::DType::Float32;
}

weft::Tensor wire(kit::Tensor& t, int64_t offset, int64_t count) {
  auto* base = static_cast<char*>(t.data()) + offset * kit::dtype_size(t.dtype());
  return weft::Tensor{base, static_cast<size_t>(count), wire_dtype(t.dtype()), Device{}};
}

// Copies `n` float32 values into `dst` (of dtype `t`) at element `at`.
void store_f32(kit::Tensor& dst, int64_t at, const float* src, int64_t n) {
  if (dst.dtype() == kit::DType::Float32) {
    std::memcpy(dst.f32() + at, src, n * sizeof(float));
  } else {
    uint16_t* out = dst.bf16() + at;
    for (int64_t i = 0; i < n; ++i) out[i] = kit::float_to_bf16(src[i]);
  }
}

// Adds `n` values of `src` (of its dtype) at element `at` into float32 `dst`.
void add_into_f32(float* dst, const kit::Tensor& src, int64_t at, int64_t n) {
  if (src.dtype() == kit::DType::Float32) {
    const float* in = src.f32() + at;
    for (int64_t i = 0; i < n; ++i) dst[i] += in[i];
  } else {
    const uint16_t* in = src.bf16() + at;
    for (int64_t i = 0; i < n; ++i) dst[i] += kit::bf16_to_float(in[i]);
  }
}

struct Context;

struct Group {
  kit::Module* module = nullptr;
  FullyShardOptions options;
  std::shared_ptr<ProcessGroup> shard_pg;
  std::shared_ptr<ProcessGroup> replicate_pg;  // HSDP; null on a 1-D mesh
  int rank = 0, size = 1;
  std::vector<ShardedParam> params;
  std::vector<int64_t> offsets;  // each parameter's element offset in the packed shard
  int64_t packed = 0;            // elements per rank in the packed buffers
  std::shared_ptr<Context> ctx;

  enum class State { Sharded, Gathering, Unsharded } state = State::Sharded;
  kit::Tensor gathered;  // [size * packed], param dtype, while Gathering
  // Symmetric buffers (fsdp.h), made by fully_shard and kept; null: ordinary buffers per step.
  std::shared_ptr<SymmetricBuffer> gather_buffer;  // [size * packed], param dtype: `gathered`
  // [(size + 1) * packed], reduce dtype: the reduce-scatter's input, then this rank's output.
  std::shared_ptr<SymmetricBuffer> reduce_buffer;
  bool reduce_buffer_busy = false;  // a reduce-scatter on it that the root has not finished
  std::shared_ptr<Work> gather_work;
  std::vector<Group*> forward_prefetch, backward_prefetch;
  bool explicit_forward = false, explicit_backward = false;

  kit::DType param_dtype() const {
    return options.mp_policy.param_dtype.value_or(kit::DType::Float32);
  }
  kit::DType reduce_dtype() const { return options.mp_policy.reduce_dtype.value_or(param_dtype()); }
  int64_t unsharded_bytes() const {
    int64_t n = 0;
    for (const ShardedParam& p : params) {
      n += p.full_shape.empty() ? 1 : p.full_shape[0] * p.row_elements;
    }
    return n * static_cast<int64_t>(kit::dtype_size(param_dtype()));
  }
  // Rows of parameter p that rank r holds.
  static int64_t rows_of(const ShardedParam& p, int r) {
    int64_t dim0 = p.full_shape.empty() ? 1 : p.full_shape[0];
    return std::clamp<int64_t>(dim0 - r * p.chunk_rows, 0, p.chunk_rows);
  }
};

struct PendingReduce {
  Group* group;
  kit::Tensor input, output;
  std::shared_ptr<Work> work;
};

struct Context {
  std::vector<Group*> groups;
  Group* root = nullptr;
  std::vector<Group*> forward_order;       // this step's, as pre-forward hooks ran
  std::vector<Group*> last_forward_order;  // the previous step's
  bool sync = true;
  std::vector<PendingReduce> pending;
  FsdpStats stats;
  int64_t unsharded_bytes = 0;
};

// Module -> its group. The module's hooks own the group (so it dies with the module); the
// registry only observes, and forgets a module that is gone (its address may be reused).
std::map<const kit::Module*, std::weak_ptr<Group>>& registry() {
  static std::map<const kit::Module*, std::weak_ptr<Group>> groups;
  return groups;
}

Group* group_of(const kit::Module* module) {
  auto it = registry().find(module);
  if (it == registry().end()) return nullptr;
  std::shared_ptr<Group> alive = it->second.lock();
  if (!alive) registry().erase(it);
  return alive.get();  // the module's hooks keep it alive while the module is
}

Group& require_group(const kit::Module& module, const char* what) {
  Group* g = group_of(&module);
  if (g == nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("fsdp {}: InvalidArgument: the {} module was not passed to "
                            "fully_shard()",
                            what, module.type_name()));
  }
  return *g;
}

bool communication_enabled = true;  // set_communication_enabled_for_benchmark()

// Waits for an FSDP collective on the training thread, adding the time it blocked to the
// exposed communication (FsdpStats::exposed_comm_ns). A Work already complete did not block:
// nothing is counted (and its wait() still reports its error).
void wait_counted(Context& ctx, Work& work, bool gather) {
  if (work.is_completed()) {
    work.wait();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  work.wait();
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  ctx.stats.exposed_comm_ns += ns;
  if (gather) ctx.stats.exposed_all_gather_ns += ns;
  ++ctx.stats.blocking_waits;
}

// Shard groups that refused symmetric memory (Unsupported): asked once, not once per FSDP group.
std::vector<std::weak_ptr<ProcessGroup>>& refused_symmetric() {
  static std::vector<std::weak_ptr<ProcessGroup>> groups;
  return groups;
}

// Makes g's symmetric buffers, or leaves them null when its shard group cannot share memory.
// Collective over the shard group: every rank makes the same fully_shard calls in the same order,
// with the same sizes (every rank's packed shard has the same length).
void allocate_symmetric_buffers(Group& g) {
  std::vector<std::weak_ptr<ProcessGroup>>& refused = refused_symmetric();
  std::erase_if(refused, [](const std::weak_ptr<ProcessGroup>& w) { return w.expired(); });
  for (const std::weak_ptr<ProcessGroup>& w : refused) {
    if (w.lock() == g.shard_pg) return;
  }
  const size_t gather_bytes = g.size * g.packed * kit::dtype_size(g.param_dtype());
  const size_t reduce_bytes = (g.size + 1) * g.packed * kit::dtype_size(g.reduce_dtype());
  try {
    g.gather_buffer = g.shard_pg->allocate_symmetric(gather_bytes);
    g.reduce_buffer = g.shard_pg->allocate_symmetric(reduce_bytes);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Unsupported) throw;
    // Every rank of the group is refused alike (the group cannot share memory between all its
    // ranks): today's buffers instead, silently but for one debug line.
    g.gather_buffer.reset();
    g.reduce_buffer.reset();
    refused.push_back(g.shard_pg);
    if (config().log_level >= LogLevel::Debug) {
      std::fprintf(stderr,
                   "weft-fsdp: rank %d group \"%s\": no symmetric buffers, gathering and "
                   "reduce-scattering in ordinary memory (%s)\n",
                   g.rank, g.shard_pg->name().c_str(), e.what());
    }
  }
}

// ---- Unsharding and resharding.

void issue_gather(Group& g) {
  if (g.state != Group::State::Sharded) return;
  // The symmetric buffer is free: its last gather was waited for (unshard, reshard), and every
  // peer had finished reading this rank's block by then (the collective's last barrier).
  g.gathered = g.gather_buffer
                   ? kit::Tensor::borrow(g.gather_buffer->data(), {g.size * g.packed},
                                         g.param_dtype(), MemKind::Comm, g.gather_buffer)
                   : kit::Tensor::empty({g.size * g.packed}, g.param_dtype(), MemKind::Comm);
  for (size_t i = 0; i < g.params.size(); ++i) {
    const ShardedParam& p = g.params[i];
    store_f32(g.gathered, g.rank * g.packed + g.offsets[i], p.shard.f32(), p.shard.numel());
  }
  if (communication_enabled) {
    g.gather_work = g.shard_pg->all_gather_into_tensor(
        wire(g.gathered, 0, g.size * g.packed), wire(g.gathered, g.rank * g.packed, g.packed));
  } else {  // benchmark mode: every slot gets this rank's shards
    const size_t bytes = g.packed * kit::dtype_size(g.param_dtype());
    auto* base = static_cast<char*>(g.gathered.data());
    for (int r = 0; r < g.size; ++r) {
      if (r != g.rank) std::memcpy(base + r * bytes, base + g.rank * bytes, bytes);
    }
    g.gather_work = Work::completed();
  }
  g.state = Group::State::Gathering;
  Context& ctx = *g.ctx;
  ++ctx.stats.all_gathers;
  if (g.gather_buffer && communication_enabled) ++ctx.stats.symmetric_all_gathers;
  // Counted from the gather on: the gathered buffer holds the whole group already.
  ctx.unsharded_bytes += g.unsharded_bytes();
  ctx.stats.peak_unsharded_param_bytes =
      std::max(ctx.stats.peak_unsharded_param_bytes, ctx.unsharded_bytes);
}

void unshard(Group& g) {
  if (g.state == Group::State::Unsharded) return;
  issue_gather(g);
  wait_counted(*g.ctx, *g.gather_work, /*gather=*/true);
  g.gather_work.reset();
  const size_t width = kit::dtype_size(g.param_dtype());
  for (size_t i = 0; i < g.params.size(); ++i) {
    ShardedParam& p = g.params[i];
    kit::Tensor full = kit::Tensor::empty(p.full_shape, g.param_dtype(), MemKind::Params);
    auto* out = static_cast<char*>(full.data());
    const auto* in = static_cast<const char*>(g.gathered.data());
    for (int r = 0; r < g.size; ++r) {
      int64_t n = Group::rows_of(p, r) * p.row_elements;
      std::memcpy(out + r * p.chunk_rows * p.row_elements * width,
                  in + (r * g.packed + g.offsets[i]) * width, n * width);
    }
    p.param->data = std::move(full);
  }
  g.gathered = kit::Tensor();
  g.state = Group::State::Unsharded;
}

void reshard(Group& g) {
  if (g.state == Group::State::Gathering) {  // a prefetch nobody used: finish it, then drop it
    wait_counted(*g.ctx, *g.gather_work, /*gather=*/true);
    g.gather_work.reset();
    g.gathered = kit::Tensor();
    g.state = Group::State::Sharded;
    g.ctx->unsharded_bytes -= g.unsharded_bytes();
    return;
  }
  if (g.state != Group::State::Unsharded) return;
  for (ShardedParam& p : g.params) p.param->data = kit::Tensor();
  g.state = Group::State::Sharded;
  g.ctx->unsharded_bytes -= g.unsharded_bytes();
}

// ---- Gradients.

void reduce_gradients(Group& g) {
  const int64_t total = g.size * g.packed;
  // The symmetric buffer, unless a reduce-scatter on it is still pending (a group whose backward
  // ran twice in one step; every rank alike): then ordinary buffers for this one.
  const bool symmetric = g.reduce_buffer && !g.reduce_buffer_busy;
  kit::Tensor input, output;
  if (symmetric) {
    auto* base = static_cast<char*>(g.reduce_buffer->data());
    input = kit::Tensor::borrow(base, {total}, g.reduce_dtype(), MemKind::Comm, g.reduce_buffer);
    std::memset(input.data(), 0, input.nbytes());  // padding rows and unused parameters
    output = kit::Tensor::borrow(base + input.nbytes(), {g.packed}, g.reduce_dtype(), MemKind::Comm,
                                 g.reduce_buffer);
    g.reduce_buffer_busy = true;
  } else {
    input = kit::Tensor::zeros({total}, g.reduce_dtype(), MemKind::Comm);
  }
  for (size_t i = 0; i < g.params.size(); ++i) {
    ShardedParam& p = g.params[i];
    if (!p.param->grad.defined()) continue;  // unused this step: zeros
    const float* grad = p.param->grad.f32();
    for (int r = 0; r < g.size; ++r) {
      int64_t n = Group::rows_of(p, r) * p.row_elements;
      store_f32(input, r * g.packed + g.offsets[i], grad + r * p.chunk_rows * p.row_elements, n);
    }
    p.param->grad = kit::Tensor();  // the unsharded gradient is no longer needed
  }
  if (!symmetric) output = kit::Tensor::empty({g.packed}, g.reduce_dtype(), MemKind::Comm);
  ReduceOp op = g.options.gradient_divide_factor
                    ? ReduceOp::premul_sum(1.0 / *g.options.gradient_divide_factor)
                    : ReduceOp(ReduceOp::Avg);
  std::shared_ptr<Work> work;
  if (communication_enabled) {
    work = g.shard_pg->reduce_scatter_tensor(wire(output, 0, g.packed), wire(input, 0, total), op);
  } else {  // benchmark mode: this rank's own block only
    std::memcpy(output.data(), static_cast<char*>(input.data()) + g.rank * output.nbytes(),
                output.nbytes());
    work = Work::completed();
  }
  ++g.ctx->stats.reduce_scatters;
  if (symmetric && communication_enabled) ++g.ctx->stats.symmetric_reduce_scatters;
  g.ctx->pending.push_back({&g, std::move(input), std::move(output), std::move(work)});
}

void finish_reductions(Context& ctx) {
  for (PendingReduce& r : ctx.pending) {
    wait_counted(ctx, *r.work, /*gather=*/false);
    Group& g = *r.group;
    if (g.replicate_pg && communication_enabled) {
      ReduceOp op =
          g.options.gradient_divide_factor ? ReduceOp(ReduceOp::Sum) : ReduceOp(ReduceOp::Avg);
      wait_counted(ctx, *g.replicate_pg->all_reduce(wire(r.output, 0, g.packed), op),
                   /*gather=*/false);
    }
    for (size_t i = 0; i < g.params.size(); ++i) {
      ShardedParam& p = g.params[i];
      add_into_f32(p.grad.f32(), r.output, g.offsets[i], p.shard.numel());
    }
  }
  // Every reduce-scatter has ended on every rank (its last barrier): the buffers are free.
  for (PendingReduce& r : ctx.pending) r.group->reduce_buffer_busy = false;
  ctx.pending.clear();
}

// ---- Hooks.

// The group that ran after (forward) or before (backward) `g` in `order`, if any.
Group* neighbour(const std::vector<Group*>& order, const Group& g, int step) {
  auto it = std::find(order.begin(), order.end(), &g);
  if (it == order.end()) return nullptr;
  auto at = (it - order.begin()) + step;
  if (at < 0 || at >= static_cast<long>(order.size())) return nullptr;
  return order[at];
}

void pre_forward(Group& g) {
  Context& ctx = *g.ctx;
  if (&g == ctx.root) {
    if (!ctx.forward_order.empty()) ctx.last_forward_order = ctx.forward_order;
    ctx.forward_order.clear();
  }
  ctx.forward_order.push_back(&g);
  unshard(g);
  if (g.explicit_forward) {
    for (Group* next : g.forward_prefetch) issue_gather(*next);
  } else if (Group* next = neighbour(ctx.last_forward_order, g, +1)) {
    issue_gather(*next);
  }
}

void post_forward(Group& g) {
  if (&g != g.ctx->root && g.options.reshard_after_forward) reshard(g);
}

void pre_backward(Group& g) {
  unshard(g);
  if (g.explicit_backward) {
    for (Group* next : g.backward_prefetch) issue_gather(*next);
  } else if (Group* previous = neighbour(g.ctx->forward_order, g, -1)) {
    issue_gather(*previous);
  }
}

void post_backward(Group& g) {
  Context& ctx = *g.ctx;
  if (ctx.sync) reduce_gradients(g);
  reshard(g);
  if (&g == ctx.root) {
    finish_reductions(ctx);
    for (Group* other : ctx.groups) reshard(*other);  // prefetches nobody used
  }
}

}  // namespace

void fully_shard(kit::Module& module, const DeviceMesh& mesh, FullyShardOptions options) {
  if (group_of(&module) != nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("fully_shard: InvalidArgument: this {} module is already sharded",
                            module.type_name()));
  }
  if (mesh.ndim() < 1 || mesh.ndim() > 2) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("fully_shard: InvalidArgument: {} has {} dimensions; FSDP takes 1 "
                            "(shard) or 2 (replicate, shard: HSDP)",
                            mesh.describe(), mesh.ndim()));
  }
  auto group = std::make_shared<Group>();
  Group& g = *group;
  g.module = &module;
  g.options = options;
  const std::vector<std::string> dims = mesh.dim_names();
  g.shard_pg = mesh.group(dims.back());
  if (mesh.ndim() == 2) g.replicate_pg = mesh.group(dims.front());
  g.rank = g.shard_pg->rank();
  g.size = g.shard_pg->size();

  // The parameters inner calls claimed, and the groups this call encloses.
  auto ctx = std::make_shared<Context>();
  std::vector<const kit::Parameter*> claimed;
  for (auto& [path, child] : module.named_modules()) {
    Group* inner = child == &module ? nullptr : group_of(child);
    if (inner == nullptr || inner->ctx->root != inner) continue;  // only whole inner trees
    for (Group* member : inner->ctx->groups) {
      for (const ShardedParam& p : member->params) claimed.push_back(p.param);
      member->ctx = ctx;
      ctx->groups.push_back(member);
    }
  }
  for (auto& [name, param] : module.named_parameters()) {
    if (std::find(claimed.begin(), claimed.end(), param) != claimed.end()) continue;
    ShardedParam p;
    p.fqn = name;
    p.param = param;
    p.full_shape = param->shape;
    int64_t dim0 = p.full_shape.empty() ? 1 : p.full_shape[0];
    for (size_t d = 1; d < p.full_shape.size(); ++d) p.row_elements *= p.full_shape[d];
    p.chunk_rows = (dim0 + g.size - 1) / g.size;
    p.rows = Group::rows_of(p, g.rank);
    const MemKind where = options.offload_policy.offload ? MemKind::Host : MemKind::Params;
    p.shard = kit::Tensor::zeros({p.chunk_rows * p.row_elements}, kit::DType::Float32, where);
    kit::Tensor full = param->data_f32();
    std::memcpy(p.shard.f32(), full.f32() + g.rank * p.chunk_rows * p.row_elements,
                p.rows * p.row_elements * sizeof(float));
    p.grad = kit::Tensor::zeros({p.chunk_rows * p.row_elements}, kit::DType::Float32,
                                options.offload_policy.offload ? MemKind::Host : MemKind::Grads);
    p.shard_group = g.shard_pg;
    p.replicate_group = g.replicate_pg;
    param->data = kit::Tensor();  // the full parameter is freed: this rank keeps its shard
    param->grad = kit::Tensor();
    g.offsets.push_back(g.packed);
    g.packed += p.chunk_rows * p.row_elements;
    g.params.push_back(std::move(p));
  }
  if (options.symmetric_buffers && g.packed > 0) allocate_symmetric_buffers(g);
  g.ctx = ctx;
  ctx->groups.push_back(&g);
  ctx->root = &g;
  module.add_pre_forward_hook([group](kit::Module&) { pre_forward(*group); });
  module.add_post_forward_hook([group](kit::Module&) { post_forward(*group); });
  module.add_pre_backward_hook([group](kit::Module&) { pre_backward(*group); });
  module.add_post_backward_hook([group](kit::Module&) { post_backward(*group); });
  if (options.mp_policy.output_dtype && *options.mp_policy.output_dtype != kit::DType::Float32) {
    const kit::DType dtype = *options.mp_policy.output_dtype;
    module.set_output_transform([dtype](const kit::Tensor& y) {
      return y.defined() && y.dtype() != dtype ? y.to(dtype, MemKind::Activations) : y;
    });
    module.set_grad_output_transform([dtype](const kit::Tensor& g) {
      if (!g.defined()) return g;
      return g.to(dtype, MemKind::Activations).to(kit::DType::Float32, MemKind::Activations);
    });
  }
  registry()[&module] = group;
}

std::vector<ShardedParam*> sharded_parameters(kit::Module& root) {
  Group& g = require_group(root, "sharded_parameters");
  std::map<const kit::Parameter*, ShardedParam*> by_param;
  for (Group* member : g.ctx->groups) {
    for (ShardedParam& p : member->params) by_param[p.param] = &p;
  }
  std::vector<ShardedParam*> out;
  for (auto& [name, param] : root.named_parameters()) {
    auto it = by_param.find(param);
    if (it == by_param.end()) continue;
    it->second->fqn = name;  // names from the root
    out.push_back(it->second);
  }
  return out;
}

void set_requires_gradient_sync(kit::Module& root, bool sync) {
  require_group(root, "set_requires_gradient_sync").ctx->sync = sync;
}

void set_modules_to_forward_prefetch(kit::Module& module, std::vector<kit::Module*> modules) {
  Group& g = require_group(module, "set_modules_to_forward_prefetch");
  g.forward_prefetch.clear();
  for (kit::Module* m : modules) g.forward_prefetch.push_back(&require_group(*m, "prefetch"));
  g.explicit_forward = true;
}

void set_modules_to_backward_prefetch(kit::Module& module, std::vector<kit::Module*> modules) {
  Group& g = require_group(module, "set_modules_to_backward_prefetch");
  g.backward_prefetch.clear();
  for (kit::Module* m : modules) g.backward_prefetch.push_back(&require_group(*m, "prefetch"));
  g.explicit_backward = true;
}

void zero_sharded_grads(kit::Module& root) {
  for (ShardedParam* p : sharded_parameters(root)) p->grad.fill(0.0f);
}

FsdpStats stats(kit::Module& root) {
  const Context& ctx = *require_group(root, "stats").ctx;
  FsdpStats out = ctx.stats;
  for (const Group* g : ctx.groups) {
    for (const auto* buffer : {g->gather_buffer.get(), g->reduce_buffer.get()}) {
      if (buffer != nullptr) out.symmetric_bytes += static_cast<int64_t>(buffer->size());
    }
  }
  return out;
}

void set_communication_enabled_for_benchmark(bool enabled) { communication_enabled = enabled; }

}  // namespace weft::fsdp
