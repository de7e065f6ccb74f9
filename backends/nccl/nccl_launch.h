// backends/nccl/nccl_launch.h: each CollectiveKind as NCCL calls on the communicator's stream.
//
//   kind              | NCCL calls
//   ------------------+------------------------------------------------------------------------
//   all_reduce        | ncclAllReduce
//   reduce            | ncclReduce (non-roots pass their input as the unused receive buffer)
//   broadcast         | ncclBroadcast
//   all_gather        | ncclAllGather; uneven counts: one ncclBroadcast per rank, grouped
//   reduce_scatter    | ncclReduceScatter; uneven counts: one ncclReduce per rank, grouped
//   gather / scatter  | ncclGather / ncclScatter (NCCL 2.28)
//   all_to_all        | ncclAlltoAll; with splits: ncclSend + ncclRecv per peer, grouped; in place:
//                     | the input is first copied to the communicator's scratch memory
//   barrier           | ncclAllReduce of one float32 in scratch memory
//   send / recv       | ncclSend / ncclRecv (NCCL matches them per peer in issue order; the tag
//                     | is not used, as in c10d)
//
// The in-place forms of backend.h's table are NCCL's own in-place forms (the same pointers), so
// nothing is copied except for all_to_all. premul_sum makes an op per call
// (ncclRedOpCreatePreMulSum with the factor in host memory), destroyed once the launch is over.
//
// Thread safety: REQUIRES the caller holds the communicator's Use and made its device current.
#pragma once

#include <chrono>
#include <vector>

#include <nccl.h>

#include "weft/backend.h"
#include "weft/error.h"

#include "backends/nccl/nccl_comm.h"

namespace weft::nccl {

class Launcher {
 public:
  Launcher(NcclComm& owner, ncclComm_t comm, int rank, int size,
           NcclComm::Clock::time_point deadline)
      : owner_(owner), comm_(comm), rank_(rank), size_(size), deadline_(deadline) {}
  // Destroys the premul_sum ops made by launch() (NCCL allows it once the calls using them have
  // been issued).
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Issues `collective`'s calls on the communicator's stream. Throws Error naming `context`:
  // what NCCL refused, or Unsupported for a dtype/op it lacks.
  void launch(const Collective& collective, const ErrorContext& context);

  // ncclGroupStart / ncclGroupEnd around several launches (a coalesced unit, uneven forms).
  // group_end() waits (bounded) for the group's host side to finish.
  void group_start(const ErrorContext& context);
  void group_end(const ErrorContext& context);

 private:
  // Checks one NCCL call's result: inside a group ncclInProgress is fine (group_end waits);
  // outside, waits until the call's host side is done.
  void check(ncclResult_t result, const char* what, const ErrorContext& context);
  ncclRedOp_t reduction(ReduceOp op, DType dtype, const ErrorContext& context);

  void all_gather(const Collective& c, ncclDataType_t dtype, const ErrorContext& context);
  void reduce_scatter(const Collective& c, ncclDataType_t dtype, const ErrorContext& context);
  void all_to_all(const Collective& c, ncclDataType_t dtype, const ErrorContext& context);

  NcclComm& owner_;
  ncclComm_t comm_;
  const int rank_;
  const int size_;
  const NcclComm::Clock::time_point deadline_;
  int group_depth_ = 0;
  std::vector<ncclRedOp_t> ops_;
};

}  // namespace weft::nccl
