// Making process groups: init_process_group (the world, from a rendezvous or a given store),
// new_group and split (sub-groups sharing the world's store under their own key prefix).
#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/prefix_store.h"
#include "weft/process_group.h"
#include "weft/rendezvous.h"

#include "runtime/log.h"
#include "runtime/process_group_state.h"

namespace weft {
namespace {

// `ancestors`: the abort signals of the groups this one is made from; aborting any of them ends
// this group's store waits (so a new_group that waits for a member that never comes returns at
// the parent's abort). `from_parent`: what the parent's backends gave for this group, by device
// kind (Backend::split()).
std::shared_ptr<ProcessGroup> make_group(
    std::shared_ptr<World> world, std::string store_path, int rank, int size, std::string name,
    std::chrono::milliseconds timeout, std::vector<int> global_ranks, std::string backend_text,
    std::map<std::string, std::string> settings,
    std::vector<std::shared_ptr<const AbortSignal>> ancestors,
    std::map<DeviceKind, std::shared_ptr<void>> from_parent = {}) {
  auto state = std::make_unique<ProcessGroup::State>();
  state->from_parent = std::move(from_parent);
  state->world = world;
  state->store_path = store_path;
  state->abort_signal =
      std::make_shared<AbortSignal>(fmt::format("rank {}/{} group \"{}\"", rank, size, name));
  state->abort_chain = std::move(ancestors);
  state->abort_chain.push_back(state->abort_signal);
  state->store = std::make_shared<AbortableStore>(
      std::make_shared<PrefixStore>("weft/pg/" + store_path + "/", world->store),
      state->abort_chain);
  state->rank = rank;
  state->size = size;
  state->name = std::move(name);
  state->timeout = timeout;
  state->global_ranks = std::move(global_ranks);
  // A group whose options name no backend takes WEFT_BACKEND's (sub-groups inherit the text).
  state->backend_text = backend_text.empty() ? config().backend : backend_text;
  state->backend_settings = std::move(settings);
  state->backend_map = parse_backend_map(state->backend_text, Registry::global());
  state->debug_detail = config().debug == "detail";
  if (world->trace) {
    FlightRecorder::GroupInfo info;
    info.name = state->name;
    info.id = store_path;
    info.rank = rank;
    info.size = size;
    info.global_ranks = state->global_ranks;
    info.timeout = timeout;
    state->recorder = world->trace->make_recorder(std::move(info));
  }
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
    s.check_usable("new_group");
    if (s.aborted) {
      throw Error(ErrorCode::Aborted, s.context("new_group", 0),
                  "the group was aborted: " + s.abort_reason);
    }
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
  // Every rank of this group, member or not, lets its backends prepare the sub-group (the nccl
  // backend splits its communicators, which is collective over this group).
  std::map<DeviceKind, std::shared_ptr<void>> from_parent = s.split_backends(
      me == ranks.end() ? Backend::kNoColor : 0, static_cast<int>(me - ranks.begin()), context);
  if (me == ranks.end()) return nullptr;
  std::string path = fmt::format("{}.{}", s.store_path, child);
  std::string name = options.name.empty() ? fmt::format("{}.{}", s.name, child) : options.name;
  std::vector<int> global;
  for (int r : ranks) global.push_back(s.global_ranks[r]);
  return make_group(
      s.world, path, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), name,
      options.timeout.count() > 0 ? options.timeout : s.timeout, std::move(global),
      options.backend.empty() ? s.backend_text : options.backend,
      options.backend_settings.empty() ? s.backend_settings : options.backend_settings,
      s.abort_chain, std::move(from_parent));
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key, NewGroupOptions options) {
  State& s = *state_;
  uint64_t child;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.check_usable("split");
    child = ++s.children;
  }
  // One all_gather over this group: everyone learns every (color, key). Its error leaves as
  // split's, with the all_gather's (and its sequence number) after: the caller called split.
  std::vector<int64_t> mine = {color, key};
  std::vector<int64_t> all(2 * s.size);
  try {
    all_gather_into_tensor(Tensor::of(all.data(), all.size()), Tensor::of(mine.data(), 2))->wait();
  } catch (const Error& e) {
    throw Error(e.code(), s.context("split", 0),
                fmt::format("exchanging colours over this group failed: {}", e.what()));
  }
  std::map<DeviceKind, std::shared_ptr<void>> from_parent =
      s.split_backends(color < 0 ? Backend::kNoColor : color, key, s.context("split", 0));
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
      options.backend_settings.empty() ? s.backend_settings : options.backend_settings,
      s.abort_chain, std::move(from_parent));
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
  world->trace = trace::TraceWorld::create(world->store, rank, size);
  std::vector<int> global(size);
  std::iota(global.begin(), global.end(), 0);
  auto group = make_group(world, options.name, rank, size, options.name, timeout, std::move(global),
                          options.backend, options.backend_settings, {});
  offer_default_group(group);
  return group;
}

}  // namespace weft
