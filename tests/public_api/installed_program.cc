// Built by installed_test.sh against an installed weft, found by pkg-config alone: if it
// compiles, every header it names is installed and needs nothing outside the install. It then
// runs a one-rank group through the public API and checks the results.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "weft/half.h"
#include "weft/hash_store.h"
#include "weft/process_group.h"
#include "weft/weft.h"

int main() {
  weft::ProcessGroupOptions options;
  options.store = std::make_shared<weft::HashStore>();
  options.rank = 0;
  options.world_size = 1;
  std::shared_ptr<weft::ProcessGroup> world = weft::init_process_group(options);

  std::vector<float> values = {1.5f, -2.0f, 65504.0f};
  world->all_reduce(weft::Tensor::of(values.data(), values.size()), weft::ReduceOp::Sum)->wait();
  for (size_t i = 0; i < values.size(); ++i) {
    // One rank: the sum is the value itself, and each is exact in float16 (a round trip).
    const float expected = weft::half_to_float(weft::float_to_half(values[i]));
    if (world->size() != 1 || values[i] != expected) {
      std::fprintf(stderr, "element %zu: %g, expected %g\n", i, values[i], expected);
      return 1;
    }
  }
  std::printf("installed weft: one-rank all_reduce and half conversions ok\n");
  return 0;
}
