#include "fsdp/train/data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "weft/error.h"

#include "fsdp/train/input_file.h"

namespace weft::train {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian int32 and are read as is");

[[noreturn]] void invalid(std::string_view where, const std::string& detail) {
  throw_error(ErrorCode::InvalidArgument, where, detail);
}

uint64_t splitmix64_next(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

SequenceRange split(std::string_view where, int64_t total, int64_t index, int64_t parts,
                    const char* what, const char* whats) {
  if (parts < 1 || index < 0 || index >= parts) {
    invalid(where, fmt::format("{} {} of {}: need 0 <= {} < {}", what, index, parts, what, parts));
  }
  if (total % parts != 0) {
    invalid(where, fmt::format("{} sequences do not split evenly into {} {} ({} left over)", total,
                               parts, whats, total % parts));
  }
  const int64_t each = total / parts;
  return {index * each, each};
}

}  // namespace

std::vector<int32_t> synthetic_tokens(const SyntheticCorpus& corpus) {
  if (corpus.vocab_size < 1 || corpus.vocab_size > (int64_t{1} << 31) - 1) {
    invalid("synthetic corpus",
            fmt::format("vocab_size {} is not in [1, 2^31)", corpus.vocab_size));
  }
  if (corpus.n_tokens < 0) {
    invalid("synthetic corpus", fmt::format("n_tokens {} is negative", corpus.n_tokens));
  }
  const auto vocab = static_cast<uint64_t>(corpus.vocab_size);
  std::vector<int32_t> tokens(static_cast<size_t>(corpus.n_tokens));
  uint64_t state = corpus.seed;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint64_t r = splitmix64_next(state);
    uint64_t token;
    if (i >= 1 && (r >> 62) != 0) {
      token = (3 * static_cast<uint64_t>(tokens[i - 1]) + 1) % vocab;
    } else {
      token = (r & 0xFFFFFFFFull) % vocab;
    }
    tokens[i] = static_cast<int32_t>(token);
  }
  return tokens;
}

Batch Batch::rows(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > sequences) {
    invalid("batch rows",
            fmt::format("rows [{}, {}) of a {}-sequence batch", first, first + count, sequences));
  }
  Batch out;
  out.first_sequence = first_sequence + first;
  out.sequences = count;
  out.block_size = block_size;
  const auto begin = static_cast<ptrdiff_t>(first * block_size);
  const auto end = static_cast<ptrdiff_t>((first + count) * block_size);
  out.inputs.assign(inputs.begin() + begin, inputs.begin() + end);
  out.targets.assign(targets.begin() + begin, targets.begin() + end);
  return out;
}

SequenceRange rank_sequences(int64_t batch_size, int rank, int world) {
  return split("rank batch", batch_size, rank, world, "rank", "ranks");
}

SequenceRange micro_batch_sequences(int64_t sequences, int64_t index, int64_t n_micro) {
  return split("micro-batch", sequences, index, n_micro, "micro-batch", "micro-batches");
}

Batch micro_batch(const Batch& batch, int64_t index, int64_t n_micro) {
  const SequenceRange range = micro_batch_sequences(batch.sequences, index, n_micro);
  return batch.rows(range.first, range.count);
}

TokenSource::TokenSource(std::vector<int32_t> tokens, int64_t vocab_size, std::string description)
    : tokens_(std::move(tokens)), vocab_size_(vocab_size), description_(std::move(description)) {
  if (vocab_size_ < 1) {
    invalid(description_, fmt::format("vocab_size {} is not positive", vocab_size_));
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] < 0 || tokens_[i] >= vocab_size_) {
      invalid(description_, fmt::format("token {} at index {} is outside [0, {}) (vocab_size)",
                                        tokens_[i], i, vocab_size_));
    }
  }
}

TokenSource TokenSource::from_file(const std::string& path, int64_t vocab_size) {
  const std::string where = fmt::format("token file \"{}\"", path);
  const auto io_error = [&](const char* what) {
    throw_error(ErrorCode::Io, where, fmt::format("{}: {}", what, std::strerror(errno)));
  };
  int64_t size = 0;
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } file{open_regular_file(path, where, &size)};
  if (size % 4 != 0) {
    invalid(where, fmt::format("{} bytes is not a whole number of int32 tokens", size));
  }
  std::vector<int32_t> tokens(static_cast<size_t>(size) / 4);
  auto* bytes = reinterpret_cast<char*>(tokens.data());
  const size_t total = tokens.size() * 4;
  for (size_t done = 0; done < total;) {
    const ssize_t n = ::read(file.fd, bytes + done, total - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_error("read");
    if (n == 0) {
      invalid(where, fmt::format("ended after {} of the {} bytes fstat gave", done, total));
    }
    done += static_cast<size_t>(n);
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  return TokenSource(std::move(tokens), vocab_size, fmt::format("{} ({} tokens)", where, n));
}

TokenSource TokenSource::synthetic(const SyntheticCorpus& corpus) {
  return TokenSource(synthetic_tokens(corpus), corpus.vocab_size,
                     fmt::format("synthetic corpus ({} tokens, vocab {}, seed {})", corpus.n_tokens,
                                 corpus.vocab_size, corpus.seed));
}

void TokenSource::check_shape(int64_t batch_size, int64_t block_size) const {
  if (block_size < 1 || batch_size < 1) {
    invalid(description_, fmt::format("batch_size {} and block_size {} must be positive",
                                      batch_size, block_size));
  }
  if (size() < block_size + 2) {
    invalid(description_, fmt::format("{} tokens: too few for windows of block_size + 1 = {} "
                                      "(need at least block_size + 2)",
                                      size(), block_size + 1));
  }
}

int64_t TokenSource::window_start(int64_t step, int64_t sequence, int64_t batch_size,
                                  int64_t block_size) const {
  check_shape(batch_size, block_size);
  if (step < 0 || sequence < 0 || sequence >= batch_size) {
    invalid(description_, fmt::format("step {} sequence {}: need step >= 0 and 0 <= sequence < "
                                      "batch_size {}",
                                      step, sequence, batch_size));
  }
  // The exact value mod n - block_size - 1, as Python's integers give it: the product passes
  // 2^63 in a long enough run, so it is reduced in 128 bits, where neither factor overflows.
  const auto mod = static_cast<unsigned __int128>(size() - block_size - 1);
  const auto index = static_cast<unsigned __int128>(step) * static_cast<uint64_t>(batch_size) +
                     static_cast<uint64_t>(sequence);
  return static_cast<int64_t>((index % mod) * static_cast<uint64_t>(block_size) % mod);
}

Batch TokenSource::sequences(int64_t step, int64_t batch_size, int64_t block_size,
                             SequenceRange range) const {
  check_shape(batch_size, block_size);
  if (range.first < 0 || range.count < 0 || range.first + range.count > batch_size) {
    invalid(description_, fmt::format("sequences [{}, {}) of a global batch of {}", range.first,
                                      range.first + range.count, batch_size));
  }
  Batch out;
  out.first_sequence = range.first;
  out.sequences = range.count;
  out.block_size = block_size;
  out.inputs.resize(static_cast<size_t>(range.count * block_size));
  out.targets.resize(out.inputs.size());
  for (int64_t row = 0; row < range.count; ++row) {
    const int64_t start = window_start(step, range.first + row, batch_size, block_size);
    const int32_t* window = tokens_.data() + start;
    std::memcpy(out.inputs.data() + row * block_size, window, block_size * sizeof(int32_t));
    std::memcpy(out.targets.data() + row * block_size, window + 1, block_size * sizeof(int32_t));
  }
  return out;
}

}  // namespace weft::train
