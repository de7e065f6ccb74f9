#include "collectives/tag.h"

#include <fmt/format.h>

namespace weft::collectives {

std::string tag_text(Tag tag) {
  if (tag == kTransportControlTag) return "transport control message";
  if ((tag & kPointToPointBit) != 0) return fmt::format("tag {}", tag & ~kPointToPointBit);
  const uint64_t seq = (tag & kSeqField & ~kFingerprintField) >> kStepBits;
  const uint32_t step = static_cast<uint32_t>(tag & kStepField);
  const char* internal = (tag & kInternalField) != 0 ? "internal " : "";
  const uint16_t fingerprint = tag_fingerprint(tag);
  const std::string call = fingerprint != 0 ? fmt::format(", call {:04x}", fingerprint) : "";
  // "tag seq:step" first: the raw fields, as logs and tests have always shown them.
  if (step < kStepsPerPhase) {
    return fmt::format("tag {}:{} ({}seq {} step {}{})", seq, step, internal, seq, step, call);
  }
  return fmt::format("tag {}:{} ({}seq {} phase {} step {}{})", seq, step, internal, seq,
                     step / kStepsPerPhase, step % kStepsPerPhase, call);
}

}  // namespace weft::collectives
