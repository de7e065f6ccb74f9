// runtime/staging.h: where a collective's tensors are copied so that the backend sees one
// contiguous, non-overlapping input and output: scattered lists through the group's buffer pool,
// and inputs that overlap their output other than in place.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "weft/backend.h"
#include "weft/tensor.h"

#include "runtime/buffer_pool.h"
#include "runtime/process_group_state.h"

namespace weft {

// Whether the tensors lie back to back in memory (so the list is one tensor), and that tensor.
std::optional<Tensor> as_contiguous(const std::vector<Tensor>& list);

// A scattered input list copied, back to back, into a pooled buffer (at the call: the caller may
// not change inputs before the Work completes anyway). Returns the lease and the tensor over it.
std::pair<BufferPool::Lease, Tensor> stage_in(BufferPool& pool, const std::vector<Tensor>& list,
                                              const Tensor& like);

// A pooled buffer for a scattered output list, and the epilogue that copies it out.
std::pair<Tensor, Epilogue> stage_out(BufferPool& pool, const std::vector<Tensor>& list,
                                      const Tensor& like);

// When this rank's input overlaps its output other than in the in-place form, a copy of the input
// in a pooled buffer replaces it, and the lease is returned (to keep until the Work completes).
// The algorithms refuse such overlaps, but only on the ranks where they occur: the same call
// (all_gather(buf, buf) is in place on rank 0 only) would pass on some ranks and leave them
// waiting for the rest. Staging makes every overlap valid on every rank, before any sequence
// number is taken.
std::optional<BufferPool::Lease> stage_overlapping_input(BufferPool& pool, Collective& c, int rank);

}  // namespace weft
