// backends/common/group_failure.h: how a group learns which rank failed first.
//
// When a collective fails with PeerLost, Timeout or Protocol, the group is broken: the rank that
// saw it records what it saw in the group's store (key kKey, first writer wins), then hangs up
// on its peers, so that every peer blocked on it learns at once instead of at its own timeout.
// A peer that learns of the failure second-hand (a rank hung up on it because *that* rank
// broke) reads the record and names the rank really lost, rather than blaming the rank that
// only passed the news on.
//
// Best effort both ways: the store may be gone with the rank that hosted it. Then the look-up
// says so, with the store's own error (which names its address), so that a rank whose peers and
// store died together (their host went down) says the store is unreachable, not only that a peer
// hung up: the job cannot go on, and the store's host is the first place to look.
//
// Thread safety: none; used by the backend's progress thread (or the caller running its task).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/error.h"
#include "weft/store.h"

namespace weft::backends {

class GroupFailure {
 public:
  // The key in the group's store: one per group, whatever the backend (a group has one backend
  // per device kind, and a failure of any breaks the group).
  static constexpr const char* kKey = "group/first_failure";

  GroupFailure(std::shared_ptr<Store> store, int rank) : store_(std::move(store)), rank_(rank) {}

  // What the group's store knows of the failure.
  struct Lookup {
    std::string first;        // the first record in the group, "" when none (or no answer)
    std::string store_error;  // "" when the store answered, else its error ("store HOST:PORT
                              // check: PeerLost: connection closed by peer")
  };

  // Records "rank R: <what>" unless a record exists. Never throws.
  void record(const ErrorContext& context, const std::string& what);
  // Asks the store for the first record: one CHECK round trip, and a GET when there is one.
  // Only on the failure path. Never throws.
  Lookup look_up();

  // After collective #seq of a group of `size` timed out here: says so in the store (key
  // "group/timed_out/<seq>/<rank>"), waits up to `grace` for every other member to say the same,
  // and returns those that did not. When one rank is stopped, hung or busy outside weft, the
  // others all time out together (each on the peer it waits for, which is often not that rank:
  // in a ring, everyone waits on a neighbour), and the one that stays silent is the likely
  // cause. Empty when every member spoke, or the store cannot say. Only on the failure path:
  // a SET, a WAIT of at most `grace`, and a CHECK per member when some are silent. Never throws.
  std::vector<int> silent_members(uint64_t seq, int size, std::chrono::milliseconds grace);

 private:
  std::shared_ptr<Store> store_;
  int rank_;
};

}  // namespace weft::backends
