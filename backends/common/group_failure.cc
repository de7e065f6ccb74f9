#include "backends/common/group_failure.h"

#include <chrono>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "runtime/log.h"

namespace weft::backends {

void GroupFailure::record(const ErrorContext& context, const std::string& what) {
  try {
    // An error with a context names the rank already ("rank 2/4 group ..."): not twice.
    std::string text = what.starts_with(fmt::format("rank {}/", rank_))
                           ? what
                           : fmt::format("rank {}: {}", rank_, what);
    store_->compare_set(kKey, std::vector<uint8_t>{},
                        std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    WEFT_LOG_DEBUG("{}: could not record the failure in the store: {}", context.describe(),
                   e.what());
  }
}

GroupFailure::Lookup GroupFailure::look_up() {
  Lookup found;
  try {
    if (!store_->check({kKey})) return found;
    std::vector<uint8_t> value = store_->get(kKey, std::chrono::milliseconds(1000));
    found.first.assign(value.begin(), value.end());
  } catch (const Error& e) {
    // A closed, reset or silent connection: the store is unreachable. Anything else (a reply
    // that makes no sense) is not worth a word in a PeerLost message.
    if (e.code() == ErrorCode::PeerLost || e.code() == ErrorCode::Io ||
        e.code() == ErrorCode::Timeout) {
      found.store_error = e.what();
    }
  } catch (const std::exception&) {
  }
  return found;
}

std::vector<int> GroupFailure::silent_members(uint64_t seq, int size,
                                              std::chrono::milliseconds grace) {
  std::vector<int> silent;
  try {
    auto key = [&](int r) { return fmt::format("group/timed_out/{}/{}", seq, r); };
    store_->set(key(rank_), std::vector<uint8_t>{1});
    std::vector<std::string> others;
    for (int r = 0; r < size; ++r) {
      if (r != rank_) others.push_back(key(r));
    }
    if (others.empty()) return silent;
    try {
      store_->wait(others, grace);
      return silent;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Timeout) return silent;
    }
    for (int r = 0; r < size; ++r) {
      if (r != rank_ && !store_->check({key(r)})) silent.push_back(r);
    }
  } catch (const std::exception&) {
    silent.clear();
  }
  return silent;
}

}  // namespace weft::backends
