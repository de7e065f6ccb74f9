// runtime/cuda_staging.h: CUDA tensors on a host backend (tcp, ucx, a plugin), as Gloo serves
// them for c10d: "cpu:tcp,cuda:tcp".
//
// A CudaStagingBackend wraps a host backend made for the group's CUDA tensors. For each operation
// it copies the inputs from the device into pinned host buffers, runs the host backend's
// collective on those buffers, and copies the outputs back to the device:
//
//   caller's stream --event--> d2h stream: inputs -> pinned buffers
//   staging thread:  waits for the d2h event (polled, bounded), then posts to the host backend
//   host backend's thread: the collective on pinned memory; when it completes,
//                          h2d stream: pinned buffers -> outputs, end event
//   the Work: wait() makes the caller's current stream wait for the end event (c10d's CUDA
//             semantics; the host blocks only until the host collective has finished),
//             synchronize() blocks until the end event has passed.
//
// The caller's thread never blocks on the device. Copies in and out run on two streams of their
// own per device, so a copy back never queues behind a copy in that waits for the caller's stream
// (which may itself wait for this operation). Pinned buffers come from a pool, allocated once
// (cudaHostAlloc) and reused; the pool never shrinks while the backend lives. Tensors aliasing
// one another (in place) share one pinned buffer, so every in-place form stays in place.
//
// Thread safety: as Backend (post() from the group, in issue order; abort() from anywhere).
#pragma once

#include <memory>

#include "weft/backend.h"

namespace weft {

// Wraps `host` (made by the group for its CUDA tensors) so that it serves CUDA tensors. Throws
// Error(Unsupported) when the CUDA runtime cannot be loaded or sees no device.
std::unique_ptr<Backend> make_cuda_staging_backend(std::unique_ptr<Backend> host,
                                                   const BackendOptions& options);

}  // namespace weft
