// fsdp/fsdp.h: FSDP2-style per-parameter sharding of kit modules over a weft device mesh.
//
//   for (auto& block : model.blocks()) fsdp::fully_shard(*block, mesh);
//   fsdp::fully_shard(model, mesh);            // the root: what no inner call claimed
//   float loss = model.forward_loss(...);      // gathers each group before it runs
//   model.backward_loss();                     // reduce-scatters each group's gradients
//   for (fsdp::ShardedParam* p : fsdp::sharded_parameters(model)) adamw.step(p->shard, p->grad);
//
// Sharding. Every parameter is split on dim 0 like torch.chunk across the mesh's shard dimension:
// chunk = ceil(dim0 / n) rows, rank r holds rows [r * chunk, min((r + 1) * chunk, dim0)) (trailing
// ranks may hold fewer or none), padded with zeros to `chunk` rows so every rank's shard has the
// same length. Each rank keeps, per parameter, its float32 shard (the master weights the
// optimizer updates) and a float32 sharded gradient.
//
// Groups. One fully_shard(module) call makes one group of that module's parameters that no inner
// call claimed (so apply it bottom-up: blocks first, the model last). Per group and step: one
// all_gather_into_tensor of every rank's packed shards (rank-major) before the module's forward,
// after which each parameter's full tensor is copied out of the gathered buffer; the gathered
// parameters are freed after forward (reshard_after_forward; never for the root, whose backward
// starts at once), gathered again before the module's backward, and after it one
// reduce_scatter_tensor of the packed, padded gradients (average, or premul_sum by
// 1/gradient_divide_factor), asynchronously, overlapping the rest of backward; the root's
// post-backward waits for all of them. With a 2-D mesh (replicate x shard: HSDP) the
// reduce-scatter runs over the shard dimension, then an all_reduce over the replicate dimension.
//
// Symmetric buffers. When every rank of a group's shard process group can share memory (its
// allocate_symmetric() succeeds: one host, shared memory on), each group allocates two symmetric
// buffers once, at fully_shard(), and reuses them every step: the all-gather's output (the
// gather runs in place, each rank's packed shards in its own block) and the reduce-scatter's
// input followed by its output. The backend then runs both collectives zero-copy
// (docs/symmetric-memory.md). A group that cannot share memory (Unsupported) uses ordinary
// buffers, as FullyShardOptions::symmetric_buffers = false does, and says so once at
// WEFT_LOG=debug. The tracker counts these buffers under MemKind::Comm only while a collective or
// the copies around it use them (as it counts the ordinary buffers, made and freed around each
// collective); FsdpStats::symmetric_bytes says how much they hold all the time.
//
// Prefetch. A group's pre-forward hook starts the next group's all-gather (in the order the
// groups ran forward the step before, or set_modules_to_forward_prefetch's list); its
// pre-backward hook starts the previous group's (reverse order, or
// set_modules_to_backward_prefetch). So at most two groups are unsharded at a time.
//
// Not thread-safe: one thread drives the model, as with the kit.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weft/device_mesh.h"

#include "fsdp/kit/module.h"

namespace weft::fsdp {

struct MixedPrecisionPolicy {
  // dtype of the gathered parameters (bfloat16 halves all-gather traffic); unset: float32.
  std::optional<kit::DType> param_dtype;
  // dtype the gradients are reduce-scattered in; unset: param_dtype, or float32.
  std::optional<kit::DType> reduce_dtype;
  // dtype of the module's forward output (what call_forward returns); unset: as computed
  // (float32). Its gradient is rounded to the same dtype on the way back, as autograd rounds the
  // gradient of a tensor of that dtype; the kit computes in float32 from either. Applies to
  // modules run through call_forward (not to a model's loss entry point, which returns a float).
  std::optional<kit::DType> output_dtype;
};

struct OffloadPolicy {
  // FSDP2's CPU offload, with the tracker's host pool (MemKind::Host) standing for host memory
  // and every other kind for device memory. The sharded parameters and gradients live in the
  // host pool (and the optimizer state should: the optimizer steps there, as FSDP2's does on the
  // CPU). They move just in time: a group's shards are copied from the host pool into the
  // all-gather buffer (device, MemKind::Comm) when its gather is issued (host to device), and
  // the reduce-scattered gradient is added from the device buffer into the host gradient when the
  // root's backward finishes (device to host). Between steps the device holds no parameter,
  // gradient or optimizer byte (tests/fsdp checks it).
  bool offload = false;
};

struct FullyShardOptions {
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
  OffloadPolicy offload_policy;
  // Gradients are averaged over data-parallel ranks; with a factor f they are summed and divided
  // by f instead (premul_sum by 1/f).
  std::optional<double> gradient_divide_factor;
  // Gather into and reduce-scatter from symmetric buffers when the shard group can share memory
  // (above); false: ordinary buffers, made per collective (for measuring the difference). Every
  // rank passes the same value.
  bool symmetric_buffers = true;
};

// One parameter as a rank holds it.
struct ShardedParam {
  std::string fqn;                  // dotted name from the root ("transformer.h.0.ln_1.weight")
  kit::Parameter* param = nullptr;  // the module's parameter (data: gathered view or empty)
  std::vector<int64_t> full_shape;
  int64_t row_elements = 1;  // product of full_shape[1:]
  int64_t chunk_rows = 0;    // ceil(dim0 / shard size)
  int64_t rows = 0;          // rows this rank really holds (<= chunk_rows)
  kit::Tensor shard;         // float32 [chunk_rows * row_elements]; padding rows are zero
  kit::Tensor grad;          // float32, like shard; accumulates over steps until zeroed
  std::shared_ptr<ProcessGroup> shard_group;      // the ranks the rows are spread over
  std::shared_ptr<ProcessGroup> replicate_group;  // HSDP's replicas; null on a 1-D mesh
};

// Shards `module` over `mesh` (1-D: shard; 2-D: replicate x shard). Call on every rank with the
// same module tree. Error(InvalidArgument) for a mesh of more than two dimensions or a module
// already sharded.
void fully_shard(kit::Module& module, const DeviceMesh& mesh, FullyShardOptions options = {});

// Every sharded parameter under `root` (a module fully_shard was applied to), in
// named_parameters() order.
std::vector<ShardedParam*> sharded_parameters(kit::Module& root);

// Gradient accumulation: with sync off, backward keeps the unsharded gradients and skips the
// reduce-scatter; turn it back on for the last micro-batch.
void set_requires_gradient_sync(kit::Module& root, bool sync);

// Explicit prefetch: when `module`'s group runs forward (backward), start these groups'
// all-gathers. Each must be a module fully_shard was applied to.
void set_modules_to_forward_prefetch(kit::Module& module, std::vector<kit::Module*> modules);
void set_modules_to_backward_prefetch(kit::Module& module, std::vector<kit::Module*> modules);

// Zeroes every sharded gradient under `root` (after the optimizer step).
void zero_sharded_grads(kit::Module& root);

// Counters for tests and benchmarks, per root, from fully_shard() on (they only grow: read them
// before and after a step and subtract to get the step's).
struct FsdpStats {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t peak_unsharded_param_bytes = 0;
  // Exposed communication: nanoseconds (steady clock) that the thread driving the model spent
  // blocked in wait() on an FSDP collective (all-gathers waited for before a group's forward or
  // backward, or to drop a prefetch nobody used; the reduce-scatters and HSDP all_reduces the
  // root's post-backward waits for). What prefetch and the backward overlap did not hide: a
  // collective already complete when waited for costs nothing and counts nothing, so with
  // communication off (set_communication_enabled_for_benchmark) it stays 0. It includes the time
  // waiting for a late peer (a rank that is slower to get to the collective). Not counted: the
  // state.h functions' collectives, and whatever the program itself waits for (a loss all_reduce).
  int64_t exposed_comm_ns = 0;
  int64_t blocking_waits = 0;  // the waits that did block, of which exposed_comm_ns is the sum
  // The all-gathers' part of exposed_comm_ns (the rest: reduce-scatters and HSDP all_reduces,
  // where a peer that is behind in backward shows up).
  int64_t exposed_all_gather_ns = 0;
  // Collectives issued with their tensors in symmetric buffers (the backend runs them zero-copy;
  // the flight recorder's algorithm says "symmetric"), and those buffers' bytes on this rank.
  int64_t symmetric_all_gathers = 0;
  int64_t symmetric_reduce_scatters = 0;
  int64_t symmetric_bytes = 0;
};
FsdpStats stats(kit::Module& root);

// For benchmarks only: with communication off, every all-gather and reduce-scatter is replaced by
// a local copy of this rank's own data (so results are WRONG), which times the step's compute
// and copies alone. (The difference from a normal step is a noisy estimate of the exposed
// communication; FsdpStats::exposed_comm_ns measures it directly.)
void set_communication_enabled_for_benchmark(bool enabled);

}  // namespace weft::fsdp
