#include "collectives/symmetric_memory.h"

#include <algorithm>

#include <fmt/format.h>

#include "weft/error.h"

namespace weft::collectives {

namespace {

constexpr size_t kPage = 4096;
size_t page_align(size_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

SymmetricLayout SymmetricLayout::of(int ranks, size_t bytes) {
  SymmetricLayout layout;
  layout.header = page_align(sizeof(SymmetricHeader) + sizeof(SymmetricSlot) * ranks);
  // A block of 0 bytes still gets a page, so that every block has an address of its own.
  layout.stride = page_align(std::max<size_t>(bytes, 1));
  layout.total = layout.header + layout.stride * ranks;
  return layout;
}

SymmetricRegion::SymmetricRegion(std::shared_ptr<void> mapping, std::byte* base, int rank, int size,
                                 size_t bytes, uint64_t id, std::string group,
                                 std::vector<int> members, int group_size)
    : group_(std::move(group)),
      id_(id),
      rank_(rank),
      ranks_(size),
      members_(std::move(members)),
      group_size_(group_size > 0 ? group_size : size),
      bytes_(bytes),
      layout_(SymmetricLayout::of(size, bytes)),
      base_(base),
      mapping_(std::move(mapping)) {}

void* SymmetricRegion::data() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mapping_ ? block(rank_) : nullptr;
}

SymmetricSlot& SymmetricRegion::slot(int r) const {
  return reinterpret_cast<SymmetricSlot*>(base_ + sizeof(SymmetricHeader))[r];
}

void SymmetricRegion::release() {
  std::shared_ptr<void> mapping;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!users_.empty()) {
      throw_error(ErrorCode::InvalidArgument,
                  fmt::format("rank {}/{} group \"{}\" symmetric buffer #{} release", member(rank_),
                              group_size_, group_, id_),
                  fmt::format("still in use by {} (wait for their Work before releasing it)",
                              users_text()));
    }
    mapping = std::move(mapping_);
  }
  // Unmapped here, outside the lock (munmap of a large mapping takes a while).
}

std::shared_ptr<SymmetricRegion::Use> SymmetricRegion::use(
    const std::shared_ptr<SymmetricRegion>& self, std::string what) {
  std::lock_guard<std::mutex> lock(self->mutex_);
  if (!self->mapping_) return nullptr;
  self->users_.push_back(std::move(what));
  return std::make_shared<Use>(self, std::prev(self->users_.end()));
}

SymmetricRegion::Use::~Use() {
  std::lock_guard<std::mutex> lock(region_->mutex_);
  region_->users_.erase(entry_);
}

std::string SymmetricRegion::users_text() const {
  constexpr size_t kNamed = 8;  // a queue of thousands would make the message unreadable
  // A collective holds one Use per tensor, taken one after the other: name it once.
  std::string text;
  size_t named = 0, more = 0;
  const std::string* last = nullptr;
  for (const std::string& user : users_) {
    if (last != nullptr && user == *last) continue;
    last = &user;
    if (named == kNamed) {
      ++more;
      continue;
    }
    text += named++ == 0 ? "" : ", ";
    text += user;
  }
  if (more > 0) text += fmt::format(" and {} more", more);
  return text;
}

SymmetricMemory::Found SymmetricMemory::find(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Found found;
  std::erase_if(regions_, [](const std::weak_ptr<SymmetricRegion>& r) { return r.expired(); });
  for (const auto& weak : regions_) {
    std::shared_ptr<SymmetricRegion> region = weak.lock();
    if (!region) continue;
    if (std::optional<size_t> offset = region->offset_of(p, bytes)) {
      found.region = std::move(region);
      found.offset = *offset;
      break;
    }
  }
  return found;
}

void SymmetricMemory::read_peer(int peer, void* /*to*/, const void* /*address*/, size_t bytes) {
  throw_error(ErrorCode::Internal, "symmetric memory",
              fmt::format("cannot read rank {}'s memory ({} bytes): this memory offers no "
                          "cross-memory reads",
                          peer, bytes));
}

void SymmetricMemory::remember(const std::shared_ptr<SymmetricRegion>& region) {
  std::lock_guard<std::mutex> lock(mutex_);
  regions_.push_back(region);
  ever_allocated_.store(true, std::memory_order_release);
}

}  // namespace weft::collectives
