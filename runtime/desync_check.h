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

}  // namespace weft
