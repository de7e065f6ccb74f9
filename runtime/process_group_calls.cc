// Each collective of ProcessGroup: its argument checks (runtime/argument_checks.h), the
// Collective it describes, and the staging of scattered lists (runtime/staging.h), then the
// shared submit path (process_group.cc).
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weft/process_group.h"

#include "runtime/argument_checks.h"
#include "runtime/process_group_state.h"
#include "runtime/staging.h"

namespace weft {

std::shared_ptr<Work> ProcessGroup::all_reduce(Tensor tensor, ReduceOp op) {
  return all_reduce(tensor, tensor, op);
}

std::shared_ptr<Work> ProcessGroup::all_reduce(Tensor input, Tensor output, ReduceOp op) {
  ArgumentChecker check(*state_, "all_reduce");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.count(output, input.count, "output", "same as input");
  check.op(input.dtype, op);
  Collective c;
  c.kind = CollectiveKind::AllReduce;
  c.inputs = {input};
  c.outputs = {output};
  c.op = op;
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::reduce(Tensor tensor, int root, ReduceOp op) {
  return reduce(tensor, tensor, root, op);
}

std::shared_ptr<Work> ProcessGroup::reduce(Tensor input, Tensor output, int root, ReduceOp op) {
  ArgumentChecker check(*state_, "reduce");
  check.root(root);
  check.tensor(input, "input");
  check.op(input.dtype, op);
  Collective c;
  c.kind = CollectiveKind::Reduce;
  c.inputs = {input};
  c.op = op;
  c.root = root;
  if (rank() == root) {
    check.tensor(output, "output");
    check.same_kind(output, input, "output", "input");
    check.count(output, input.count, "output", "same as input");
    c.outputs = {output};
  }
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::broadcast(Tensor tensor, int root) {
  ArgumentChecker check(*state_, "broadcast");
  check.root(root);
  check.tensor(tensor, "tensor");
  Collective c;
  c.kind = CollectiveKind::Broadcast;
  if (rank() == root) c.inputs = {tensor};
  c.outputs = {tensor};
  c.root = root;
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::all_gather(std::vector<Tensor> outputs, Tensor input) {
  ArgumentChecker check(*state_, "all_gather");
  check.tensor(input, "input");
  check.list(outputs, "outputs");
  std::vector<size_t> counts;
  for (int r = 0; r < size(); ++r) {
    const std::string name = fmt::format("outputs[{}]", r);
    check.tensor(outputs[r], name);
    check.same_kind(outputs[r], input, name, "input");
    counts.push_back(outputs[r].count);
  }
  check.count(input, counts[rank()], "input", "the size of this rank's entry in outputs");
  Collective c;
  c.kind = CollectiveKind::AllGather;
  c.counts = counts;
  c.inputs = {input};
  if (std::optional<Tensor> whole = as_contiguous(outputs)) {
    c.outputs = {*whole};
    return submit(*state_, std::move(c));
  }
  auto [staged, copy_out] = stage_out(*state_->staging, outputs, input);
  c.outputs = {staged};
  return submit(*state_, std::move(c), std::move(copy_out));
}

std::shared_ptr<Work> ProcessGroup::all_gather_into_tensor(Tensor output, Tensor input) {
  ArgumentChecker check(*state_, "all_gather_into_tensor");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.count(output, check.per_rank(input.count, "input.count"), "output", "size() * input.count");
  Collective c;
  c.kind = CollectiveKind::AllGather;
  c.counts.assign(size(), input.count);
  c.inputs = {input};
  c.outputs = {output};
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::all_gather_uneven(Tensor output, Tensor input,
                                                      std::vector<size_t> counts) {
  ArgumentChecker check(*state_, "all_gather_uneven");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.counts(counts, "counts");
  check.count(input, counts[rank()], "input", "counts[rank()]");
  check.count(output, check.sum(counts, "counts"), "output",
              "sum of counts " + join_counts(counts));
  Collective c;
  c.kind = CollectiveKind::AllGather;
  c.counts = std::move(counts);
  c.inputs = {input};
  c.outputs = {output};
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(Tensor output, std::vector<Tensor> inputs,
                                                   ReduceOp op) {
  ArgumentChecker check(*state_, "reduce_scatter");
  check.tensor(output, "output");
  check.list(inputs, "inputs");
  check.op(output.dtype, op);
  for (int r = 0; r < size(); ++r) {
    const std::string name = fmt::format("inputs[{}]", r);
    check.tensor(inputs[r], name);
    check.same_kind(inputs[r], output, name, "output");
    check.count(inputs[r], output.count, name, "same as output");
  }
  Collective c;
  c.kind = CollectiveKind::ReduceScatter;
  c.counts.assign(size(), output.count);
  c.outputs = {output};
  c.op = op;
  if (std::optional<Tensor> whole = as_contiguous(inputs)) {
    c.inputs = {*whole};
    return submit(*state_, std::move(c));
  }
  auto [lease, staged] = stage_in(*state_->staging, inputs, output);
  c.inputs = {staged};
  return submit(*state_, std::move(c), [lease] {});
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_tensor(Tensor output, Tensor input,
                                                          ReduceOp op) {
  ArgumentChecker check(*state_, "reduce_scatter_tensor");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.count(input, check.per_rank(output.count, "output.count"), "input",
              "size() * output.count");
  check.op(input.dtype, op);
  Collective c;
  c.kind = CollectiveKind::ReduceScatter;
  c.counts.assign(size(), output.count);
  c.inputs = {input};
  c.outputs = {output};
  c.op = op;
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_uneven(Tensor output, Tensor input,
                                                          std::vector<size_t> counts, ReduceOp op) {
  ArgumentChecker check(*state_, "reduce_scatter_uneven");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  check.counts(counts, "counts");
  check.count(output, counts[rank()], "output", "counts[rank()]");
  check.count(input, check.sum(counts, "counts"), "input", "sum of counts " + join_counts(counts));
  check.op(input.dtype, op);
  Collective c;
  c.kind = CollectiveKind::ReduceScatter;
  c.counts = std::move(counts);
  c.inputs = {input};
  c.outputs = {output};
  c.op = op;
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::gather(std::vector<Tensor> outputs, Tensor input, int root) {
  ArgumentChecker check(*state_, "gather");
  check.root(root);
  check.tensor(input, "input");
  if (rank() != root) {
    if (!outputs.empty()) check.fail("outputs must be empty on ranks other than root");
    Collective c;
    c.kind = CollectiveKind::Gather;
    c.inputs = {input};
    c.root = root;
    return submit(*state_, std::move(c));
  }
  check.list(outputs, "outputs");
  for (int r = 0; r < size(); ++r) {
    const std::string name = fmt::format("outputs[{}]", r);
    check.tensor(outputs[r], name);
    check.same_kind(outputs[r], input, name, "input");
    check.count(outputs[r], input.count, name, "same as input");
  }
  Collective c;
  c.kind = CollectiveKind::Gather;
  c.inputs = {input};
  c.root = root;
  if (std::optional<Tensor> whole = as_contiguous(outputs)) {
    c.outputs = {*whole};
    return submit(*state_, std::move(c));
  }
  auto [staged, copy_out] = stage_out(*state_->staging, outputs, input);
  c.outputs = {staged};
  return submit(*state_, std::move(c), std::move(copy_out));
}

std::shared_ptr<Work> ProcessGroup::gather_into_tensor(Tensor output, Tensor input, int root) {
  ArgumentChecker check(*state_, "gather_into_tensor");
  check.root(root);
  check.tensor(input, "input");
  Collective c;
  c.kind = CollectiveKind::Gather;
  c.inputs = {input};
  c.root = root;
  if (rank() == root) {
    check.tensor(output, "output");
    check.same_kind(output, input, "output", "input");
    check.count(output, check.per_rank(input.count, "input.count"), "output",
                "size() * input.count");
    c.outputs = {output};
  }
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::scatter(Tensor output, std::vector<Tensor> inputs, int root) {
  ArgumentChecker check(*state_, "scatter");
  check.root(root);
  check.tensor(output, "output");
  Collective c;
  c.kind = CollectiveKind::Scatter;
  c.outputs = {output};
  c.root = root;
  if (rank() != root) {
    if (!inputs.empty()) check.fail("inputs must be empty on ranks other than root");
    return submit(*state_, std::move(c));
  }
  check.list(inputs, "inputs");
  for (int r = 0; r < size(); ++r) {
    const std::string name = fmt::format("inputs[{}]", r);
    check.tensor(inputs[r], name);
    check.same_kind(inputs[r], output, name, "output");
    check.count(inputs[r], output.count, name, "same as output");
  }
  if (std::optional<Tensor> whole = as_contiguous(inputs)) {
    c.inputs = {*whole};
    return submit(*state_, std::move(c));
  }
  auto [lease, staged] = stage_in(*state_->staging, inputs, output);
  c.inputs = {staged};
  return submit(*state_, std::move(c), [lease] {});
}

std::shared_ptr<Work> ProcessGroup::scatter_from_tensor(Tensor output, Tensor input, int root) {
  ArgumentChecker check(*state_, "scatter_from_tensor");
  check.root(root);
  check.tensor(output, "output");
  Collective c;
  c.kind = CollectiveKind::Scatter;
  c.outputs = {output};
  c.root = root;
  if (rank() == root) {
    check.tensor(input, "input");
    check.same_kind(input, output, "input", "output");
    check.count(input, check.per_rank(output.count, "output.count"), "input",
                "size() * output.count");
    c.inputs = {input};
  }
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::all_to_all(Tensor output, Tensor input) {
  return all_to_all(output, input, {}, {});
}

std::shared_ptr<Work> ProcessGroup::all_to_all(Tensor output, Tensor input,
                                               std::vector<size_t> output_splits,
                                               std::vector<size_t> input_splits) {
  ArgumentChecker check(*state_, "all_to_all");
  check.tensor(input, "input");
  check.tensor(output, "output");
  check.same_kind(output, input, "output", "input");
  const size_t p = size();
  if (input_splits.empty()) {
    if (input.count % p != 0) {
      check.fail(
          fmt::format("input has {} elements, not a multiple of the group size {} (pass "
                      "input_splits for uneven blocks)",
                      input.count, p));
    }
    input_splits.assign(p, input.count / p);
  }
  if (output_splits.empty()) {
    if (output.count % p != 0) {
      check.fail(
          fmt::format("output has {} elements, not a multiple of the group size {} (pass "
                      "output_splits for uneven blocks)",
                      output.count, p));
    }
    output_splits.assign(p, output.count / p);
  }
  check.counts(input_splits, "input_splits");
  check.counts(output_splits, "output_splits");
  check.count(input, check.sum(input_splits, "input_splits"), "input",
              "sum of input_splits " + join_counts(input_splits));
  check.count(output, check.sum(output_splits, "output_splits"), "output",
              "sum of output_splits " + join_counts(output_splits));
  if (input_splits[rank()] != output_splits[rank()]) {
    check.fail(
        fmt::format("input_splits[{0}] = {1} but output_splits[{0}] = {2}: what a rank "
                    "sends itself must equal what it receives from itself",
                    rank(), input_splits[rank()], output_splits[rank()]));
  }
  if (same_memory(input, output) && input_splits != output_splits) {
    check.fail("in-place all_to_all needs equal input and output splits");
  }
  Collective c;
  c.kind = CollectiveKind::AllToAll;
  c.inputs = {input};
  c.outputs = {output};
  c.send_counts = std::move(input_splits);
  c.recv_counts = std::move(output_splits);
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  Collective c;
  c.kind = CollectiveKind::Barrier;
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::send(Tensor tensor, int dst, uint64_t tag) {
  ArgumentChecker check(*state_, "send");
  check.root(dst, "dst");
  if (tag > kMaxTag) check.fail(fmt::format("tag {} is above the largest, {}", tag, kMaxTag));
  check.tensor(tensor, "tensor");
  if (dst == rank()) return post_to_self(*state_, true, tensor, tag);
  Collective c;
  c.kind = CollectiveKind::Send;
  c.inputs = {tensor};
  c.peer = dst;
  c.tag = tag;
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::recv(Tensor tensor, int src, uint64_t tag) {
  ArgumentChecker check(*state_, "recv");
  check.root(src, "src");
  if (tag > kMaxTag) check.fail(fmt::format("tag {} is above the largest, {}", tag, kMaxTag));
  check.tensor(tensor, "tensor");
  if (src == rank()) return post_to_self(*state_, false, tensor, tag);
  Collective c;
  c.kind = CollectiveKind::Recv;
  c.outputs = {tensor};
  c.peer = src;
  c.tag = tag;
  return submit(*state_, std::move(c));
}

std::shared_ptr<Work> ProcessGroup::recv_any(Tensor tensor, uint64_t tag) {
  ArgumentChecker check(*state_, "recv");
  if (tag > kMaxTag) check.fail(fmt::format("tag {} is above the largest, {}", tag, kMaxTag));
  check.tensor(tensor, "tensor");
  if (size() == 1)
    check.fail("a receive from any source needs another rank, and this group has one");
  Collective c;
  c.kind = CollectiveKind::Recv;
  c.outputs = {tensor};
  c.peer = kAnySource;
  c.tag = tag;
  c.source = std::make_shared<int>(-1);
  return submit(*state_, std::move(c));
}

}  // namespace weft
