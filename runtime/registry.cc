// The backend registry (weft/backend.h) and the parts of Backend shared by every backend.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/backend.h"

namespace weft {

std::shared_ptr<SymmetricBuffer> Backend::allocate_symmetric(size_t bytes,
                                                             const ErrorContext& context) {
  throw Error(
      ErrorCode::Unsupported, context,
      fmt::format("backend \"{}\" has no symmetric memory ({} bytes asked)", name(), bytes));
}

std::shared_ptr<void> Backend::split(int /*color*/, int /*key*/, const ErrorContext& /*context*/) {
  return nullptr;
}

std::shared_ptr<Work> Backend::post_coalesced(std::vector<Collective> collectives,
                                              ErrorContext context) {
  auto group = std::make_shared<Work>(context);
  if (collectives.empty()) {
    group->complete();
    return group;
  }
  // Completes `group` once every part has, with the first error met in posting order.
  struct Join {
    std::mutex mutex;
    size_t left = 0;
    std::vector<std::exception_ptr> errors;
  };
  auto join = std::make_shared<Join>();
  join->left = collectives.size();
  join->errors.resize(collectives.size());
  for (size_t i = 0; i < collectives.size(); ++i) {
    ErrorContext one = context;
    one.op = std::string(collective_name(collectives[i].kind));
    one.seq = collectives[i].seq;
    std::shared_ptr<Work> part = post(std::move(collectives[i]), one);
    part->on_complete([group, join, i](const Work& done) {
      std::exception_ptr first;
      {
        std::lock_guard<std::mutex> lock(join->mutex);
        join->errors[i] = done.exception();
        if (--join->left > 0) return;
        for (const std::exception_ptr& error : join->errors) {
          if (error) {
            first = error;
            break;
          }
        }
      }
      if (first) {
        group->fail(first);
      } else {
        group->complete();
      }
    });
  }
  return group;
}

Registry& Registry::global() {
  static Registry* registry = new Registry();  // never destroyed: used by static registrations
  return *registry;
}

void Registry::add(Entry entry) {
  if (entry.name.empty() || !entry.factory || entry.devices.empty()) {
    throw_error(ErrorCode::InvalidArgument, "backend registry",
                fmt::format("cannot register backend \"{}\": a backend needs a name, a factory "
                            "and at least one device kind",
                            entry.name));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& known : entries_) {
    if (known.name == entry.name) {
      throw_error(ErrorCode::InvalidArgument, "backend registry",
                  fmt::format("backend \"{}\" is already registered", entry.name));
    }
  }
  entries_.push_back(std::move(entry));
}

Registry::Entry Registry::find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> known;
  for (const Entry& entry : entries_) {
    if (entry.name == name) return entry;
    known.push_back(entry.name);
  }
  throw_error(
      ErrorCode::InvalidArgument, "backend registry",
      fmt::format("unknown backend \"{}\"; known backends: {}", name,
                  known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", "))));
}

bool Registry::contains(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry& entry) { return entry.name == name; });
}

std::vector<std::string> Registry::names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> names;
  for (const Entry& entry : entries_) names.push_back(entry.name);
  return names;
}

std::string Registry::default_for(DeviceKind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& entry : entries_) {
    if (std::find(entry.devices.begin(), entry.devices.end(), kind) != entry.devices.end()) {
      return entry.name;
    }
  }
  return {};
}

BackendRegistration::BackendRegistration(Registry::Entry entry) {
  Registry::global().add(std::move(entry));
}

std::vector<std::pair<DeviceKind, std::string>> parse_backend_map(std::string_view text,
                                                                  Registry& registry) {
  constexpr DeviceKind kKinds[] = {DeviceKind::Cpu, DeviceKind::Cuda};
  std::vector<std::pair<DeviceKind, std::string>> map;
  // A backend serves CUDA tensors natively (nccl) or, when it serves host memory, by staging
  // them through pinned host buffers (docs/cuda.md), as Gloo does for c10d.
  auto serves = [&](const Registry::Entry& entry, DeviceKind kind) {
    auto has = [&](DeviceKind k) {
      return std::find(entry.devices.begin(), entry.devices.end(), k) != entry.devices.end();
    };
    return has(kind) || (kind == DeviceKind::Cuda && has(DeviceKind::Cpu));
  };
  if (text.empty()) {
    for (DeviceKind kind : kKinds) {
      std::string name = registry.default_for(kind);
      if (name.empty() && kind == DeviceKind::Cuda) name = registry.default_for(DeviceKind::Cpu);
      if (!name.empty()) map.emplace_back(kind, name);
    }
    return map;
  }
  if (text.find(':') == std::string_view::npos) {
    Registry::Entry entry = registry.resolve(text);
    for (DeviceKind kind : kKinds) {
      if (serves(entry, kind)) map.emplace_back(kind, entry.name);
    }
    return map;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(start, end - start);
    size_t colon = item.find(':');
    auto bad = [&](std::string_view why) {
      throw_error(ErrorCode::InvalidArgument, "backend map",
                  fmt::format("\"{}\": {} (expected \"tcp\" or \"cpu:tcp,cuda:nccl\")", text, why));
    };
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == item.size()) {
      bad(fmt::format("\"{}\" is not DEVICE:BACKEND", item));
    }
    std::string_view device = item.substr(0, colon);
    std::string_view name = item.substr(colon + 1);
    DeviceKind kind;
    if (device == "cpu") {
      kind = DeviceKind::Cpu;
    } else if (device == "cuda") {
      kind = DeviceKind::Cuda;
    } else {
      bad(fmt::format("unknown device kind \"{}\" (cpu or cuda)", device));
    }
    for (const auto& [known, unused] : map) {
      if (known == kind) bad(fmt::format("device kind \"{}\" given twice", device));
    }
    Registry::Entry entry = registry.resolve(name);
    if (!serves(entry, kind)) {
      bad(fmt::format("backend \"{}\" does not serve {}", name, device));
    }
    map.emplace_back(kind, entry.name);
    start = end + 1;
  }
  return map;
}

}  // namespace weft
