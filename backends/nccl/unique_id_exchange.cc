#include "backends/nccl/unique_id_exchange.h"

#include <fmt/format.h>

namespace weft::nccl {

std::string unique_id_key(int index) { return fmt::format("nccl/uid/{}", index); }

std::vector<uint8_t> exchange_unique_id(Store& store, int rank, int index,
                                        std::chrono::milliseconds timeout, size_t id_bytes,
                                        const std::function<std::vector<uint8_t>()>& make_id,
                                        const ErrorContext& context) {
  const std::string key = unique_id_key(index);
  std::vector<uint8_t> id;
  try {
    if (rank == 0) {
      id = make_id();
      store.set(key, id);
    } else {
      id = store.get(key, timeout);
    }
  } catch (const Error& e) {
    const std::string what =
        rank == 0 ? fmt::format("publishing the NCCL unique id (store key \"{}\")", key)
                  : fmt::format(
                        "waiting {} ms for rank 0's NCCL unique id (store key \"{}\"); "
                        "rank 0 publishes it at its first collective on this device",
                        timeout.count(), key);
    throw Error(e.code(), context, fmt::format("{}: {}", what, e.what()));
  }
  if (id.size() != id_bytes) {
    throw Error(ErrorCode::Protocol, context,
                fmt::format("the NCCL unique id under store key \"{}\" has {} bytes, not {}", key,
                            id.size(), id_bytes));
  }
  return id;
}

}  // namespace weft::nccl
