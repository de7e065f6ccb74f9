// ProcessGroup (weft/process_group.h): argument checks, sequence numbers, list staging, debug
// fingerprints and sub-groups, over the Backend interface. The group never names a backend: it
// asks the registry for the factory of whatever the backend map says.
#include "weft/process_group.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/prefix_store.h"
#include "weft/rendezvous.h"

#include "collectives/tag.h"
#include "runtime/buffer_pool.h"
#include "runtime/log.h"
#include "runtime/reduce.h"

namespace weft {

namespace {

// Internal collectives (debug fingerprints, split's color exchange) set kInternalSeqBit in
// their sequence numbers; user tags of send/recv stay at or below kMaxUserTag (tag.h has both).
using collectives::kInternalSeqBit;
constexpr uint64_t kMaxTag = collectives::kMaxUserTag;

// What every group of one world shares: the store (and its server, on the rank that hosts it).
struct World {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> store;
};

// Runs after a collective's backend Work succeeds, on the thread that completed it, before the
// user's Work completes (copies out of staging buffers).
using Epilogue = std::function<void()>;

}  // namespace

struct ProcessGroup::State {
  std::shared_ptr<World> world;
  std::shared_ptr<Store> store;  // the group's namespace in the world store
  std::string store_path;        // "weft/pg/<path>/": unique per group of a world
  int rank = 0;
  int size = 1;
  std::string name;
  std::chrono::milliseconds timeout{0};
  std::vector<int> global_ranks;
  std::string backend_text;
  std::map<std::string, std::string> backend_settings;
  std::vector<std::pair<DeviceKind, std::string>> backend_map;
  bool debug_detail = false;
  std::shared_ptr<BufferPool> staging = BufferPool::create();

  mutable std::mutex mutex;
  std::map<DeviceKind, std::unique_ptr<Backend>> backends;  // guarded by mutex
  uint64_t seq = 0;                                         // guarded by mutex
  uint64_t children = 0;                                    // guarded by mutex
  bool aborted = false;                                     // guarded by mutex
  std::string abort_reason;                                 // guarded by mutex
  bool destroyed = false;                                   // guarded by mutex
  // Coalescing (guarded by mutex).
  bool coalescing = false;
  std::vector<Collective> coalesced;
  std::vector<std::shared_ptr<Work>> coalesced_works;
  std::vector<Epilogue> coalesced_epilogues;
  std::optional<DeviceKind> coalesced_device;

  ErrorContext context(std::string_view op, uint64_t op_seq, std::string detail = {}) const {
    return ErrorContext{rank, size, name, std::string(op), op_seq, std::move(detail)};
  }

  // The backend serving `kind`, made on first use (collective: every rank uses the same kinds in
  // the same order). REQUIRES: mutex held.
  Backend& backend_for(DeviceKind kind, const ErrorContext& where) {
    auto it = backends.find(kind);
    if (it != backends.end()) return *it->second;
    auto mapped = std::find_if(backend_map.begin(), backend_map.end(),
                               [&](const auto& entry) { return entry.first == kind; });
    if (mapped == backend_map.end()) {
      throw Error(ErrorCode::Unsupported, where,
                  fmt::format("no backend serves {} tensors in this group (backend map \"{}\"; "
                              "registered backends: {})",
                              device_kind_name(kind), backend_text,
                              fmt::join(Registry::global().names(), ", ")));
    }
    Registry::Entry entry = Registry::global().find(mapped->second);
    BackendOptions options;
    options.store = std::make_shared<PrefixStore>(std::string(device_kind_name(kind)) + "/", store);
    options.rank = rank;
    options.size = size;
    options.group_name = name;
    options.timeout = timeout;
    options.global_ranks = global_ranks;
    options.settings = backend_settings;
    std::unique_ptr<Backend> backend = entry.factory(options);
    Backend& made = *backend;
    backends.emplace(kind, std::move(backend));
    return made;
  }
};

namespace {

std::string join_counts(const std::vector<size_t>& counts) {
  if (counts.size() > 8) {
    return fmt::format("[{}, ... {} entries]", fmt::join(counts.begin(), counts.begin() + 4, ", "),
                       counts.size());
  }
  return fmt::format("[{}]", fmt::join(counts, ", "));
}

// The checks every collective runs on the calling thread; each names the argument.
class Checker {
 public:
  Checker(const ProcessGroup::State& state, std::string_view op) : state_(state), op_(op) {}

  [[noreturn]] void fail(std::string detail) const {
    throw Error(ErrorCode::InvalidArgument, state_.context(op_, state_.seq + 1), detail);
  }

  void tensor(const Tensor& t, std::string_view name) const {
    if (!is_valid(t.dtype)) fail(fmt::format("{} has an invalid dtype", name));
    if (t.count > 0 && t.data == nullptr) {
      fail(fmt::format("{} has {} elements but a null data pointer", name, t.count));
    }
  }
  void same_kind(const Tensor& t, const Tensor& reference, std::string_view name,
                 std::string_view reference_name) const {
    if (t.dtype != reference.dtype) {
      fail(fmt::format("{} is {} but {} is {}", name, dtype_name(t.dtype), reference_name,
                       dtype_name(reference.dtype)));
    }
    if (t.device != reference.device) {
      fail(fmt::format("{} is on {} but {} is on {}", name, device_name(t.device), reference_name,
                       device_name(reference.device)));
    }
  }
  void count(const Tensor& t, size_t expected, std::string_view name, std::string_view why) const {
    if (t.count != expected) {
      fail(fmt::format("{} has {} elements; expected {} ({})", name, t.count, expected, why));
    }
  }
  void root(int root, std::string_view name = "root") const {
    if (root < 0 || root >= state_.size) {
      fail(fmt::format("{} {} is out of range for a group of {} ranks", name, root, state_.size));
    }
  }
  void op(DType dtype, ReduceOp op) const {
    try {
      reduce::check_supported(dtype, op);
    } catch (const Error& e) {
      fail(fmt::format("op {} cannot reduce {}: {}", describe(op), dtype_name(dtype), e.what()));
    }
  }
  void list(const std::vector<Tensor>& tensors, std::string_view name) const {
    if (tensors.size() != static_cast<size_t>(state_.size)) {
      fail(fmt::format("{} has {} tensors; expected one per rank ({})", name, tensors.size(),
                       state_.size));
    }
  }
  void counts(const std::vector<size_t>& counts, std::string_view name) const {
    if (counts.size() != static_cast<size_t>(state_.size)) {
      fail(fmt::format("{} has {} entries; expected one per rank ({})", name, counts.size(),
                       state_.size));
    }
  }

 private:
  const ProcessGroup::State& state_;
  std::string_view op_;
};

bool same_memory(const Tensor& a, const Tensor& b) { return a.data == b.data; }

// Whether the tensors lie back to back in memory (so the list is one tensor), and that tensor.
std::optional<Tensor> as_contiguous(const std::vector<Tensor>& list) {
  if (list.empty()) return std::nullopt;
  const size_t element = dtype_size(list[0].dtype);
  char* start = static_cast<char*>(list[0].data);
  size_t total = 0;
  for (const Tensor& t : list) {
    if (t.count > 0 && static_cast<char*>(t.data) != start + total * element) return std::nullopt;
    total += t.count;
  }
  if (total > 0 && start == nullptr) return std::nullopt;
  return Tensor{start, total, list[0].dtype, list[0].device};
}

std::string describe_call(const Collective& c, DType dtype, size_t count) {
  std::string text = fmt::format("{} x {}", dtype_name(dtype), count);
  switch (c.kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::ReduceScatter:
      text += ", " + describe(c.op);
      break;
    case CollectiveKind::Reduce:
      text += fmt::format(", {}, root {}", describe(c.op), c.root);
      break;
    case CollectiveKind::Broadcast:
    case CollectiveKind::Gather:
    case CollectiveKind::Scatter:
      text += fmt::format(", root {}", c.root);
      break;
    case CollectiveKind::Send:
      text += fmt::format(", to {} tag {}", c.peer, c.tag);
      break;
    case CollectiveKind::Recv:
      text += fmt::format(", from {} tag {}", c.peer, c.tag);
      break;
    default:
      break;
  }
  return text;
}

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

DType dtype_of(const Collective& c) {
  if (!c.inputs.empty()) return c.inputs[0].dtype;
  if (!c.outputs.empty()) return c.outputs[0].dtype;
  return DType::Float32;
}

Device device_of(const Collective& c) {
  if (!c.inputs.empty()) return c.inputs[0].device;
  if (!c.outputs.empty()) return c.outputs[0].device;
  return Device::cpu();
}

size_t elements_of(const Collective& c) {
  size_t n = 0;
  for (const Tensor& t : c.inputs) n = std::max(n, t.count);
  for (const Tensor& t : c.outputs) n = std::max(n, t.count);
  return n;
}

// A scattered input list copied, back to back, into a pooled buffer (at the call: the caller may
// not change inputs before the Work completes anyway). Returns the lease and the tensor over it.
std::pair<BufferPool::Lease, Tensor> stage_in(BufferPool& pool, const std::vector<Tensor>& list,
                                              const Tensor& like) {
  const size_t element = dtype_size(like.dtype);
  size_t total = 0;
  for (const Tensor& t : list) total += t.count;
  BufferPool::Lease lease = pool.acquire(total * element);
  char* to = static_cast<char*>(lease.get());
  for (const Tensor& t : list) {
    if (t.count > 0) std::memcpy(to, t.data, t.count * element);
    to += t.count * element;
  }
  return {lease, Tensor{lease.get(), total, like.dtype, like.device}};
}

// A pooled buffer for a scattered output list, and the epilogue that copies it out.
std::pair<Tensor, Epilogue> stage_out(BufferPool& pool, const std::vector<Tensor>& list,
                                      const Tensor& like) {
  const size_t element = dtype_size(like.dtype);
  size_t total = 0;
  for (const Tensor& t : list) total += t.count;
  BufferPool::Lease lease = pool.acquire(total * element);
  Tensor staged{lease.get(), total, like.dtype, like.device};
  return {staged, [lease, list, element] {
            const char* from = static_cast<const char*>(lease.get());
            for (const Tensor& t : list) {
              if (t.count > 0) std::memcpy(t.data, from, t.count * element);
              from += t.count * element;
            }
          }};
}

// A Work that completes when `inner` does, after `epilogue` ran (on inner's completing thread).
std::shared_ptr<Work> chain(const std::shared_ptr<Work>& inner, const ErrorContext& context,
                            std::chrono::milliseconds timeout, Epilogue epilogue) {
  auto outer = std::make_shared<Work>(context, timeout);
  // Waiting for the outer Work may run the inner one on the waiting thread, as for any other.
  if (inner->wait_helper()) {
    outer->set_wait_helper([inner, helper = inner->wait_helper()] { helper(); });
  }
  inner->on_complete([outer, epilogue = std::move(epilogue)](const Work& done) {
    if (std::exception_ptr error = done.exception()) {
      outer->fail(error);
      return;
    }
    try {
      if (epilogue) epilogue();
    } catch (...) {
      outer->fail(std::current_exception());
      return;
    }
    outer->complete();
  });
  return outer;
}

std::shared_ptr<ProcessGroup> make_group(std::shared_ptr<World> world, std::string store_path,
                                         int rank, int size, std::string name,
                                         std::chrono::milliseconds timeout,
                                         std::vector<int> global_ranks, std::string backend_text,
                                         std::map<std::string, std::string> settings) {
  auto state = std::make_unique<ProcessGroup::State>();
  state->world = world;
  state->store_path = store_path;
  state->store = std::make_shared<PrefixStore>("weft/pg/" + store_path + "/", world->store);
  state->rank = rank;
  state->size = size;
  state->name = std::move(name);
  state->timeout = timeout;
  state->global_ranks = std::move(global_ranks);
  state->backend_text = backend_text;
  state->backend_settings = std::move(settings);
  state->backend_map = parse_backend_map(backend_text, Registry::global());
  state->debug_detail = config().debug == "detail";
  ProcessGroup::State& s = *state;
  auto group = std::make_shared<ProcessGroup>(std::move(state));
  // The cpu backend connects now, so that a group that cannot form fails here, not at its first
  // collective.
  if (std::any_of(s.backend_map.begin(), s.backend_map.end(),
                  [](const auto& entry) { return entry.first == DeviceKind::Cpu; })) {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.backend_for(DeviceKind::Cpu, s.context("connect", 0));
  }
  WEFT_LOG_INFO("rank {}/{} group \"{}\": ready ({})", rank, size, s.name,
                s.backend_text.empty() ? "default backends" : s.backend_text);
  return group;
}

}  // namespace

// ---- The submit path, shared by every collective.

namespace {

struct Submit {
  ProcessGroup::State& s;

  // Runs the WEFT_DEBUG=detail check for `c` (already numbered) on the cpu backend: every rank
  // contributes its fingerprint and compares them all. REQUIRES: mutex held.
  void check_fingerprints(const Collective& c, const ErrorContext& context) {
    Fingerprint mine = fingerprint_of(c, dtype_of(c));
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

  std::shared_ptr<Work> operator()(Collective c, Epilogue epilogue = nullptr) {
    const DType dtype = dtype_of(c);
    const Device device = device_of(c);
    const bool p2p = c.kind == CollectiveKind::Send || c.kind == CollectiveKind::Recv;
    std::lock_guard<std::mutex> lock(s.mutex);
    const std::string_view op = collective_name(c.kind);
    if (s.destroyed) {
      throw Error(ErrorCode::InvalidArgument, s.context(op, s.seq + 1),
                  "the group has been destroyed");
    }
    if (!p2p) c.seq = ++s.seq;
    ErrorContext context = s.context(op, c.seq, describe_call(c, dtype, elements_of(c)));
    if (s.aborted) {
      return Work::failed(
          context, std::make_exception_ptr(Error(ErrorCode::Aborted, context,
                                                 "the group was aborted: " + s.abort_reason)));
    }
    if (s.coalescing) {
      if (s.coalesced_device && *s.coalesced_device != device.kind) {
        throw Error(ErrorCode::InvalidArgument, context,
                    "a coalesced group must use one device kind");
      }
      s.coalesced_device = device.kind;
      auto work = std::make_shared<Work>(context, s.timeout);
      s.coalesced.push_back(std::move(c));
      s.coalesced_works.push_back(work);
      s.coalesced_epilogues.push_back(std::move(epilogue));
      return work;
    }
    Backend& backend = s.backend_for(device.kind, context);
    if (s.debug_detail && !p2p) check_fingerprints(c, context);
    std::shared_ptr<Work> work = backend.post(std::move(c), context);
    if (!epilogue) return work;
    return chain(work, context, s.timeout, std::move(epilogue));
  }
};

}  // namespace

ProcessGroup::ProcessGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}

ProcessGroup::~ProcessGroup() {
  try {
    destroy();
  } catch (const std::exception& e) {
    WEFT_LOG_WARN("rank {}/{} group \"{}\": destroy: {}", state_->rank, state_->size, state_->name,
                  e.what());
  }
}

int ProcessGroup::rank() const { return state_->rank; }
int ProcessGroup::size() const { return state_->size; }
const std::string& ProcessGroup::name() const { return state_->name; }
std::chrono::milliseconds ProcessGroup::timeout() const { return state_->timeout; }
const std::vector<int>& ProcessGroup::global_ranks() const { return state_->global_ranks; }

uint64_t ProcessGroup::sequence_number() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->seq;
}

std::string ProcessGroup::backend_name(DeviceKind kind) const {
  for (const auto& [k, name] : state_->backend_map) {
    if (k == kind) return name;
  }
  throw Error(ErrorCode::InvalidArgument, state_->context("backend_name", 0),
              fmt::format("no backend is mapped for {}", device_kind_name(kind)));
}

// ---- Collectives.

std::shared_ptr<Work> ProcessGroup::all_reduce(Tensor tensor, ReduceOp op) {
  return all_reduce(tensor, tensor, op);
}

std::shared_ptr<Work> ProcessGroup::all_reduce(Tensor input, Tensor output, ReduceOp op) {
  Checker check(*state_, "all_reduce");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.count(output, input.count, "output", "same as input");
  check.op(input.dtype, op);
  Collective c;
  c.kind = CollectiveKind::AllReduce;
  c.inputs = {input};
  c.outputs = {output};
  c.op = op;
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::reduce(Tensor tensor, int root, ReduceOp op) {
  return reduce(tensor, tensor, root, op);
}

std::shared_ptr<Work> ProcessGroup::reduce(Tensor input, Tensor output, int root, ReduceOp op) {
  Checker check(*state_, "reduce");
  check.root(root);
  check.tensor(input, "input");
  check.op(input.dtype, op);
  Collective c;
  c.kind = CollectiveKind::Reduce;
  c.inputs = {input};
  c.op = op;
  c.root = root;
  if (rank() == root) {
    check.tensor(output, "output");
    check.same_kind(output, input, "output", "input");
    check.count(output, input.count, "output", "same as input");
    c.outputs = {output};
  }
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::broadcast(Tensor tensor, int root) {
  Checker check(*state_, "broadcast");
  check.root(root);
  check.tensor(tensor, "tensor");
  Collective c;
  c.kind = CollectiveKind::Broadcast;
  if (rank() == root) c.inputs = {tensor};
  c.outputs = {tensor};
  c.root = root;
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::all_gather(std::vector<Tensor> outputs, Tensor input) {
  Checker check(*state_, "all_gather");
  check.tensor(input, "input");
  check.list(outputs, "outputs");
  std::vector<size_t> counts;
  for (int r = 0; r < size(); ++r) {
    const std::string name = fmt::format("outputs[{}]", r);
    check.tensor(outputs[r], name);
    check.same_kind(outputs[r], input, name, "input");
    counts.push_back(outputs[r].count);
  }
  check.count(input, counts[rank()], "input", "the size of this rank's entry in outputs");
  Collective c;
  c.kind = CollectiveKind::AllGather;
  c.counts = counts;
  c.inputs = {input};
  if (std::optional<Tensor> whole = as_contiguous(outputs)) {
    c.outputs = {*whole};
    return Submit{*state_}(std::move(c));
  }
  auto [staged, copy_out] = stage_out(*state_->staging, outputs, input);
  c.outputs = {staged};
  return Submit{*state_}(std::move(c), std::move(copy_out));
}

std::shared_ptr<Work> ProcessGroup::all_gather_into_tensor(Tensor output, Tensor input) {
  Checker check(*state_, "all_gather_into_tensor");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.count(output, input.count * size(), "output", "size() * input.count");
  Collective c;
  c.kind = CollectiveKind::AllGather;
  c.counts.assign(size(), input.count);
  c.inputs = {input};
  c.outputs = {output};
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::all_gather_uneven(Tensor output, Tensor input,
                                                      std::vector<size_t> counts) {
  Checker check(*state_, "all_gather_uneven");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.counts(counts, "counts");
  check.count(input, counts[rank()], "input", "counts[rank()]");
  check.count(output, std::accumulate(counts.begin(), counts.end(), size_t{0}), "output",
              "sum of counts " + join_counts(counts));
  Collective c;
  c.kind = CollectiveKind::AllGather;
  c.counts = std::move(counts);
  c.inputs = {input};
  c.outputs = {output};
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(Tensor output, std::vector<Tensor> inputs,
                                                   ReduceOp op) {
  Checker check(*state_, "reduce_scatter");
  check.tensor(output, "output");
  check.list(inputs, "inputs");
  check.op(output.dtype, op);
  for (int r = 0; r < size(); ++r) {
    const std::string name = fmt::format("inputs[{}]", r);
    check.tensor(inputs[r], name);
    check.same_kind(inputs[r], output, name, "output");
    check.count(inputs[r], output.count, name, "same as output");
  }
  Collective c;
  c.kind = CollectiveKind::ReduceScatter;
  c.counts.assign(size(), output.count);
  c.outputs = {output};
  c.op = op;
  if (std::optional<Tensor> whole = as_contiguous(inputs)) {
    c.inputs = {*whole};
    return Submit{*state_}(std::move(c));
  }
  auto [lease, staged] = stage_in(*state_->staging, inputs, output);
  c.inputs = {staged};
  return Submit{*state_}(std::move(c), [lease] {});
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_tensor(Tensor output, Tensor input,
                                                          ReduceOp op) {
  Checker check(*state_, "reduce_scatter_tensor");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.count(input, output.count * size(), "input", "size() * output.count");
  check.op(input.dtype, op);
  Collective c;
  c.kind = CollectiveKind::ReduceScatter;
  c.counts.assign(size(), output.count);
  c.inputs = {input};
  c.outputs = {output};
  c.op = op;
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_uneven(Tensor output, Tensor input,
                                                          std::vector<size_t> counts, ReduceOp op) {
  Checker check(*state_, "reduce_scatter_uneven");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.counts(counts, "counts");
  check.count(output, counts[rank()], "output", "counts[rank()]");
  check.count(input, std::accumulate(counts.begin(), counts.end(), size_t{0}), "input",
              "sum of counts " + join_counts(counts));
  check.op(input.dtype, op);
  Collective c;
  c.kind = CollectiveKind::ReduceScatter;
  c.counts = std::move(counts);
  c.inputs = {input};
  c.outputs = {output};
  c.op = op;
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::gather(std::vector<Tensor> outputs, Tensor input, int root) {
  Checker check(*state_, "gather");
  check.root(root);
  check.tensor(input, "input");
  if (rank() != root) {
    if (!outputs.empty()) check.fail("outputs must be empty on ranks other than root");
    Collective c;
    c.kind = CollectiveKind::Gather;
    c.inputs = {input};
    c.root = root;
    return Submit{*state_}(std::move(c));
  }
  check.list(outputs, "outputs");
  for (int r = 0; r < size(); ++r) {
    const std::string name = fmt::format("outputs[{}]", r);
    check.tensor(outputs[r], name);
    check.same_kind(outputs[r], input, name, "input");
    check.count(outputs[r], input.count, name, "same as input");
  }
  Collective c;
  c.kind = CollectiveKind::Gather;
  c.inputs = {input};
  c.root = root;
  if (std::optional<Tensor> whole = as_contiguous(outputs)) {
    c.outputs = {*whole};
    return Submit{*state_}(std::move(c));
  }
  auto [staged, copy_out] = stage_out(*state_->staging, outputs, input);
  c.outputs = {staged};
  return Submit{*state_}(std::move(c), std::move(copy_out));
}

std::shared_ptr<Work> ProcessGroup::gather_into_tensor(Tensor output, Tensor input, int root) {
  Checker check(*state_, "gather_into_tensor");
  check.root(root);
  check.tensor(input, "input");
  Collective c;
  c.kind = CollectiveKind::Gather;
  c.inputs = {input};
  c.root = root;
  if (rank() == root) {
    check.tensor(output, "output");
    check.same_kind(output, input, "output", "input");
    check.count(output, input.count * size(), "output", "size() * input.count");
    c.outputs = {output};
  }
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::scatter(Tensor output, std::vector<Tensor> inputs, int root) {
  Checker check(*state_, "scatter");
  check.root(root);
  check.tensor(output, "output");
  Collective c;
  c.kind = CollectiveKind::Scatter;
  c.outputs = {output};
  c.root = root;
  if (rank() != root) {
    if (!inputs.empty()) check.fail("inputs must be empty on ranks other than root");
    return Submit{*state_}(std::move(c));
  }
  check.list(inputs, "inputs");
  for (int r = 0; r < size(); ++r) {
    const std::string name = fmt::format("inputs[{}]", r);
    check.tensor(inputs[r], name);
    check.same_kind(inputs[r], output, name, "output");
    check.count(inputs[r], output.count, name, "same as output");
  }
  if (std::optional<Tensor> whole = as_contiguous(inputs)) {
    c.inputs = {*whole};
    return Submit{*state_}(std::move(c));
  }
  auto [lease, staged] = stage_in(*state_->staging, inputs, output);
  c.inputs = {staged};
  return Submit{*state_}(std::move(c), [lease] {});
}

std::shared_ptr<Work> ProcessGroup::scatter_from_tensor(Tensor output, Tensor input, int root) {
  Checker check(*state_, "scatter_from_tensor");
  check.root(root);
  check.tensor(output, "output");
  Collective c;
  c.kind = CollectiveKind::Scatter;
  c.outputs = {output};
  c.root = root;
  if (rank() == root) {
    check.tensor(input, "input");
    check.same_kind(input, output, "input", "output");
    check.count(input, output.count * size(), "input", "size() * output.count");
    c.inputs = {input};
  }
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::all_to_all(Tensor output, Tensor input) {
  return all_to_all(output, input, {}, {});
}

std::shared_ptr<Work> ProcessGroup::all_to_all(Tensor output, Tensor input,
                                               std::vector<size_t> output_splits,
                                               std::vector<size_t> input_splits) {
  Checker check(*state_, "all_to_all");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  const size_t p = size();
  if (input_splits.empty()) {
    if (input.count % p != 0) {
      check.fail(
          fmt::format("input has {} elements, not a multiple of the group size {} (pass "
                      "input_splits for uneven blocks)",
                      input.count, p));
    }
    input_splits.assign(p, input.count / p);
  }
  if (output_splits.empty()) {
    if (output.count % p != 0) {
      check.fail(
          fmt::format("output has {} elements, not a multiple of the group size {} (pass "
                      "output_splits for uneven blocks)",
                      output.count, p));
    }
    output_splits.assign(p, output.count / p);
  }
  check.counts(input_splits, "input_splits");
  check.counts(output_splits, "output_splits");
  check.count(input, std::accumulate(input_splits.begin(), input_splits.end(), size_t{0}), "input",
              "sum of input_splits " + join_counts(input_splits));
  check.count(output, std::accumulate(output_splits.begin(), output_splits.end(), size_t{0}),
              "output", "sum of output_splits " + join_counts(output_splits));
  if (input_splits[rank()] != output_splits[rank()]) {
    check.fail(
        fmt::format("input_splits[{0}] = {1} but output_splits[{0}] = {2}: what a rank "
                    "sends itself must equal what it receives from itself",
                    rank(), input_splits[rank()], output_splits[rank()]));
  }
  if (same_memory(input, output) && input_splits != output_splits) {
    check.fail("in-place all_to_all needs equal input and output splits");
  }
  Collective c;
  c.kind = CollectiveKind::AllToAll;
  c.inputs = {input};
  c.outputs = {output};
  c.send_counts = std::move(input_splits);
  c.recv_counts = std::move(output_splits);
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  Collective c;
  c.kind = CollectiveKind::Barrier;
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::send(Tensor tensor, int dst, uint64_t tag) {
  Checker check(*state_, "send");
  check.root(dst, "dst");
  if (dst == rank()) check.fail(fmt::format("dst {} is this rank", dst));
  if (tag > kMaxTag) check.fail(fmt::format("tag {} is above the largest, {}", tag, kMaxTag));
  check.tensor(tensor, "tensor");
  Collective c;
  c.kind = CollectiveKind::Send;
  c.inputs = {tensor};
  c.peer = dst;
  c.tag = tag;
  return Submit{*state_}(std::move(c));
}

std::shared_ptr<Work> ProcessGroup::recv(Tensor tensor, int src, uint64_t tag) {
  Checker check(*state_, "recv");
  check.root(src, "src");
  if (src == rank()) check.fail(fmt::format("src {} is this rank", src));
  if (tag > kMaxTag) check.fail(fmt::format("tag {} is above the largest, {}", tag, kMaxTag));
  check.tensor(tensor, "tensor");
  Collective c;
  c.kind = CollectiveKind::Recv;
  c.outputs = {tensor};
  c.peer = src;
  c.tag = tag;
  return Submit{*state_}(std::move(c));
}

// ---- Coalescing.

void ProcessGroup::start_coalescing() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->coalescing) {
    throw Error(ErrorCode::InvalidArgument, state_->context("start_coalescing", state_->seq),
                "already coalescing: call end_coalescing() first");
  }
  state_->coalescing = true;
}

std::shared_ptr<Work> ProcessGroup::end_coalescing() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.coalescing) {
    throw Error(ErrorCode::InvalidArgument, s.context("end_coalescing", s.seq),
                "start_coalescing() was not called");
  }
  s.coalescing = false;
  std::vector<Collective> calls = std::move(s.coalesced);
  std::vector<std::shared_ptr<Work>> works = std::move(s.coalesced_works);
  std::vector<Epilogue> epilogues = std::move(s.coalesced_epilogues);
  const DeviceKind kind = s.coalesced_device.value_or(DeviceKind::Cpu);
  s.coalesced.clear();
  s.coalesced_works.clear();
  s.coalesced_epilogues.clear();
  s.coalesced_device.reset();
  ErrorContext context = s.context("coalesced", calls.empty() ? s.seq : calls.front().seq,
                                   fmt::format("{} operations", calls.size()));
  if (calls.empty()) return Work::completed(context);
  if (s.aborted) {
    auto error = std::make_exception_ptr(
        Error(ErrorCode::Aborted, context, "the group was aborted: " + s.abort_reason));
    for (auto& work : works) work->fail(error);
    return Work::failed(context, error);
  }
  Backend& backend = s.backend_for(kind, context);
  if (s.debug_detail) {
    for (const Collective& c : calls) {
      if (c.kind != CollectiveKind::Send && c.kind != CollectiveKind::Recv) {
        Submit{s}.check_fingerprints(c, s.context(collective_name(c.kind), c.seq));
      }
    }
  }
  std::shared_ptr<Work> group = backend.post_coalesced(std::move(calls), context);
  return chain(group, context, s.timeout, [works, epilogues] {
    for (size_t i = 0; i < works.size(); ++i) {
      try {
        if (epilogues[i]) epilogues[i]();
      } catch (...) {
        works[i]->fail(std::current_exception());
        continue;
      }
      works[i]->complete();
    }
  });
}

// ---- Sub-groups.

uint64_t ProcessGroup::child_groups() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->children;
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks,
                                                      NewGroupOptions options) {
  State& s = *state_;
  uint64_t child;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    child = ++s.children;
  }
  const ErrorContext context = s.context("new_group", 0);
  std::vector<bool> seen(s.size, false);
  for (int r : ranks) {
    if (r < 0 || r >= s.size) {
      throw Error(ErrorCode::InvalidArgument, context,
                  fmt::format("ranks: {} is out of range for a group of {}", r, s.size));
    }
    if (seen[r])
      throw Error(ErrorCode::InvalidArgument, context, fmt::format("ranks: {} twice", r));
    seen[r] = true;
  }
  if (ranks.empty()) throw Error(ErrorCode::InvalidArgument, context, "ranks is empty");
  auto me = std::find(ranks.begin(), ranks.end(), s.rank);
  if (me == ranks.end()) return nullptr;
  std::string path = fmt::format("{}.{}", s.store_path, child);
  std::string name = options.name.empty() ? fmt::format("{}.{}", s.name, child) : options.name;
  std::vector<int> global;
  for (int r : ranks) global.push_back(s.global_ranks[r]);
  return make_group(
      s.world, path, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), name,
      options.timeout.count() > 0 ? options.timeout : s.timeout, std::move(global),
      options.backend.empty() ? s.backend_text : options.backend,
      options.backend_settings.empty() ? s.backend_settings : options.backend_settings);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key, NewGroupOptions options) {
  State& s = *state_;
  uint64_t child;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    child = ++s.children;
  }
  // One all_gather over this group: everyone learns every (color, key).
  std::vector<int64_t> mine = {color, key};
  std::vector<int64_t> all(2 * s.size);
  all_gather_into_tensor(Tensor::of(all.data(), all.size()), Tensor::of(mine.data(), 2))->wait();
  if (color < 0) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < s.size; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  const int rank =
      static_cast<int>(std::find(members.begin(), members.end(), s.rank) - members.begin());
  std::string path = fmt::format("{}.{}c{}", s.store_path, child, color);
  std::string name =
      options.name.empty() ? fmt::format("{}.{}c{}", s.name, child, color) : options.name;
  std::vector<int> global;
  for (int r : members) global.push_back(s.global_ranks[r]);
  return make_group(
      s.world, path, rank, static_cast<int>(members.size()), name,
      options.timeout.count() > 0 ? options.timeout : s.timeout, std::move(global),
      options.backend.empty() ? s.backend_text : options.backend,
      options.backend_settings.empty() ? s.backend_settings : options.backend_settings);
}

// ---- Teardown.

void ProcessGroup::abort(const std::string& reason) {
  State& s = *state_;
  std::vector<Backend*> backends;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.aborted) return;
    s.aborted = true;
    s.abort_reason = reason;
    for (auto& [kind, backend] : s.backends) backends.push_back(backend.get());
  }
  WEFT_LOG_INFO("rank {}/{} group \"{}\": aborted: {}", s.rank, s.size, s.name, reason);
  // Backends live until destroy(), which takes the mutex after us: the pointers stay valid.
  for (Backend* backend : backends) backend->abort(reason);
}

bool ProcessGroup::is_aborted() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->aborted;
}

void ProcessGroup::destroy() {
  State& s = *state_;
  std::map<DeviceKind, std::unique_ptr<Backend>> backends;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.destroyed) return;
    s.destroyed = true;
    backends = std::move(s.backends);
    s.backends.clear();
  }
  // Each backend drains what was issued (up to the timeout), then aborts the rest and joins.
  backends.clear();
}

// ---- init_process_group.

std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  auto world = std::make_shared<World>();
  int rank = 0, size = 1;
  const std::chrono::milliseconds timeout =
      options.timeout.count() > 0 ? options.timeout : config().timeout;
  if (options.store) {
    if (!options.rank || !options.world_size) {
      throw_error(ErrorCode::InvalidArgument, "init_process_group",
                  "with an explicit store, rank and world_size must be given");
    }
    rank = *options.rank;
    size = *options.world_size;
    if (size < 1 || rank < 0 || rank >= size) {
      throw_error(ErrorCode::InvalidArgument, "init_process_group",
                  fmt::format("rank {} is out of range for world_size {}", rank, size));
    }
    world->store = options.store;
  } else {
    RendezvousOptions rdzv_options;
    rdzv_options.url = options.url;
    rdzv_options.rank = options.rank;
    rdzv_options.world_size = options.world_size;
    rdzv_options.timeout = timeout;
    Rendezvous rdzv = rendezvous(rdzv_options);
    rank = rdzv.rank;
    size = rdzv.world_size;
    world->server = std::move(rdzv.server);
    world->store = std::move(rdzv.store);
  }
  std::vector<int> global(size);
  std::iota(global.begin(), global.end(), 0);
  return make_group(world, options.name, rank, size, options.name, timeout, std::move(global),
                    options.backend, options.backend_settings);
}

}  // namespace weft
