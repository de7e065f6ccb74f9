#include "backends/tcp/shm_symmetric_memory.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backends/tcp/shm_segment.h"
#include "runtime/error_record.h"
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

// How long a rank that found its leader's new segment already removed waits to learn why.
constexpr std::chrono::seconds kVerdictWait{2};

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

std::string text_of(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

ShmSymmetricMemory::ShmSymmetricMemory(Store& store, int rank, int size, ShmTransport* shm,
                                       Options options)
    : store_(store), rank_(rank), size_(size), shm_(shm), options_(std::move(options)) {
  auto node_of = [&](int r) {
    return options_.nodes.empty() ? 0 : options_.nodes.at(static_cast<size_t>(r));
  };
  std::vector<int> seen;
  for (int r = 0; r < size_; ++r) {
    if (node_of(r) == node_of(rank_)) local_.push_back(r);
    if (std::find(seen.begin(), seen.end(), node_of(r)) == seen.end()) {
      seen.push_back(node_of(r));
      leaders_.push_back(r);
    }
  }
}

Error ShmSymmetricMemory::error(ErrorCode code, const std::string& detail) const {
  ErrorContext where{rank_, size_, options_.group_name, "allocate_symmetric", 0, {}};
  return Error(code, where, detail);
}

std::shared_ptr<SymmetricRegion> ShmSymmetricMemory::allocate(size_t bytes,
                                                              Clock::time_point deadline) {
  return make_region(bytes, deadline, allocations_++, /*bounce=*/false);
}

std::shared_ptr<SymmetricRegion> ShmSymmetricMemory::allocate_bounce(size_t bytes,
                                                                     Clock::time_point deadline) {
  if (leaders_.size() > 1) return nullptr;
  return make_region(bytes, deadline, SymmetricMemory::kBounceId, /*bounce=*/true);
}

std::vector<Bytes> ShmSymmetricMemory::get_all(const std::vector<std::string>& keys,
                                               Clock::time_point deadline, bool beside) {
  // Beside the transport, the store is polled at each doorbell ring (a peer rings after each
  // key it sets) and each liveness slice: a peer found dead is PeerLost, an abort Aborted,
  // within a slice, not a store wait to the deadline. Past the deadline, multi_get's Timeout
  // names the missing keys.
  if (beside && shm_ != nullptr)
    (void)shm_->wait_beside([&] { return store_.check(keys); }, deadline);
  return store_.multi_get(keys, left_until(deadline));
}

std::shared_ptr<SymmetricRegion> ShmSymmetricMemory::make_region(size_t bytes,
                                                                 Clock::time_point deadline,
                                                                 uint64_t id, bool bounce) {
  // What the keys, names and messages call it: "bounce" for the bounce region, else its id.
  const std::string tag = bounce ? std::string("bounce") : fmt::format("{}", id);
  const std::string what =
      bounce ? std::string("the group's bounce buffer") : fmt::format("symmetric buffer #{}", id);
  const int local_size = static_cast<int>(local_.size());
  const int local_rank =
      static_cast<int>(std::find(local_.begin(), local_.end(), rank_) - local_.begin());
  const int leader = local_[0];
  const bool across = leaders_.size() > 1;
  const SymmetricLayout layout = SymmetricLayout::of(local_size, bytes);
  // One name per host: its leader's.
  const std::string key = fmt::format("{}/{}/{}", options_.key_prefix, tag, leader);
  auto opened_key = [&](int r) { return fmt::format("{}/opened/{}", key, r); };
  // Why the leader removed a segment it had published (it gave up waiting for the others).
  const std::string gave_up_key = key + "/gave-up";
  auto ready_key = [&](int r) {
    return fmt::format("{}/{}/ready/{}", options_.key_prefix, tag, r);
  };
  auto fail_record = [&](const std::string& record_key, const std::string& what) {
    const std::string failed = fmt::format("{}{}", kFailed, what);
    try {
      store_.set(record_key, Bytes(failed.begin(), failed.end()));
      if (bounce) wake_peers();
    } catch (const Error&) {
      // The store is gone too: the peers learn of it from their own timeouts.
    }
  };
  std::shared_ptr<ShmSegment> segment;
  if (rank_ == leader) {
    const std::string job = launcher_job_id(std::getenv).value;
    const std::string name =
        fmt::format("{}{:016x}{}-{}-r{}", shm_job_prefix(job), options_.group_id,
                    bounce ? "b" : "s" + tag, ::getpid(), rank_);
    try {
      segment = std::make_shared<ShmSegment>(ShmSegment::create(name, layout.total));
    } catch (const Error& e) {
      if (local_size > 1) fail_record(key, e.what());
      if (across) fail_record(ready_key(rank_), e.what());
      throw error(e.code(), fmt::format("{} of {} bytes per rank: {}", what, bytes, e.what()));
    }
    auto* header = reinterpret_cast<SymmetricHeader*>(segment->data());
    header->ranks = static_cast<uint64_t>(local_size);
    header->block_bytes = bytes;
    header->stride = layout.stride;
    header->magic = collectives::kSymmetricMagic;
    if (local_size > 1) {
      store_.set(key, Bytes(name.begin(), name.end()));
      if (bounce) wake_peers();
      std::vector<std::string> keys;
      for (int l = 1; l < local_size; ++l) keys.push_back(opened_key(local_[l]));
      std::vector<Bytes> acks;
      try {
        acks = get_all(keys, deadline, bounce);
      } catch (const Error& e) {
        // The segment goes with this frame: a peer that has its name but has not mapped it yet
        // finds it gone, and reads why here ("<code> <message>") rather than reporting the
        // vanished name.
        fail_record(gave_up_key, fmt::format("{} {}", static_cast<int>(e.code()), e.what()));
        throw;
      }
      for (int l = 1; l < local_size; ++l) {
        const std::string ack = text_of(acks[l - 1]);
        if (ack.starts_with(kFailed)) {
          const std::string failed = fmt::format("rank {} could not map {}: {}", local_[l], what,
                                                 ack.substr(kFailed.size()));
          if (across) fail_record(ready_key(rank_), failed);
          throw error(ErrorCode::Io, failed);
        }
      }
    }
    // Every local rank has it mapped: from here on nothing can be left in /dev/shm.
    segment->unlink();
    if (across) store_.set(ready_key(rank_), Bytes{'1'});
  } else {
    const std::string record = text_of(get_all({key}, deadline, bounce)[0]);
    if (record.starts_with(kFailed)) {
      throw error(ErrorCode::Io, fmt::format("rank {} could not create {}: {}", leader, what,
                                             record.substr(kFailed.size())));
    }
    try {
      std::optional<ShmSegment> opened = ShmSegment::open_if_present(record, layout.total);
      if (!opened) {
        // The name was published, so the leader created it; gone now, it gave up waiting for
        // the acknowledgements (a local rank died, or the deadline passed) and removed it.
        // That cause, not the missing name, is the error: wait a little for the leader's record
        // of why, and fail with its code. Within a collective the wait is beside the transport,
        // which finds a dead or aborted peer within a slice.
        std::string why;
        try {
          why = text_of(
              get_all({gave_up_key}, std::min(deadline, Clock::now() + kVerdictWait), bounce)[0]);
        } catch (const Error& e) {
          if (e.code() != ErrorCode::Timeout) throw;  // a dead or aborted peer says more
        }
        if (why.starts_with(kFailed)) {
          why.erase(0, kFailed.size());
          const size_t space = why.find(' ');
          throw error(code_from(why),
                      fmt::format("rank {} gave up on {} before this rank mapped it: {}", leader,
                                  what, space == std::string::npos ? why : why.substr(space + 1)));
        }
        opened = ShmSegment::open(record, layout.total);  // throws, naming the missing object
      }
      segment = std::make_shared<ShmSegment>(std::move(*opened));
      const auto* header = reinterpret_cast<const SymmetricHeader*>(segment->data());
      if (header->magic != collectives::kSymmetricMagic ||
          header->ranks != static_cast<uint64_t>(local_size) || header->block_bytes != bytes) {
        throw error(
            ErrorCode::InvalidArgument,
            fmt::format("{} \"{}\" holds {} blocks of {} bytes; this rank asked for {} of "
                        "{} (ranks disagree about the allocation)",
                        what, record, header->ranks, header->block_bytes, local_size, bytes));
      }
    } catch (const Error& e) {
      fail_record(opened_key(rank_), e.what());
      throw;
    }
    store_.set(opened_key(rank_), Bytes{'1'});
    if (bounce) wake_peers();
  }
  if (across) {
    // Every host's outcome: a host that failed fails the allocation everywhere.
    std::vector<std::string> keys;
    for (int r : leaders_) keys.push_back(ready_key(r));
    std::vector<Bytes> ready = get_all(keys, deadline, bounce);
    for (size_t i = 0; i < leaders_.size(); ++i) {
      const std::string record = text_of(ready[i]);
      if (record.starts_with(kFailed)) {
        throw error(ErrorCode::Io, fmt::format("{}: the host of rank {} could not map it: {}", what,
                                               leaders_[i], record.substr(kFailed.size())));
      }
    }
  }
  std::byte* base = segment->data();
  auto region = std::make_shared<SymmetricRegion>(std::move(segment), base, local_rank, local_size,
                                                  bytes, id, options_.group_name, local_, size_);
  if (!bounce) remember(region);
  return region;
}

bool ShmSymmetricMemory::reads_peers() const { return shm_ != nullptr && shm_->reads_every_peer(); }

void ShmSymmetricMemory::read_peer(int peer, void* to, const void* address, size_t bytes) {
  if (shm_ == nullptr) return SymmetricMemory::read_peer(peer, to, address, bytes);  // throws
  shm_->read_peer(peer, to, reinterpret_cast<uintptr_t>(address), bytes);
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
