// fsdp/train/data.h: the window formula, wrap-around, rank and micro-batch slicing, token files
// and the synthetic corpus.
#include "fsdp/train/data.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

namespace weft::train {
namespace {

// Tokens 0, 1, 2, ...: a window's first token is its offset.
TokenSource counting(int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), 0);
  return TokenSource(std::move(tokens), n);
}

TEST_CASE("window offsets follow ((s * batch + b) * block) mod (n - block - 1)", "[fsdp][data]") {
  // n = 100, block 8: the mod is 100 - 8 - 1 = 91.
  const TokenSource source = counting(100);
  const int64_t batch = 4, block = 8;
  CHECK(source.window_start(0, 0, batch, block) == 0);
  CHECK(source.window_start(0, 1, batch, block) == 8);
  CHECK(source.window_start(0, 3, batch, block) == 24);
  CHECK(source.window_start(1, 0, batch, block) == 32);   // (1 * 4 + 0) * 8
  CHECK(source.window_start(2, 3, batch, block) == 88);   // (2 * 4 + 3) * 8 = 88 < 91
  CHECK(source.window_start(3, 0, batch, block) == 5);    // 96 mod 91
  CHECK(source.window_start(3, 1, batch, block) == 13);   // 104 mod 91
  CHECK(source.window_start(10, 2, batch, block) == 63);  // 336 mod 91 = 336 - 3 * 91
  // The largest start, 90, still leaves block + 1 = 9 tokens: 90..98.
  for (int64_t s = 0; s < 200; ++s) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t start = source.window_start(s, b, batch, block);
      REQUIRE(start >= 0);
      REQUIRE(start + block + 1 <= 99);
    }
  }
  // Large steps do not overflow: (10^15 * 4 + 1) * 8 mod 91, worked in 128 bits.
  const int64_t big = 1'000'000'000'000'000;
  const auto expected =
      static_cast<int64_t>((static_cast<unsigned __int128>(big) * 4 + 1) * 8 % 91);
  CHECK(source.window_start(big, 1, batch, block) == expected);
}

TEST_CASE("a batch's inputs are each window's first block tokens, targets its last",
          "[fsdp][data]") {
  const TokenSource source = counting(100);
  const Batch batch = source.batch(3, 4, 8);
  CHECK(batch.first_sequence == 0);
  CHECK(batch.sequences == 4);
  CHECK(batch.block_size == 8);
  REQUIRE(batch.inputs.size() == 32);
  REQUIRE(batch.targets.size() == 32);
  // Step 3 wraps: sequence 0 starts at 96 mod 91 = 5, sequence 1 at 13, 2 at 21, 3 at 29.
  const int64_t starts[4] = {5, 13, 21, 29};
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t col = 0; col < 8; ++col) {
      INFO("row " << row << " col " << col);
      CHECK(batch.inputs[row * 8 + col] == starts[row] + col);
      CHECK(batch.targets[row * 8 + col] == starts[row] + col + 1);
    }
  }
  // Step 2, sequence 3 starts at 88 and reads up to token 96: no wrap inside a window.
  const Batch step2 = source.batch(2, 4, 8);
  CHECK(step2.inputs[3 * 8] == 88);
  CHECK(step2.targets[3 * 8 + 7] == 96);
}

TEST_CASE("ranks and micro-batches take contiguous equal slices of the global batch",
          "[fsdp][data]") {
  const TokenSource source = counting(1000);
  const Batch global = source.batch(5, 8, 4);
  const SequenceRange r1 = rank_sequences(8, 1, 4);
  CHECK(r1.first == 2);
  CHECK(r1.count == 2);
  for (int rank = 0; rank < 4; ++rank) {
    const Batch mine = source.rank_batch(5, 8, 4, rank, 4);
    CHECK(mine.first_sequence == 2 * rank);
    CHECK(mine.sequences == 2);
    const Batch expected = global.rows(2 * rank, 2);
    CHECK(mine.inputs == expected.inputs);
    CHECK(mine.targets == expected.targets);
  }
  // Rank 1 of 2 holds sequences 4..7; its micro-batch 1 of 2 is sequences 6..7.
  const Batch rank1 = source.rank_batch(5, 8, 4, 1, 2);
  const Batch micro = micro_batch(rank1, 1, 2);
  CHECK(micro.first_sequence == 6);
  CHECK(micro.sequences == 2);
  CHECK(micro.inputs == global.rows(6, 2).inputs);
  CHECK(micro.targets == global.rows(6, 2).targets);
  CHECK(micro_batch_sequences(4, 3, 4).first == 3);
  CHECK(micro_batch_sequences(4, 3, 4).count == 1);
  // Every micro-batch of every rank, concatenated in order, is the global batch.
  std::vector<int32_t> joined;
  for (int rank = 0; rank < 2; ++rank) {
    const Batch part = source.rank_batch(5, 8, 4, rank, 2);
    for (int m = 0; m < 4; ++m) {
      const Batch mb = micro_batch(part, m, 4);
      joined.insert(joined.end(), mb.inputs.begin(), mb.inputs.end());
    }
  }
  CHECK(joined == global.inputs);
}

TEST_CASE("uneven splits and bad indices are refused", "[fsdp][data]") {
  CHECK_THROWS_WITH(rank_sequences(10, 0, 4),
                    Catch::Contains("InvalidArgument") &&
                        Catch::Contains("10 sequences do not split evenly into 4 ranks"));
  CHECK_THROWS_WITH(rank_sequences(8, 4, 4), Catch::Contains("rank 4 of 4"));
  CHECK_THROWS_WITH(rank_sequences(8, -1, 4), Catch::Contains("rank -1 of 4"));
  CHECK_THROWS_WITH(micro_batch_sequences(6, 0, 4),
                    Catch::Contains("6 sequences do not split evenly into 4 micro-batches"));
  const TokenSource source = counting(10);
  CHECK_THROWS_WITH(source.batch(0, 2, 9), Catch::Contains("need at least block_size + 2"));
  CHECK_NOTHROW(source.batch(0, 2, 8));  // n = block + 2: the mod is 1, every window at 0
  CHECK(source.window_start(7, 1, 2, 8) == 0);
  CHECK_THROWS_WITH(source.window_start(-1, 0, 2, 4), Catch::Contains("step -1"));
  CHECK_THROWS_WITH(source.window_start(0, 2, 2, 4), Catch::Contains("sequence 2"));
  CHECK_THROWS_AS(source.batch(0, 0, 4), weft::Error);
  const Batch b = source.batch(0, 2, 4);
  CHECK_THROWS_WITH(b.rows(1, 2), Catch::Contains("rows [1, 3) of a 2-sequence batch"));
}

TEST_CASE("tokens outside the vocabulary are refused with their index", "[fsdp][data]") {
  CHECK_THROWS_WITH(TokenSource({1, 2, 7, 3}, 5),
                    Catch::Contains("token 7 at index 2 is outside [0, 5)"));
  CHECK_THROWS_WITH(TokenSource({1, -1}, 5), Catch::Contains("token -1 at index 1"));
}

TEST_CASE("token files are raw little-endian int32", "[fsdp][data]") {
  char dir_name[] = "/tmp/weft-data-test-XXXXXX";
  REQUIRE(mkdtemp(dir_name) != nullptr);
  const std::string dir = dir_name;
  const std::string good = dir + "/tokens.bin";
  {
    std::ofstream out(good, std::ios::binary);
    // 3, 258 (0x102), 65536 (0x10000), 0, byte by byte.
    const unsigned char bytes[] = {3, 0, 0, 0, 2, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
    out.write(reinterpret_cast<const char*>(bytes), sizeof(bytes));
  }
  const TokenSource source = TokenSource::from_file(good, 70000);
  CHECK(source.size() == 4);
  CHECK(std::vector<int32_t>(source.tokens().begin(), source.tokens().end()) ==
        std::vector<int32_t>{3, 258, 65536, 0});
  CHECK_THAT(source.description(), Catch::Contains("tokens.bin") && Catch::Contains("4 tokens"));
  CHECK_THROWS_WITH(TokenSource::from_file(good, 1000), Catch::Contains("token 65536 at index 2"));

  const std::string odd = dir + "/odd.bin";
  std::ofstream(odd, std::ios::binary).write("\1\0\0\0\2", 5);
  CHECK_THROWS_WITH(TokenSource::from_file(odd, 10),
                    Catch::Contains("5 bytes is not a whole number of int32 tokens"));
  try {
    TokenSource::from_file(dir + "/missing.bin", 10);
    FAIL("opened a missing file");
  } catch (const weft::Error& e) {
    CHECK(e.code() == ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::Contains("missing.bin") && Catch::Contains("No such file"));
  }
  // A FIFO (which open() would wait on for a writer) or a directory: refused, never opened.
  const std::string fifo = dir + "/fifo.bin";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {fifo, dir}) {
    try {
      TokenSource::from_file(path, 10);
      FAIL("read " << path);
    } catch (const weft::Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      CHECK_THAT(e.what(), Catch::StartsWith("token file \"" + path + "\""));
      CHECK_THAT(e.what(), Catch::Contains(path == fifo ? "a FIFO, not a regular file"
                                                        : "a directory, not a regular file"));
    }
  }
  const std::string cmd = "rm -rf '" + dir + "'";
  CHECK(std::system(cmd.c_str()) == 0);
}

TEST_CASE("the synthetic corpus is deterministic, seeded and follows its rule 3 times in 4",
          "[fsdp][data]") {
  const SyntheticCorpus corpus{.vocab_size = 64, .n_tokens = 4096, .seed = 0};
  const std::vector<int32_t> a = synthetic_tokens(corpus);
  CHECK(a == synthetic_tokens(corpus));
  CHECK(a.size() == 4096);
  // The first tokens, worked by hand from splitmix64 with seed 0: its first outputs are
  // 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4 and 0x06C45D188009454F (the published test vector
  // for seed 0), so t[0] = 0x7B1DCDAF mod 64 = 47; r >> 62 of the second is 1: the rule gives
  // t[1] = (3 * 47 + 1) mod 64 = 14; r >> 62 of the third is 0: t[2] = 0x8009454F mod 64 = 15.
  CHECK(a[0] == 47);
  CHECK(a[1] == 14);
  CHECK(a[2] == 15);
  int64_t follows = 0;
  for (size_t i = 1; i < a.size(); ++i) {
    REQUIRE(a[i] >= 0);
    REQUIRE(a[i] < 64);
    follows += a[i] == (3 * a[i - 1] + 1) % 64;
  }
  // 3/4 by rule plus 1/64 of the random quarter by chance: about 0.754 of 4095.
  CHECK(follows > 0.72 * 4095);
  CHECK(follows < 0.79 * 4095);
  const SyntheticCorpus other_seed{.vocab_size = 64, .n_tokens = 4096, .seed = 1};
  CHECK(synthetic_tokens(other_seed) != a);
  // A prefix of a longer corpus is the shorter corpus.
  const SyntheticCorpus longer{.vocab_size = 64, .n_tokens = 8192, .seed = 0};
  const std::vector<int32_t> b = synthetic_tokens(longer);
  CHECK(std::vector<int32_t>(b.begin(), b.begin() + 4096) == a);
  const TokenSource source = TokenSource::synthetic(corpus);
  CHECK(source.size() == 4096);
  CHECK(source.description() == "synthetic corpus (4096 tokens, vocab 64, seed 0)");
}

}  // namespace
}  // namespace weft::train
