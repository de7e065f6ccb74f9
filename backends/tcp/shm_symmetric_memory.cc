#include "backends/tcp/shm_symmetric_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backends/tcp/shm_segment.h"
#include "runtime/launch_env.h"
#include "runtime/shm_names.h"

namespace weft::tcp {

using collectives::Clock;
using collectives::SymmetricHeader;
using collectives::SymmetricLayout;
using collectives::SymmetricRegion;

namespace {

// Starts the record of a rank that could not create or open the buffer (no name starts so).
constexpr std::string_view kFailed = "! ";

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

std::string text_of(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

ShmSymmetricMemory::ShmSymmetricMemory(Store& store, int rank, int size, ShmTransport* shm,
                                       Options options)
    : store_(store), rank_(rank), size_(size), shm_(shm), options_(std::move(options)) {}

Error ShmSymmetricMemory::error(ErrorCode code, const std::string& detail) const {
  ErrorContext where{rank_, size_, options_.group_name, "allocate_symmetric", 0, {}};
  return Error(code, where, detail);
}

std::shared_ptr<SymmetricRegion> ShmSymmetricMemory::allocate(size_t bytes,
                                                              Clock::time_point deadline) {
  const uint64_t id = allocations_++;
  const SymmetricLayout layout = SymmetricLayout::of(size_, bytes);
  const std::string key = fmt::format("{}/{}", options_.key_prefix, id);
  auto opened_key = [&](int r) { return fmt::format("{}/opened/{}", key, r); };
  auto fail_record = [&](const std::string& record_key, const Error& e) {
    const std::string failed = fmt::format("{}{}", kFailed, e.what());
    try {
      store_.set(record_key, Bytes(failed.begin(), failed.end()));
    } catch (const Error&) {
      // The store is gone too: the peers learn of it from their own timeouts.
    }
  };
  std::shared_ptr<ShmSegment> segment;
  if (rank_ == 0) {
    const std::string job = launcher_job_id(std::getenv).value;
    const std::string name = fmt::format("{}{:016x}s{}-{}-r{}", shm_job_prefix(job),
                                         options_.group_id, id, ::getpid(), rank_);
    try {
      segment = std::make_shared<ShmSegment>(ShmSegment::create(name, layout.total));
    } catch (const Error& e) {
      if (size_ > 1) fail_record(key, e);
      throw error(e.code(), fmt::format("symmetric buffer #{} of {} bytes per rank: {}", id, bytes,
                                        e.what()));
    }
    auto* header = reinterpret_cast<SymmetricHeader*>(segment->data());
    header->ranks = static_cast<uint64_t>(size_);
    header->block_bytes = bytes;
    header->stride = layout.stride;
    header->magic = collectives::kSymmetricMagic;
    if (size_ > 1) {
      store_.set(key, Bytes(name.begin(), name.end()));
      std::vector<std::string> keys;
      for (int r = 1; r < size_; ++r) keys.push_back(opened_key(r));
      std::vector<Bytes> acks = store_.multi_get(keys, left_until(deadline));
      for (int r = 1; r < size_; ++r) {
        const std::string ack = text_of(acks[r - 1]);
        if (ack.starts_with(kFailed)) {
          throw error(ErrorCode::Io, fmt::format("rank {} could not map symmetric buffer #{}: {}",
                                                 r, id, ack.substr(kFailed.size())));
        }
      }
      // Every local rank has it mapped: from here on nothing can be left in /dev/shm.
      segment->unlink();
    } else {
      segment->unlink();
    }
  } else {
    const std::string record = text_of(store_.multi_get({key}, left_until(deadline))[0]);
    if (record.starts_with(kFailed)) {
      throw error(ErrorCode::Io, fmt::format("rank 0 could not create symmetric buffer #{}: {}", id,
                                             record.substr(kFailed.size())));
    }
    try {
      segment = std::make_shared<ShmSegment>(ShmSegment::open(record, layout.total));
      const auto* header = reinterpret_cast<const SymmetricHeader*>(segment->data());
      if (header->magic != collectives::kSymmetricMagic ||
          header->ranks != static_cast<uint64_t>(size_) || header->block_bytes != bytes) {
        throw error(ErrorCode::InvalidArgument,
                    fmt::format("symmetric buffer #{} \"{}\" holds {} blocks of {} bytes; this "
                                "rank asked for {} of {} (ranks disagree about the allocation)",
                                id, record, header->ranks, header->block_bytes, size_, bytes));
      }
    } catch (const Error& e) {
      fail_record(opened_key(rank_), e);
      throw;
    }
    store_.set(opened_key(rank_), Bytes{'1'});
  }
  std::byte* base = segment->data();
  auto region = std::make_shared<SymmetricRegion>(std::move(segment), base, rank_, size_, bytes, id,
                                                  options_.group_name);
  remember(region);
  return region;
}

void ShmSymmetricMemory::wake_peers() {
  if (shm_) shm_->ring_peers();
}

bool ShmSymmetricMemory::wait_until(const std::function<bool()>& ready,
                                    Clock::time_point deadline) {
  if (!shm_) return ready();
  return shm_->wait_beside(ready, deadline);
}

}  // namespace weft::tcp
