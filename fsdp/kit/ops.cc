// fsdp/kit/ops.cc: float32 kernels; see ops.h.
#include "fsdp/kit/ops.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>

#include <cblas.h>

#include "fsdp/kit/check.h"

namespace weft::kit::ops {

namespace {
std::once_flag blas_threads_once;

int blas_int(int64_t v, const char* what) {
  WEFT_KIT_CHECK(v >= 0 && v <= INT_MAX, "gemm: {} = {} does not fit OpenBLAS's int", what, v);
  return static_cast<int>(v);
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  std::call_once(blas_threads_once, [] { openblas_set_num_threads(1); });
  if (m == 0 || n == 0) return;
  if (k == 0) {  // OpenBLAS handles it, but say what it means: C = beta * C.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blas_int(m, "m"), blas_int(n, "n"),
              blas_int(k, "k"), alpha, a, blas_int(lda, "lda"), b, blas_int(ldb, "ldb"), beta, c,
              blas_int(ldc, "ldc"));
}

void matmul(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool trans_a,
            bool trans_b, float beta) {
  gemm(trans_a, trans_b, m, n, k, 1.0f, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict row = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void sum_rows_into(const float* x, float* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict row = x + r * cols;
    float* __restrict o = out;
    for (int64_t c = 0; c < cols; ++c) o[c] += row[c];
  }
}

void gelu(const float* x, float* y, int64_t n) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

void layer_norm(const float* x, const float* weight, const float* bias, float* y, float* mean,
                float* rstd, int64_t rows, int64_t cols, float eps) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * cols;
    float* __restrict yr = y + r * cols;
    // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels
    // catastrophically when |mean| >> std.
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < cols; ++c) sum += xr[c];
    const float mu = sum * inv_cols;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < cols; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
    const float rs = 1.0f / std::sqrt(sq * inv_cols + eps);
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * weight[c] + bias[c];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dweight, float* dbias, int64_t rows,
                         int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * cols;
    const float* __restrict dyr = dy + r * cols;
    float* __restrict dxr = dx + r * cols;
    const float mu = mean[r], rs = rstd[r];
    // With xhat = (x - mu) rs and g = dy * weight:
    //   dx = rs * (g - mean(g) - xhat * mean(g * xhat)).
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int64_t c = 0; c < cols; ++c) {
      const float g = dyr[c] * weight[c];
      sum_g += g;
      sum_gx += g * (xr[c] - mu) * rs;
    }
    const float mean_g = sum_g * inv_cols, mean_gx = sum_gx * inv_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float xhat = (xr[c] - mu) * rs;
      dxr[c] = rs * (dyr[c] * weight[c] - mean_g - xhat * mean_gx);
    }
    if (dweight != nullptr)
      for (int64_t c = 0; c < cols; ++c) dweight[c] += dyr[c] * (xr[c] - mu) * rs;
    if (dbias != nullptr)
      for (int64_t c = 0; c < cols; ++c) dbias[c] += dyr[c];
  }
}

namespace {
void softmax_row(const float* x, float* y, int64_t n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t c = 0; c < n; ++c) mx = std::max(mx, x[c]);
  float sum = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    y[c] = std::exp(x[c] - mx);
    sum += y[c];
  }
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < n; ++c) y[c] *= inv;
}
}  // namespace

void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) softmax_row(x + r * cols, y + r * cols, cols);
}

void softmax_rows_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < cols; ++c) dot += dyr[c] * yr[c];
    for (int64_t c = 0; c < cols; ++c) dxr[c] = yr[c] * (dyr[c] - dot);
  }
}

void causal_softmax(float* scores, int64_t t) {
  for (int64_t i = 0; i < t; ++i) {
    float* row = scores + i * t;
    softmax_row(row, row, i + 1);
    for (int64_t j = i + 1; j < t; ++j) row[j] = 0.0f;
  }
}

void embedding(const float* weight, const int32_t* ids, float* out, int64_t n, int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    const float* __restrict src = weight + static_cast<int64_t>(ids[i]) * dim;
    float* __restrict dst = out + i * dim;
    for (int64_t c = 0; c < dim; ++c) dst[c] = src[c];
  }
}

void embedding_backward(const float* dout, const int32_t* ids, float* dweight, int64_t n,
                        int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    const float* __restrict src = dout + i * dim;
    float* __restrict dst = dweight + static_cast<int64_t>(ids[i]) * dim;
    for (int64_t c = 0; c < dim; ++c) dst[c] += src[c];
  }
}

}  // namespace weft::kit::ops
