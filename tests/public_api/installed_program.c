/* Built by installed_test.sh with the C compiler against an installed weft, found by pkg-config
 * alone, and run with no environment: a one-rank group through the C API (weft.h), its file store
 * at argv[1], and an int64 all_reduce checked element by element. */
#include <stdint.h>
#include <stdio.h>

#include "weft/weft.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s STORE_FILE\n", argv[0]);
    return 2;
  }
  char url[4096];
  snprintf(url, sizeof url, "file://%s", argv[1]);
  weft_init_options_t options = WEFT_INIT_OPTIONS_INIT;
  options.url = url;
  options.rank = 0;
  options.world_size = 1;
  weft_group_t* world = NULL;
  if (weft_init(&options, &world) != WEFT_SUCCESS) {
    fprintf(stderr, "weft_init: %s\n", weft_last_error());
    return 1;
  }
  int64_t values[4] = {-3, 0, 1, INT64_MAX};
  const int64_t expected[4] = {-3, 0, 1, INT64_MAX}; /* one rank: the sum is the value */
  if (weft_all_reduce(world, values, values, 4, WEFT_INT64, WEFT_SUM, NULL) != WEFT_SUCCESS) {
    fprintf(stderr, "weft_all_reduce: %s\n", weft_last_error());
    return 1;
  }
  for (int i = 0; i < 4; ++i) {
    if (values[i] != expected[i]) {
      fprintf(stderr, "element %d: %lld, expected %lld\n", i, (long long)values[i],
              (long long)expected[i]);
      return 1;
    }
  }
  weft_group_destroy(world);
  printf("installed weft %s from C: one-rank all_reduce ok\n", weft_version());
  return 0;
}
