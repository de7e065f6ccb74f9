// tests/hosts/symmetric_check.cc: one rank of the symmetric-buffer check across namespace hosts
// (tests/hosts/multi_host_test.py, case "symmetric"), written against the public API only.
//
// Every rank allocates one symmetric buffer of the world and places every tensor of every call in
// it, at the same offsets on every rank: all_reduce, reduce_scatter_tensor and
// all_gather_into_tensor in and out of place, broadcast from every root, for float32 sum and
// int32 max and sum, at 0, a few, 1000 and over 1 MiB of elements, each at a 64-byte line and one
// element past it (off the 8-byte grid for these 4-byte types). Those run zero-copy,
// hierarchically (docs/symmetric-memory.md); a reduce and an all_to_all on the same buffer take
// the message path. Every output element is checked against a closed form, and the element just
// past each output must keep its sentinel. Then the flight recorder is dumped (weft::dump_trace)
// and its files named on stdout ("trace <path>"), for the test to check which algorithm ran
// each call; the last line is "symmetric check ok <calls>".
//
// A wrong element ends the program with exit 5 after "MISMATCH ..."; a weft::Error with exit 3
// after "ERROR <Code>: <message>".
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/process_group.h"
#include "weft/symmetric_buffer.h"
#include "weft/work.h"

namespace {

// Per rank: the largest all_gather output (6 ranks x 262147 floats) and its input fit twice.
constexpr size_t kBufferBytes = size_t{16} << 20;
constexpr size_t kLine = 64;

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// Rank r's element i of call `call`: small integers, exact in float32 summed over any order.
int64_t value(int rank, size_t i, int call) {
  const size_t mixed = static_cast<size_t>(rank) * 7 + i * 13 + static_cast<size_t>(call) * 5 + 3;
  return static_cast<int64_t>(mixed % 17) - 8;
}

template <typename T>
T sentinel() {
  return std::is_floating_point_v<T> ? static_cast<T>(-12345.5) : static_cast<T>(0x5a5a5a5a);
}

struct Check {
  weft::ProcessGroup& world;
  weft::SymmetricBuffer& buffer;
  int calls = 0;  // collectives issued with more than 0 elements, zero-copy or not

  int rank() const { return world.rank(); }
  int size() const { return world.size(); }

  template <typename T>
  T* at(size_t offset_bytes) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(buffer.data()) + offset_bytes);
  }

  template <typename T>
  weft::Tensor tensor(size_t offset_bytes, size_t count) const {
    return buffer.view(weft::dtype_of_v<T>, offset_bytes, count);
  }

  template <typename T>
  void expect(const T* got, size_t count, const std::string& what, auto&& want) {
    for (size_t i = 0; i < count; ++i) {
      const T w = static_cast<T>(want(i));
      if (got[i] != w) {
        say(fmt::format("MISMATCH rank {}/{}: {}: element {} of {} is {}, not {}", rank(), size(),
                        what, i, count, got[i], w));
        std::exit(5);
      }
    }
    if (got[count] != sentinel<T>()) {
      say(fmt::format("MISMATCH rank {}/{}: {}: the element past the output was overwritten",
                      rank(), size(), what));
      std::exit(5);
    }
  }

  // The reduction over every rank of value(r, i, call).
  static int64_t reduced(weft::ReduceOp op, int size, size_t i, int call) {
    int64_t acc = value(0, i, call);
    for (int r = 1; r < size; ++r) {
      acc = op.kind == weft::ReduceOp::Max ? std::max(acc, value(r, i, call))
                                           : acc + value(r, i, call);
    }
    return acc;
  }

  template <typename T>
  void fill(T* p, size_t count, int r, int call, size_t first = 0) {
    for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(value(r, first + i, call));
  }

  template <typename T>
  void all_reduce(size_t count, size_t skew, bool in_place, weft::ReduceOp op,
                  const std::string& what) {
    const int call = calls;
    const size_t in_at = skew;
    const size_t out_at =
        in_place ? in_at : (in_at + count * sizeof(T) + kLine) / kLine * kLine + skew;
    T* in = at<T>(in_at);
    T* out = at<T>(out_at);
    std::fill(out, out + count + 1, sentinel<T>());
    fill(in, count, rank(), call);
    if (in_place) {
      world.all_reduce(tensor<T>(in_at, count), op)->wait();
    } else {
      world.all_reduce(tensor<T>(in_at, count), tensor<T>(out_at, count), op)->wait();
    }
    ++calls;
    expect(out, count, what, [&](size_t i) { return reduced(op, size(), i, call); });
  }

  template <typename T>
  void reduce_scatter(size_t block, size_t skew, bool in_place, weft::ReduceOp op,
                      const std::string& what) {
    const int call = calls;
    const size_t total = block * static_cast<size_t>(size());
    const size_t in_at = skew;
    const size_t out_at = in_place ? in_at + static_cast<size_t>(rank()) * block * sizeof(T)
                                   : (in_at + total * sizeof(T) + kLine) / kLine * kLine + skew;
    T* in = at<T>(in_at);
    fill(in, total, rank(), call);
    T* out = at<T>(out_at);
    // In place the element past the output is the next block of the input: keep it as filled.
    const T past = in_place ? out[block] : sentinel<T>();
    if (!in_place) std::fill(out, out + block + 1, sentinel<T>());
    world.reduce_scatter_tensor(tensor<T>(out_at, block), tensor<T>(in_at, total), op)->wait();
    ++calls;
    const size_t first = static_cast<size_t>(rank()) * block;
    if (in_place) {
      // expect() wants the sentinel past the output: check the next block's first element here.
      if (out[block] != past) {
        say(fmt::format("MISMATCH rank {}/{}: {}: the input past this rank's block changed", rank(),
                        size(), what));
        std::exit(5);
      }
      const T keep = out[block];
      out[block] = sentinel<T>();
      expect(out, block, what, [&](size_t i) { return reduced(op, size(), first + i, call); });
      out[block] = keep;
    } else {
      expect(out, block, what, [&](size_t i) { return reduced(op, size(), first + i, call); });
    }
  }

  template <typename T>
  void all_gather(size_t block, size_t skew, bool in_place, const std::string& what) {
    const int call = calls;
    const size_t total = block * static_cast<size_t>(size());
    const size_t out_at = skew;
    const size_t in_at = in_place
                             ? out_at + static_cast<size_t>(rank()) * block * sizeof(T)
                             : (out_at + (total + 1) * sizeof(T) + kLine) / kLine * kLine + skew;
    T* out = at<T>(out_at);
    std::fill(out, out + total + 1, sentinel<T>());
    // Rank r's block is value(r, j, call) for j < block.
    fill(at<T>(in_at), block, rank(), call);
    world.all_gather_into_tensor(tensor<T>(out_at, total), tensor<T>(in_at, block))->wait();
    ++calls;
    expect(out, total, what, [&](size_t i) {
      return value(static_cast<int>(i / std::max<size_t>(block, 1)), i % std::max<size_t>(block, 1),
                   call);
    });
  }

  template <typename T>
  void broadcast(size_t count, size_t skew, int root, const std::string& what) {
    const int call = calls;
    T* data = at<T>(skew);
    std::fill(data, data + count + 1, sentinel<T>());
    if (rank() == root) fill(data, count, root, call);
    world.broadcast(tensor<T>(skew, count), root)->wait();
    ++calls;
    expect(data, count, what, [&](size_t i) { return value(root, i, call); });
  }

  // A reduce to rank 0: the message path across hosts, tensors in symmetric memory.
  void reduce(size_t count, const std::string& what) {
    const int call = calls;
    float* data = at<float>(0);
    fill(data, count, rank(), call);
    data[count] = sentinel<float>();
    world.reduce(tensor<float>(0, count), 0)->wait();
    ++calls;
    if (rank() == 0) {
      expect(data, count, what,
             [&](size_t i) { return reduced(weft::ReduceOp::Sum, size(), i, call); });
    }
  }
};

template <typename T>
void run_type(Check& check, const char* type, weft::ReduceOp op, const char* op_name) {
  const int size = check.size();
  for (size_t count : {size_t{0}, size_t{7}, size_t{1000}, size_t{300001}}) {
    for (size_t skew : {size_t{0}, kLine + sizeof(T)}) {
      for (bool in_place : {false, true}) {
        const std::string what = fmt::format("{} {} x {} at +{} {}", type, op_name, count, skew,
                                             in_place ? "in place" : "out of place");
        check.all_reduce<T>(count, skew, in_place, op, "all_reduce " + what);
        const size_t block = count / static_cast<size_t>(size) + (count > 0 ? 1 : 0);
        const std::string blocks = fmt::format("{} {} x {} per rank at +{} {}", type, op_name,
                                               block, skew, in_place ? "in place" : "out of place");
        check.reduce_scatter<T>(block, skew, in_place, op, "reduce_scatter " + blocks);
        if (op.kind == weft::ReduceOp::Sum) {
          check.all_gather<T>(block, skew, in_place, "all_gather " + blocks);
        }
      }
    }
  }
}

}  // namespace

int main() {
  try {
    auto world = weft::init_process_group();
    auto buffer = world->allocate_symmetric(kBufferBytes);
    Check check{*world, *buffer};
    run_type<float>(check, "float32", weft::ReduceOp::Sum, "sum");
    run_type<int32_t>(check, "int32", weft::ReduceOp::Max, "max");
    run_type<int32_t>(check, "int32", weft::ReduceOp::Sum, "sum");
    for (int root = 0; root < world->size(); ++root) {
      for (size_t count : {size_t{0}, size_t{5}, size_t{300001}}) {
        check.broadcast<float>(count, kLine + 4, root,
                               fmt::format("broadcast float32 x {} from {}", count, root));
      }
    }
    check.reduce(1000, "reduce float32 sum x 1000 to 0");
    for (const std::string& path : weft::dump_trace("symmetric check")) say("trace " + path);
    // Rank 0 may host the store: everyone leaves together.
    world->barrier()->wait();
    buffer->release();
    world->destroy();
    say(fmt::format("symmetric check ok {}", check.calls));
  } catch (const weft::Error& e) {
    say(fmt::format("ERROR {}: {}", weft::error_code_name(e.code()), e.what()));
    return 3;
  }
  return 0;
}
