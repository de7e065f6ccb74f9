#include "collectives/transport.h"

#include "weft/error.h"

namespace weft::collectives {

Request Transport::recv_any(void*, size_t, Tag, int*) {
  throw_error(ErrorCode::Unsupported, "recv from any source",
              "this transport matches messages by peer only");
}

}  // namespace weft::collectives
