// fsdp/train/data.h: the training data contract, the token stream and the windows each step
// trains on, so that weft and a PyTorch script given the same flags see the same batches.
// docs/fsdp-training-contract.md states it for the PyTorch side; the two must agree.
//
// Tokens. Either a file of raw little-endian int32 tokens (--data FILE; its size a multiple of
// 4 bytes, every token in [0, vocab_size)), or, without --data, the synthetic corpus below.
//
// Windows. With n tokens, sequence b (0-based, of the global batch) of step s (0-based) is the
// window of block_size + 1 tokens starting at
//
//   offset(s, b) = ((s * batch_size + b) * block_size) mod (n - block_size - 1)
//
// its inputs are the window's first block_size tokens, its targets the last block_size (the
// inputs shifted by one). batch_size is the global batch in sequences. Consecutive sequences
// abut, so the corpus is read front to back and wraps around; the mod needs n >= block_size + 2.
//
// Sharding. Data-parallel rank r of R trains on global sequences [r * batch_size / R,
// (r + 1) * batch_size / R); R must divide batch_size. A rank's sequences may further be split
// into M equal micro-batches the same way. Since the loss is the mean over every target token of
// the global batch, a rank (or micro-batch) sums its tokens' losses and divides by
// batch_size * block_size, not by its own count.
//
// Synthetic corpus (SyntheticCorpus): n_tokens tokens from splitmix64 (Steele et al. 2014, the
// generator java.util.SplittableRandom uses), all arithmetic modulo 2^64:
//
//   state = seed
//   next():  state += 0x9E3779B97F4A7C15; z = state
//            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//            z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//            return z ^ (z >> 31)
//   for i in 0 .. n_tokens - 1:
//     r = next()
//     t[i] = (3 * t[i-1] + 1) mod vocab_size    if i >= 1 and (r >> 62) != 0  (3 in 4)
//            (r & 0xFFFFFFFF) mod vocab_size    otherwise
//
// So three tokens in four follow from the one before: a bigram rule that even a one-layer model
// picks up within tens of steps, so a short run shows the loss falling (from ln(vocab_size)
// towards about 1.6 for vocab 64), while the random quarter keeps it away from zero.
//
// Thread safety: a TokenSource is immutable once built; any thread may read batches.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft::train {

struct SyntheticCorpus {
  int64_t vocab_size = 0;
  int64_t n_tokens = 262144;  // 2^18: --synthetic-tokens
  uint64_t seed = 0;          // --data-seed
};

// The synthetic corpus's tokens, as the header defines them.
std::vector<int32_t> synthetic_tokens(const SyntheticCorpus& corpus);

// Some of the global batch's sequences: rows [first_sequence, first_sequence + sequences).
struct Batch {
  int64_t first_sequence = 0;    // index of row 0 in the global batch
  int64_t sequences = 0;         // rows
  int64_t block_size = 0;        // columns
  std::vector<int32_t> inputs;   // sequences x block_size, row-major
  std::vector<int32_t> targets;  // the same shape: inputs shifted by one token

  // Rows [first, first + count) of this batch (first relative to this batch's row 0).
  Batch rows(int64_t first, int64_t count) const;
};

// A run of sequences of a batch.
struct SequenceRange {
  int64_t first = 0;
  int64_t count = 0;
};

// The sequences of the global batch that data-parallel rank `rank` of `world` trains on. Throws
// weft::Error (InvalidArgument) unless 0 <= rank < world and world divides batch_size.
SequenceRange rank_sequences(int64_t batch_size, int rank, int world);

// Micro-batch `index` of `n_micro` of a run of `sequences` sequences (relative to its start).
// Throws weft::Error (InvalidArgument) unless 0 <= index < n_micro and n_micro divides sequences.
SequenceRange micro_batch_sequences(int64_t sequences, int64_t index, int64_t n_micro);

// Micro-batch `index` of `n_micro` of `batch`: batch.rows() of micro_batch_sequences().
Batch micro_batch(const Batch& batch, int64_t index, int64_t n_micro);

class TokenSource {
 public:
  // Takes `tokens` as the stream. Throws weft::Error (InvalidArgument) when a token is outside
  // [0, vocab_size) (naming its index) or vocab_size < 1.
  TokenSource(std::vector<int32_t> tokens, int64_t vocab_size, std::string description = "tokens");

  // The raw little-endian int32 file at `path`. Throws weft::Error: Io when it cannot be read,
  // InvalidArgument when its size is not a multiple of 4 or a token is out of range.
  static TokenSource from_file(const std::string& path, int64_t vocab_size);
  static TokenSource synthetic(const SyntheticCorpus& corpus);

  std::span<const int32_t> tokens() const { return tokens_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t vocab_size() const { return vocab_size_; }
  // "file data/train.bin (1000000 tokens)", "synthetic corpus (262144 tokens, vocab 64, seed 0)".
  const std::string& description() const { return description_; }

  // offset(step, sequence) from the header. Throws weft::Error (InvalidArgument) when step < 0,
  // sequence is not in [0, batch_size), block_size < 1 or size() < block_size + 2.
  int64_t window_start(int64_t step, int64_t sequence, int64_t batch_size,
                       int64_t block_size) const;

  // Global sequences [range.first, range.first + range.count) of step `step`.
  Batch sequences(int64_t step, int64_t batch_size, int64_t block_size, SequenceRange range) const;
  // The whole global batch of step `step`.
  Batch batch(int64_t step, int64_t batch_size, int64_t block_size) const {
    return sequences(step, batch_size, block_size, {0, batch_size});
  }
  // Rank `rank` of `world`'s part of the global batch of step `step`.
  Batch rank_batch(int64_t step, int64_t batch_size, int64_t block_size, int rank,
                   int world) const {
    return sequences(step, batch_size, block_size, rank_sequences(batch_size, rank, world));
  }

 private:
  // Throws unless batch_size >= 1, block_size >= 1 and size() >= block_size + 2.
  void check_shape(int64_t batch_size, int64_t block_size) const;

  std::vector<int32_t> tokens_;
  int64_t vocab_size_;
  std::string description_;
};

}  // namespace weft::train
