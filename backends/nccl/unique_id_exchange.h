// backends/nccl/unique_id_exchange.h: how the ranks of a group agree on an NCCL unique id.
//
// Rank 0 makes the id (ncclGetUniqueId in the backend; anything in tests) and sets it in the
// group's store under "nccl/uid/<index>", where `index` is the communicator's order among those
// the group creates from scratch (0 for its first device, 1 for the next, ...): every rank creates
// them in the same order, because every rank posts the same collectives. The others get it,
// waiting at most the group's timeout. One SET and one GET per rank; the key is private to the
// group (the store is the group's PrefixStore).
//
// No device is involved, so tests run it with a HashStore and a fake id source.
//
// Thread safety: none beyond the store's; called by the thread that posts.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weft/error.h"
#include "weft/store.h"

namespace weft::nccl {

// "nccl/uid/<index>".
std::string unique_id_key(int index);

// Rank 0: `make_id()` and publishes it; others: waits for it. Returns the id's bytes, checked to
// be `id_bytes` long. Throws Error naming `context`, what it waited for and the key: Timeout when
// rank 0's id did not come within `timeout`, PeerLost when the store is gone, Protocol when the
// value has the wrong size (another program wrote the key).
std::vector<uint8_t> exchange_unique_id(Store& store, int rank, int index,
                                        std::chrono::milliseconds timeout, size_t id_bytes,
                                        const std::function<std::vector<uint8_t>()>& make_id,
                                        const ErrorContext& context);

}  // namespace weft::nccl
