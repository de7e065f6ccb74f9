/* c_api_latency: time per synchronous weft_all_reduce of a few bytes through the C API, the
 * baseline that benchmarks/python_overhead.py compares the Python package against (docs/python.md).
 *
 *   weftrun --nproc-per-node 2 --standalone build/benchmarks/c_api_latency [ITERS [BYTES]]
 *
 * Rank 0 prints the median over 7 rounds of ITERS calls (default 2000) of BYTES (default 8) of
 * float32, in microseconds per call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weft/weft.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  const long iters = argc > 1 ? atol(argv[1]) : 2000;
  const long bytes = argc > 2 ? atol(argv[2]) : 8;
  if (iters <= 0 || bytes < 4 || bytes % 4 != 0) {
    fprintf(stderr, "usage: c_api_latency [ITERS > 0 [BYTES, a multiple of 4]]\n");
    return 2;
  }
  weft_group_t* world = NULL;
  if (weft_init_from_env(&world) != WEFT_SUCCESS) {
    fprintf(stderr, "%s\n", weft_last_error());
    return 1;
  }
  int32_t rank = 0;
  weft_group_rank(world, &rank);
  const size_t count = (size_t)bytes / 4;
  float* buf = calloc(count, sizeof(float));
  enum { kRounds = 7 };
  double per_call[kRounds];
  for (long i = 0; i < iters / 10 + 10; ++i) {  // warm up
    if (weft_all_reduce(world, buf, buf, count, WEFT_FLOAT32, WEFT_SUM, NULL) != WEFT_SUCCESS) {
      fprintf(stderr, "%s\n", weft_last_error());
      return 1;
    }
  }
  for (int round = 0; round < kRounds; ++round) {
    weft_barrier(world, NULL);
    const double start = now_us();
    for (long i = 0; i < iters; ++i) {
      if (weft_all_reduce(world, buf, buf, count, WEFT_FLOAT32, WEFT_SUM, NULL) != WEFT_SUCCESS) {
        fprintf(stderr, "%s\n", weft_last_error());
        return 1;
      }
    }
    per_call[round] = (now_us() - start) / (double)iters;
  }
  qsort(per_call, kRounds, sizeof(double), by_value);
  if (rank == 0) {
    printf("c_api all_reduce %ld B: %.2f us/call (median of %d rounds of %ld)\n", bytes,
           per_call[kRounds / 2], kRounds, iters);
  }
  free(buf);
  weft_group_destroy(world);
  return 0;
}
