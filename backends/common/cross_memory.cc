#include "backends/common/cross_memory.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "runtime/reduce.h"

namespace weft::backends {
namespace {

alignas(8) const uint64_t kProbeWord = 0x7765667420636d61;  // "weft cma"

}  // namespace

uint64_t cross_memory_probe_address() { return reinterpret_cast<uintptr_t>(&kProbeWord); }

bool can_read_process(pid_t pid, uint64_t probe_address) {
  uint64_t word = 0;
  return pid > 0 && read_process(pid, &word, probe_address, sizeof(word)) == 0 &&
         word == kProbeWord;
}

int read_process(pid_t pid, void* dst, uint64_t address, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(dst) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    done += static_cast<size_t>(n);
  }
  return 0;
}

int read_reduce_process(pid_t pid, void* dst, uint64_t address, size_t bytes, DType dtype,
                        ReduceOp op, void* staging, size_t piece_bytes) {
  const size_t element = dtype_size(dtype);
  const size_t piece = std::max(element, piece_bytes / element * element);
  for (size_t done = 0; done < bytes; done += piece) {
    const size_t n = std::min(piece, bytes - done);
    if (int err = read_process(pid, staging, address + done, n); err != 0) return err;
    reduce::accumulate(static_cast<uint8_t*>(dst) + done, staging, n / element, dtype, op);
  }
  return 0;
}

std::pair<ErrorCode, std::string> describe_read_failure(int err, int peer, pid_t pid,
                                                        size_t bytes) {
  if (err == ESRCH) {
    return {ErrorCode::PeerLost,
            fmt::format("rank {} is gone (process {} no longer exists)", peer, pid)};
  }
  if (err == EFAULT) {
    return {ErrorCode::PeerLost,
            fmt::format("rank {} withdrew a {}-byte message before it was read (it failed or "
                        "aborted)",
                        peer, bytes)};
  }
  return {ErrorCode::Io, fmt::format("reading {} bytes from rank {} (process {}) failed: {}", bytes,
                                     peer, pid, std::strerror(err))};
}

}  // namespace weft::backends
