#include "collectives/scratch_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/log.h"

// Under AddressSanitizer, bytes of a slab that no lease covers are poisoned, so that an algorithm
// reading or writing past its scratch fails in the sanitizer builds' tests as it would with the
// heap memory the pool replaced (ASan does not watch mmap'd memory by itself).
#if defined(__SANITIZE_ADDRESS__)
#define WEFT_POOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WEFT_POOL_ASAN 1
#endif
#endif
#ifdef WEFT_POOL_ASAN
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

namespace weft::collectives {
namespace {

// Linux's value; older libc headers lack the name although the kernel (5.14+) has it.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// x86-64 and arm64 (4 KiB base pages) transparent huge page size. A slab of at least this much
// is rounded to a multiple of it, so that huge pages cover it whole.
constexpr size_t kHugePage = size_t{2} << 20;

size_t round_up(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

size_t page_size() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

size_t slab_size(size_t bytes) {
  return bytes >= kHugePage ? round_up(bytes, kHugePage) : round_up(bytes, page_size());
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Maps `bytes` (a multiple of the page size) and faults every page in, or throws Error(Io).
std::byte* map_populated(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int error = errno;
    throw_error(ErrorCode::Io, "scratch pool",
                fmt::format("mmap of {} bytes: {}", bytes, std::strerror(error)));
  }
  auto* base = static_cast<std::byte*>(p);
  // Advice only: EINVAL where THP is compiled out, and a misaligned start merely loses huge
  // pages at the two ends (kernels since 6.7 align anonymous mappings of 2 MiB and more).
  if (bytes >= kHugePage) ::madvise(base, bytes, MADV_HUGEPAGE);
  // One call instead of a fault per page; EINVAL before Linux 5.14, then touch each page.
  if (::madvise(base, bytes, MADV_POPULATE_WRITE) != 0) {
    for (size_t offset = 0; offset < bytes; offset += page_size()) {
      *static_cast<volatile std::byte*>(base + offset) = std::byte{0};
    }
  }
  return base;
}

}  // namespace

ScratchPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      slab_(other.slab_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

ScratchPool::Lease& ScratchPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    slab_ = other.slab_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void ScratchPool::Lease::release() {
  if (pool_ != nullptr) {
    pool_->slabs_[slab_].leased = false;
    ASAN_POISON_MEMORY_REGION(data_, size_);
  }
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

ScratchPool::~ScratchPool() {
  for (const Slab& slab : slabs_) {
    ASAN_UNPOISON_MEMORY_REGION(slab.base, slab.bytes);  // a later mapping may reuse the range
    ::munmap(slab.base, slab.bytes);
  }
}

ScratchPool::Lease ScratchPool::get(size_t bytes) {
  if (bytes == 0) return Lease();
  size_t best = slabs_.size();
  for (size_t i = 0; i < slabs_.size(); ++i) {
    const Slab& slab = slabs_[i];
    if (!slab.leased && slab.bytes >= bytes &&
        (best == slabs_.size() || slab.bytes < slabs_[best].bytes)) {
      best = i;
    }
  }
  if (best == slabs_.size()) best = grow(bytes);
  slabs_[best].leased = true;
  ASAN_UNPOISON_MEMORY_REGION(slabs_[best].base, bytes);
  return Lease(this, best, slabs_[best].base, bytes);
}

void ScratchPool::reserve(size_t bytes) {
  for (const Slab& slab : slabs_) {
    if (slab.bytes >= bytes) return;
  }
  grow(bytes);
}

size_t ScratchPool::capacity() const {
  size_t total = 0;
  for (const Slab& slab : slabs_) total += slab.bytes;
  return total;
}

size_t ScratchPool::leases() const {
  size_t count = 0;
  for (const Slab& slab : slabs_) count += slab.leased ? 1 : 0;
  return count;
}

size_t ScratchPool::grow(size_t bytes) {
  // Past this, rounding and doubling would wrap; no machine maps it anyway.
  if (bytes > std::numeric_limits<size_t>::max() / 4) {
    throw_error(ErrorCode::Io, "scratch pool", fmt::format("cannot map {} bytes", bytes));
  }
  std::optional<size_t> replaced;  // the largest free slab, if any: too small, as get() found
  for (size_t i = 0; i < slabs_.size(); ++i) {
    if (!slabs_[i].leased && (!replaced || slabs_[i].bytes > slabs_[*replaced].bytes)) {
      replaced = i;
    }
  }
  // Replacing a slab at least doubles it, so that sizes creeping up call after call regrow it
  // only logarithmically often.
  size_t size = slab_size(bytes);
  if (replaced) size = std::max(size, slab_size(2 * slabs_[*replaced].bytes));

  slabs_.reserve(slabs_.size() + 1);  // so that push_back cannot throw with a mapping in hand
  const auto start = std::chrono::steady_clock::now();
  std::byte* base = map_populated(size);  // first, so that a failure leaves the pool as it was
  ASAN_POISON_MEMORY_REGION(base, size);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ++growths_;
  size_t index;
  if (replaced) {
    index = *replaced;
    const size_t old_bytes = slabs_[index].bytes;
    ASAN_UNPOISON_MEMORY_REGION(slabs_[index].base, old_bytes);
    ::munmap(slabs_[index].base, old_bytes);
    slabs_[index] = Slab{.base = base, .bytes = size};
    WEFT_LOG_DEBUG(
        "scratch pool: slab {} grew from {:.2f} to {:.2f} MiB for {} bytes in {:.1f} ms; "
        "{:.2f} MiB in {} slabs",
        index, mib(old_bytes), mib(size), bytes, ms, mib(capacity()), slabs_.size());
  } else {
    index = slabs_.size();
    slabs_.push_back(Slab{.base = base, .bytes = size});
    WEFT_LOG_DEBUG(
        "scratch pool: new slab {} of {:.2f} MiB for {} bytes in {:.1f} ms; {:.2f} MiB in {} "
        "slabs",
        index, mib(size), bytes, ms, mib(capacity()), slabs_.size());
  }
  return index;
}

}  // namespace weft::collectives
