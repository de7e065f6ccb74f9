#include "backends/nccl/nccl_launch.h"

#include <algorithm>

#include <fmt/format.h>

#include "backends/nccl/cuda_util.h"
#include "backends/nccl/nccl_types.h"

namespace weft::nccl {
namespace {

char* at(const Tensor& t, size_t elements) {
  return static_cast<char*>(t.data) + elements * dtype_size(t.dtype);
}

bool all_equal(const std::vector<size_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

}  // namespace

Launcher::~Launcher() {
  // An exception left a group open: close it so that this thread's next NCCL call is not
  // swallowed into it (NCCL's group state is per thread).
  while (group_depth_ > 0) {
    ncclGroupEnd();
    --group_depth_;
  }
  for (ncclRedOp_t op : ops_) ncclRedOpDestroy(op, comm_);
}

void Launcher::check(ncclResult_t result, const char* what, const ErrorContext& context) {
  if (group_depth_ > 0 && result == ncclInProgress) return;
  owner_.wait_ready(result, deadline_, what, context);
}

void Launcher::group_start(const ErrorContext& context) {
  check(ncclGroupStart(), "ncclGroupStart", context);
  ++group_depth_;
}

void Launcher::group_end(const ErrorContext& context) {
  --group_depth_;
  check(ncclGroupEnd(), "ncclGroupEnd", context);
}

ncclRedOp_t Launcher::reduction(ReduceOp op, DType dtype, const ErrorContext& context) {
  NcclReduction r = to_nccl_reduction(op, dtype, context);
  if (!r.premul) return r.op;
  ncclRedOp_t created;
  check(ncclRedOpCreatePreMulSum(&created, r.scalar, require_nccl_dtype(dtype, context),
                                 ncclScalarHostImmediate, comm_),
        "ncclRedOpCreatePreMulSum", context);
  ops_.push_back(created);
  return created;
}

void Launcher::launch(const Collective& c, const ErrorContext& context) {
  cudaStream_t stream = owner_.stream();
  switch (c.kind) {
    case CollectiveKind::AllReduce: {
      const Tensor& x = c.inputs.at(0);
      const ncclDataType_t dtype = require_nccl_dtype(x.dtype, context);
      const ncclRedOp_t op = reduction(c.op, x.dtype, context);
      check(ncclAllReduce(x.data, c.outputs.at(0).data, x.count, dtype, op, comm_, stream),
            "ncclAllReduce", context);
      return;
    }
    case CollectiveKind::Reduce: {
      const Tensor& x = c.inputs.at(0);
      const ncclDataType_t dtype = require_nccl_dtype(x.dtype, context);
      const ncclRedOp_t op = reduction(c.op, x.dtype, context);
      void* y = rank_ == c.root ? c.outputs.at(0).data : x.data;
      check(ncclReduce(x.data, y, x.count, dtype, op, c.root, comm_, stream), "ncclReduce",
            context);
      return;
    }
    case CollectiveKind::Broadcast: {
      const Tensor& y = c.outputs.at(0);
      const void* x = rank_ == c.root ? c.inputs.at(0).data : y.data;
      check(ncclBroadcast(x, y.data, y.count, require_nccl_dtype(y.dtype, context), c.root, comm_,
                          stream),
            "ncclBroadcast", context);
      return;
    }
    case CollectiveKind::AllGather:
      all_gather(c, require_nccl_dtype(c.inputs.at(0).dtype, context), context);
      return;
    case CollectiveKind::ReduceScatter:
      reduce_scatter(c, require_nccl_dtype(c.inputs.at(0).dtype, context), context);
      return;
    case CollectiveKind::Gather: {
      const Tensor& x = c.inputs.at(0);
      // Non-roots have no output: NCCL does not use their receive buffer, but gets a valid
      // device pointer rather than null, whatever its argument checks do with it.
      void* y = rank_ == c.root ? c.outputs.at(0).data : x.data;
      check(ncclGather(x.data, y, x.count, require_nccl_dtype(x.dtype, context), c.root, comm_,
                       stream),
            "ncclGather", context);
      return;
    }
    case CollectiveKind::Scatter: {
      const Tensor& y = c.outputs.at(0);
      const void* x = rank_ == c.root ? c.inputs.at(0).data : y.data;  // unused off the root
      check(ncclScatter(x, y.data, y.count, require_nccl_dtype(y.dtype, context), c.root, comm_,
                        stream),
            "ncclScatter", context);
      return;
    }
    case CollectiveKind::AllToAll:
      all_to_all(c, require_nccl_dtype(c.inputs.at(0).dtype, context), context);
      return;
    case CollectiveKind::Barrier: {
      // One element through every rank: NCCL has no barrier, and this is c10d's.
      void* flag = owner_.scratch(sizeof(float), context);
      check(ncclAllReduce(flag, flag, 1, ncclFloat32, ncclSum, comm_, stream), "ncclAllReduce",
            context);
      return;
    }
    case CollectiveKind::Send: {
      const Tensor& x = c.inputs.at(0);
      check(ncclSend(x.data, x.count, require_nccl_dtype(x.dtype, context), c.peer, comm_, stream),
            "ncclSend", context);
      return;
    }
    case CollectiveKind::Recv: {
      if (c.peer == kAnySource) {
        throw Error(ErrorCode::Unsupported, context,
                    "backend \"nccl\" cannot receive from any source (NCCL names the peer of "
                    "every receive)");
      }
      const Tensor& y = c.outputs.at(0);
      check(ncclRecv(y.data, y.count, require_nccl_dtype(y.dtype, context), c.peer, comm_, stream),
            "ncclRecv", context);
      return;
    }
  }
  throw Error(
      ErrorCode::Unsupported, context,
      fmt::format("backend \"nccl\" does not know collective kind {}", static_cast<int>(c.kind)));
}

void Launcher::all_gather(const Collective& c, ncclDataType_t dtype, const ErrorContext& context) {
  const Tensor& x = c.inputs.at(0);
  const Tensor& y = c.outputs.at(0);
  cudaStream_t stream = owner_.stream();
  if (all_equal(c.counts)) {
    check(ncclAllGather(x.data, y.data, x.count, dtype, comm_, stream), "ncclAllGather", context);
    return;
  }
  // Uneven: rank r broadcasts its block into everyone's place for it; all in one group, so NCCL
  // runs them together. In place (x is this rank's block of y), the root's send and receive
  // buffers coincide, which ncclBroadcast allows.
  group_start(context);
  size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    const size_t n = c.counts.at(r);
    if (n > 0) {
      void* block = at(y, offset);
      check(ncclBroadcast(r == rank_ ? x.data : block, block, n, dtype, r, comm_, stream),
            "ncclBroadcast", context);
    }
    offset += n;
  }
  group_end(context);
}

void Launcher::reduce_scatter(const Collective& c, ncclDataType_t dtype,
                              const ErrorContext& context) {
  const Tensor& x = c.inputs.at(0);
  const Tensor& y = c.outputs.at(0);
  cudaStream_t stream = owner_.stream();
  const ncclRedOp_t op = reduction(c.op, x.dtype, context);
  if (all_equal(c.counts)) {
    check(ncclReduceScatter(x.data, y.data, y.count, dtype, op, comm_, stream), "ncclReduceScatter",
          context);
    return;
  }
  // Uneven: block r is reduced onto rank r, one ncclReduce per rank in one group.
  group_start(context);
  size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    const size_t n = c.counts.at(r);
    if (n > 0) {
      void* block = at(x, offset);
      check(ncclReduce(block, r == rank_ ? y.data : block, n, dtype, op, r, comm_, stream),
            "ncclReduce", context);
    }
    offset += n;
  }
  group_end(context);
}

void Launcher::all_to_all(const Collective& c, ncclDataType_t dtype, const ErrorContext& context) {
  const Tensor& x = c.inputs.at(0);
  const Tensor& y = c.outputs.at(0);
  cudaStream_t stream = owner_.stream();
  Tensor source = x;
  if (x.data == y.data && x.count > 0) {
    // In place: every rank's receives would overwrite blocks still to be sent, so the input
    // goes to scratch first (on the same stream: ordered before the sends).
    source.data = owner_.scratch(x.nbytes(), context);
    check_cuda(cudaMemcpyAsync(source.data, x.data, x.nbytes(), cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync (all_to_all's input to scratch)", context);
  }
  const bool even = all_equal(c.send_counts) && all_equal(c.recv_counts) &&
                    c.send_counts.at(0) == c.recv_counts.at(0);
  if (even) {
    check(ncclAlltoAll(source.data, y.data, c.send_counts.at(0), dtype, comm_, stream),
          "ncclAlltoAll", context);
    return;
  }
  group_start(context);
  size_t send_offset = 0;
  size_t recv_offset = 0;
  for (int r = 0; r < size_; ++r) {
    const size_t send_n = c.send_counts.at(r);
    const size_t recv_n = c.recv_counts.at(r);
    if (send_n > 0) {
      check(ncclSend(at(source, send_offset), send_n, dtype, r, comm_, stream), "ncclSend",
            context);
    }
    if (recv_n > 0) {
      check(ncclRecv(at(y, recv_offset), recv_n, dtype, r, comm_, stream), "ncclRecv", context);
    }
    send_offset += send_n;
    recv_offset += recv_n;
  }
  group_end(context);
}

}  // namespace weft::nccl
