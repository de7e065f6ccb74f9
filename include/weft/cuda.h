// weft/cuda.h: the CUDA stream that collectives on CUDA tensors order themselves against.
//
// As in c10d, a collective on CUDA tensors is ordered after everything already queued on the
// caller's *current stream* when it is posted, and its Work's wait() makes the current stream
// wait for it (no host block; Work::synchronize() blocks the host). weft keeps one current stream
// per thread; nullptr (the default) is CUDA's legacy default stream.
//
//   cudaStream_t s = ...;                        // the caller's stream
//   {
//     weft::CudaStreamGuard guard(s);            // collectives posted on this thread use s
//     auto work = pg->all_reduce(grad);          // grad: a Tensor on Device::cuda(i)
//     work->wait();                              // s waits for the all_reduce; the host does not
//   }
//
// This header needs no CUDA headers: weft::CudaStream is cudaStream_t (both are CUstream_st*),
// so either converts to the other without a cast. libweft links no CUDA library; the CUDA
// runtime is loaded when a CUDA tensor first needs it (docs/cuda.md).
//
// Thread safety: the current stream is per thread; reading and setting it never blocks.
#pragma once

struct CUstream_st;

namespace weft {

// cudaStream_t, without the CUDA headers. nullptr: the legacy default stream.
using CudaStream = CUstream_st*;

// The calling thread's current stream (nullptr until set).
CudaStream current_cuda_stream();
// Sets the calling thread's current stream; returns the previous one.
CudaStream set_current_cuda_stream(CudaStream stream);

// Makes `stream` the calling thread's current stream for the guard's lifetime (c10d's
// `with torch.cuda.stream(s)`), then restores the previous one.
class CudaStreamGuard {
 public:
  explicit CudaStreamGuard(CudaStream stream) : previous_(set_current_cuda_stream(stream)) {}
  ~CudaStreamGuard() { set_current_cuda_stream(previous_); }
  CudaStreamGuard(const CudaStreamGuard&) = delete;
  CudaStreamGuard& operator=(const CudaStreamGuard&) = delete;

 private:
  CudaStream previous_;
};

}  // namespace weft
