// fsdp/kit/ops.h: the float32 kernels the kit's layers are made of, on raw row-major arrays.
//
// Matrix products go to OpenBLAS (cblas_sgemm). The first call sets OpenBLAS to one thread for
// the whole process: the kit's users run several ranks as processes on a few cores, and
// OpenBLAS's default (a thread per core in every process) oversubscribes them; ranks are the
// parallelism. Everything else is plain loops written so the compiler vectorizes them (the
// reductions through `omp simd`, built with -fopenmp-simd; no OpenMP runtime is used); erf and
// exp stay scalar libm calls.
//
// Numerics follow PyTorch's CPU defaults: GELU with erf (approximate='none'), LayerNorm with the
// biased variance and eps inside the square root, softmax with the row maximum subtracted.
//
// Conventions: `rows` x `cols` arrays are contiguous unless a leading dimension is given; outputs
// may not alias inputs unless a function says so. Functions named *_backward write the input
// gradient and ADD parameter gradients into their outputs (PyTorch's accumulation into .grad).
// Thread safety: every function is reentrant.
#pragma once

#include <cstdint>

namespace weft::kit::ops {

// C = alpha * op(A) op(B) + beta * C, all row-major: op(A) is [m, k] (A is [k, m] when
// trans_a), op(B) is [k, n], C is [m, n]; lda, ldb, ldc are the row strides in elements, so a
// matrix may be a column block of a wider one (an attention head inside [T, 3C]).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// gemm on contiguous matrices: C[m, n] = op(A) op(B) + beta * C.
void matmul(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
            bool trans_a = false, bool trans_b = false, float beta = 0.0f);

// out[i] = a[i] + b[i]; out may alias a or b.
void add(const float* a, const float* b, float* out, int64_t n);
// y[r, c] += bias[c].
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols);
// out[c] += sum over r of x[r, c] (a bias's gradient).
void sum_rows_into(const float* x, float* out, int64_t rows, int64_t cols);

// y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
void gelu(const float* x, float* y, int64_t n);
// dx = dy * (Phi(x) + x * phi(x)), phi the standard normal density. dx may alias dy.
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);

// Per row: y = (x - mean) * rstd * weight + bias with rstd = 1 / sqrt(var + eps), var biased
// (divided by cols). Saves mean[rows] and rstd[rows] for the backward.
void layer_norm(const float* x, const float* weight, const float* bias, float* y, float* mean,
                float* rstd, int64_t rows, int64_t cols, float eps);
// Writes dx; adds into dweight and dbias (either may be null to skip it).
void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dweight, float* dbias, int64_t rows,
                         int64_t cols);

// y = softmax of each row of x; y may alias x.
void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols);
// dx = y * (dy - sum(dy * y)) per row, y the softmax output; dx may alias dy.
void softmax_rows_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);
// In place on a [t, t] score matrix: row i becomes the softmax of its first i + 1 entries, and
// the masked entries (j > i) become exactly 0, as softmax of -inf gives.
void causal_softmax(float* scores, int64_t t);

// out[i, :] = weight[ids[i], :] for i < n. REQUIRES: 0 <= ids[i] < the weight's rows.
void embedding(const float* weight, const int32_t* ids, float* out, int64_t n, int64_t dim);
// dweight[ids[i], :] += dout[i, :] (repeated ids add up).
void embedding_backward(const float* dout, const int32_t* ids, float* dweight, int64_t n,
                        int64_t dim);

}  // namespace weft::kit::ops
