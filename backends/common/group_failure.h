// backends/common/group_failure.h: how a group learns which rank failed first.
//
// When a collective fails with PeerLost, Timeout or Protocol, the group is broken: the rank that
// saw it records what it saw in the group's store (key kKey, first writer wins), then hangs up
// on its peers, so that every peer blocked on it learns at once instead of at its own timeout.
// A peer that learns of the failure second-hand (a rank hung up on it because *that* rank
// broke) reads the record and names the rank really lost, rather than blaming the rank that
// only passed the news on.
//
// Best effort both ways: the store may be gone with the rank that hosted it, and then the
// second-hand message says only what this rank saw.
//
// Thread safety: none; used by the backend's progress thread (or the caller running its task).
#pragma once

#include <memory>
#include <string>

#include "weft/error.h"
#include "weft/store.h"

namespace weft::backends {

class GroupFailure {
 public:
  // The key in the group's store: one per group, whatever the backend (a group has one backend
  // per device kind, and a failure of any breaks the group).
  static constexpr const char* kKey = "group/first_failure";

  GroupFailure(std::shared_ptr<Store> store, int rank) : store_(std::move(store)), rank_(rank) {}

  // Records "rank R: <what>" unless a record exists. Never throws.
  void record(const ErrorContext& context, const std::string& what);
  // The first record in the group, or "" when none (or the store cannot say). Never throws.
  std::string first();

 private:
  std::shared_ptr<Store> store_;
  int rank_;
};

}  // namespace weft::backends
