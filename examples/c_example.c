/* examples/c_example.c: weft from plain C (weft/weft.h): a synchronous all_reduce, an
 * asynchronous all_gather overlapped with local computation, and what an error looks like.
 *
 *   weftrun --nproc-per-node 3 --standalone build/examples/c_example
 *   cc c_example.c $(pkg-config --cflags --libs weft)      # against an installed weft
 *
 * Every rank checks every element it receives against values it computes itself, prints one
 * line, and exits non-zero on a mismatch or an error (printing weft_last_error()). Rank 0 also
 * prints the message of an error made on purpose: a broadcast from a root that does not exist.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft/weft.h"

enum {
  kReduceCount = 1000, /* floats in the all_reduce */
  kGatherCount = 4096, /* int32s each rank contributes to the all_gather */
  kComputeSteps = 2000000
};

/* Calls a weft function; on failure prints which call failed and why, and jumps to `done`. */
#define CHECK(call)                                                                \
  do {                                                                             \
    weft_result_t result_ = (call);                                                \
    if (result_ != WEFT_SUCCESS) {                                                 \
      fprintf(stderr, "c_example: %s: %s: %s\n", #call, weft_result_name(result_), \
              weft_last_error());                                                  \
      goto done;                                                                   \
    }                                                                              \
  } while (0)

/* The local work the all_gather overlaps with: a sum of squares mod 2^32, which the program
 * knows in closed form, so the computation is checked too (and cannot be optimised away). */
static uint32_t sum_of_squares(uint32_t n) {
  uint32_t sum = 0;
  for (uint32_t i = 0; i < n; ++i) sum += i * i;
  return sum;
}

/* 0^2 + ... + (n-1)^2 = (n-1) n (2n-1) / 6, computed in 64 bits (exact for this n), mod 2^32. */
static uint32_t sum_of_squares_closed_form(uint32_t n) {
  uint64_t m = n;
  return (uint32_t)((m - 1) * m * (2 * m - 1) / 6);
}

int main(void) {
  int status = 1;
  weft_group_t* world = NULL;
  weft_work_t* gather = NULL;
  int32_t* block = NULL;
  int32_t* gathered = NULL;
  float values[kReduceCount];
  int32_t rank = 0, size = 0;

  /* 1. Meet the other ranks as the launcher (weftrun, torchrun, srun, mpirun) says. */
  CHECK(weft_init_from_env(&world));
  CHECK(weft_group_rank(world, &rank));
  CHECK(weft_group_size(world, &size));

  /* 2. A synchronous all_reduce (work = NULL): returns when every rank's values are summed.
   * Element i is rank + i / 2 on each rank; every value and sum is exact in float32. */
  for (int i = 0; i < kReduceCount; ++i) values[i] = (float)rank + 0.5f * (float)i;
  CHECK(weft_all_reduce(world, values, values, kReduceCount, WEFT_FLOAT32, WEFT_SUM, NULL));
  for (int i = 0; i < kReduceCount; ++i) {
    float expected = (float)(size * (size - 1) / 2) + (float)size * 0.5f * (float)i;
    if (values[i] != expected) {
      fprintf(stderr, "c_example: rank %d: all_reduce element %d is %g, expected %g\n", rank, i,
              (double)values[i], (double)expected);
      goto done;
    }
  }

  /* 3. An asynchronous all_gather: it returns at once with a work handle, and runs while this
   * rank computes. The buffers belong to weft until the work completes. */
  block = malloc(kGatherCount * sizeof(int32_t));
  gathered = malloc((size_t)size * kGatherCount * sizeof(int32_t));
  if (block == NULL || gathered == NULL) {
    fprintf(stderr, "c_example: out of memory\n");
    goto done;
  }
  for (int j = 0; j < kGatherCount; ++j) block[j] = rank * 100000 + j;
  CHECK(weft_all_gather(world, block, gathered, kGatherCount, WEFT_INT32, &gather));
  uint32_t computed = sum_of_squares(kComputeSteps); /* overlaps with the all_gather */
  CHECK(weft_work_wait(gather, -1));                 /* -1: the group's timeout */
  weft_work_free(gather);
  gather = NULL;
  if (computed != sum_of_squares_closed_form(kComputeSteps)) {
    fprintf(stderr, "c_example: rank %d: local computation gave %u\n", rank, computed);
    goto done;
  }
  for (int r = 0; r < size; ++r) {
    for (int j = 0; j < kGatherCount; ++j) {
      int32_t got = gathered[(size_t)r * kGatherCount + j];
      if (got != r * 100000 + j) {
        fprintf(stderr, "c_example: rank %d: all_gather block %d element %d is %d, expected %d\n",
                rank, r, j, (int)got, r * 100000 + j);
        goto done;
      }
    }
  }

  /* 4. Errors: a broadcast from a root that does not exist is refused before anything is sent
   * (every rank makes the same mistake, so the ranks stay in step), with a code and a message
   * that names the root. The group is still usable afterwards. */
  weft_result_t refused = weft_broadcast(world, values, kReduceCount, WEFT_FLOAT32, size, NULL);
  char root_text[32];
  snprintf(root_text, sizeof(root_text), "root %d", (int)size);
  if (refused != WEFT_ERR_INVALID_ARGUMENT || strstr(weft_last_error(), root_text) == NULL) {
    fprintf(stderr,
            "c_example: rank %d: broadcast from root %d returned %s (\"%s\"), expected "
            "WEFT_ERR_INVALID_ARGUMENT naming the root\n",
            rank, (int)size, weft_result_name(refused), weft_last_error());
    goto done;
  }
  if (rank == 0) printf("rank 0: as expected, %s\n", weft_last_error());

  printf(
      "rank %d/%d: all_reduce of %d float32 ok, all_gather of %d x %d int32 ok (overlapped "
      "with local compute), weft %s\n",
      rank, size, kReduceCount, size, kGatherCount, weft_version());
  fflush(stdout);

  /* 5. Leave together: without a launcher, rank 0 hosts the store the others' groups use. */
  CHECK(weft_barrier(world, NULL));
  status = 0;

done:
  /* Order matters on the error paths: an all_gather may still be running. Freeing its handle
   * leaves it running; destroying the group waits for it; only then may its buffers go. */
  weft_work_free(gather);
  if (weft_group_destroy(world) != WEFT_SUCCESS) {
    fprintf(stderr, "c_example: weft_group_destroy: %s\n", weft_last_error());
    status = 1;
  }
  free(block);
  free(gathered);
  return status;
}
