// runtime/desync_check.h: WEFT_DEBUG=detail's check that every rank issued the same collective.
//
// Each rank summarises its call in a fixed-size fingerprint (kind, sequence number, dtype, op,
// root, element counts, a hash of per-rank counts); one all_gather on the cpu backend, under an
// internal sequence number, gives every rank all of them, and any difference is Error(Desync)
// on every rank, listing what each called, instead of corrupting memory or hanging.
#pragma once

#include "weft/backend.h"
#include "weft/error.h"

#include "runtime/process_group_state.h"

namespace weft {

// Runs the check for `c` (already numbered; `dtype` its tensors'). REQUIRES: s.mutex held.
void check_fingerprints(ProcessGroup::State& s, const Collective& c, DType dtype,
                        const ErrorContext& context);

// The always-on, cheap half of the same idea: a 16-bit digest of the fields the check compares
// (all but the sequence number), which every message of the collective carries in its tag
// (collectives/tag.h), so that ranks that disagree about dtype, count, op or root at equal byte
// sizes never combine each other's data. Never 0 (0 is "no fingerprint").
uint16_t call_fingerprint(const Collective& c, DType dtype);

}  // namespace weft
