// backends/common/cross_memory.h: single copy between processes of one host (cross-memory attach,
// process_vm_readv), as the shared-memory transport (backends/tcp) and the UCX transport use it
// for large messages: the receiver reads the sender's buffer straight into its own, one copy
// where a shared ring takes two. The kernel may refuse (Yama's ptrace_scope, seccomp, another
// user, another PID namespace): a transport probes each peer once at set-up (can_read) and keeps
// its two-copy path for the peers it cannot read.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/reduce_op.h"

namespace weft::backends {

// The address of a word in this process whose value peers check, to test that they can read
// this process's memory: published at set-up beside the pid.
uint64_t cross_memory_probe_address();

// Whether this process can read process `pid`'s memory: reads the probe word published at
// `probe_address` and checks its value (a pid that names another process fails the check).
bool can_read_process(pid_t pid, uint64_t probe_address);

// Reads `bytes` at `address` in process `pid` into `dst`. Returns 0, or the errno: ESRCH when
// the process is gone, EFAULT when the range is not (or no longer) mapped there.
int read_process(pid_t pid, void* dst, uint64_t address, size_t bytes);

// Reads `bytes` at `address` in process `pid` and combines them into `dst` (dst = dst op remote),
// `piece_bytes` at a time through `staging` (L2-sized: the reduction reads it from cache).
// Returns 0 or the errno, as read_process.
int read_reduce_process(pid_t pid, void* dst, uint64_t address, size_t bytes, DType dtype,
                        ReduceOp op, void* staging, size_t piece_bytes);

// What a failed read of a `bytes`-byte message from rank `peer` (process `pid`) means: PeerLost
// when the process is gone (ESRCH) or the sender withdrew the message and freed its memory
// (EFAULT: its collective failed, or it aborted); Io naming the errno otherwise.
std::pair<ErrorCode, std::string> describe_read_failure(int err, int peer, pid_t pid, size_t bytes);

}  // namespace weft::backends
