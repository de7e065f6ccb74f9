// c10d's habits on weft's ProcessGroup (weft/process_group.h; docs/process-groups.md, "Coming
// from c10d"): the default group and its module-level helpers, send/recv to oneself,
// batch_isend_irecv and all_to_all_single under c10d's names, monitored_barrier through the
// store, and the object collectives on byte strings. Everything here is built from the group's
// public collectives and its store; nothing reaches a backend directly.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/process_group.h"

#include "runtime/argument_checks.h"
#include "runtime/cuda_runtime.h"
#include "runtime/process_group_state.h"

namespace weft {

// ---- The default group.

namespace {

std::mutex default_mutex;
std::weak_ptr<ProcessGroup> default_weak;  // guarded by default_mutex

// The default group if it is alive, else nullptr (destroy() forgets it: forget_default_group).
// REQUIRES: default_mutex held.
std::shared_ptr<ProcessGroup> live_default() { return default_weak.lock(); }

std::shared_ptr<ProcessGroup> group_or_default(const std::shared_ptr<ProcessGroup>& group) {
  return group != nullptr ? group : default_group();
}

}  // namespace

void offer_default_group(const std::shared_ptr<ProcessGroup>& group) {
  std::lock_guard<std::mutex> lock(default_mutex);
  if (live_default() == nullptr) default_weak = group;
}

void forget_default_group(const ProcessGroup* group) {
  std::lock_guard<std::mutex> lock(default_mutex);
  if (live_default().get() == group) default_weak.reset();
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(default_mutex);
  return live_default() != nullptr;
}

std::shared_ptr<ProcessGroup> default_group() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(default_mutex);
    group = live_default();
  }
  if (group == nullptr) {
    throw_error(ErrorCode::InvalidArgument, "default process group",
                "there is none: call weft::init_process_group() first (and keep the group it "
                "returns: weft does not keep the default group alive for you)");
  }
  return group;
}

int get_rank(const std::shared_ptr<ProcessGroup>& group) { return group_or_default(group)->rank(); }

int get_world_size(const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->size();
}

void destroy_process_group(const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->destroy();  // destroy() forgets it as the default
}

// ---- send/recv to oneself.

std::shared_ptr<Work> post_to_self(ProcessGroup::State& s, bool sending, Tensor tensor,
                                   uint64_t tag) {
  const std::string_view op = sending ? "send" : "recv";
  ErrorContext where = s.context(op, 0,
                                 fmt::format("{} x {}, {} self tag {}", dtype_name(tensor.dtype),
                                             tensor.count, sending ? "to" : "from", tag));
  SelfMessage mine{tensor, std::make_shared<Work>(where, s.timeout)};
  SelfMessage other;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.check_usable(op);
    if (s.aborted) {
      return Work::failed(
          where, std::make_exception_ptr(Error(ErrorCode::Aborted, where, s.abort_reason)));
    }
    auto& theirs = sending ? s.self_recvs : s.self_sends;
    auto it = theirs.find(tag);
    if (it == theirs.end() || it->second.empty()) {
      (sending ? s.self_sends : s.self_recvs)[tag].push_back(mine);
      return mine.work;
    }
    other = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) theirs.erase(it);
  }
  const SelfMessage& send = sending ? mine : other;
  const SelfMessage& recv = sending ? other : mine;
  if (send.tensor.dtype != recv.tensor.dtype || send.tensor.count != recv.tensor.count ||
      send.tensor.device != recv.tensor.device) {
    const std::string detail = fmt::format(
        "send to self and recv from self with tag {} disagree: the send has {}, the recv {}", tag,
        describe(send.tensor), describe(recv.tensor));
    send.work->fail(
        std::make_exception_ptr(Error(ErrorCode::InvalidArgument, send.work->context(), detail)));
    recv.work->fail(
        std::make_exception_ptr(Error(ErrorCode::InvalidArgument, recv.work->context(), detail)));
    return mine.work;
  }
  try {
    if (send.tensor.count > 0 && send.tensor.device.kind == DeviceKind::Cuda) {
      // On the legacy default stream, which waits for what blocking streams queued before it.
      cuda_runtime().copy(recv.tensor.data, send.tensor.data, send.tensor.nbytes());
    } else if (send.tensor.count > 0) {
      std::memmove(recv.tensor.data, send.tensor.data, send.tensor.nbytes());
    }
  } catch (...) {
    send.work->fail(std::current_exception());
    recv.work->fail(std::current_exception());
    return mine.work;
  }
  send.work->complete();
  recv.work->complete();
  return mine.work;
}

void fail_self_messages(ProcessGroup::State& s, std::exception_ptr error) {
  std::vector<std::shared_ptr<Work>> works;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto* queues : {&s.self_sends, &s.self_recvs}) {
      for (auto& [tag, queue] : *queues) {
        for (SelfMessage& m : queue) works.push_back(std::move(m.work));
      }
      queues->clear();
    }
  }
  for (auto& work : works) work->fail(error);
}

// ---- c10d's names.

std::vector<std::shared_ptr<Work>> ProcessGroup::batch_isend_irecv(std::vector<P2POp> ops) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->coalescing) {
      ArgumentChecker(*state_, "batch_isend_irecv")
          .fail("called between start_coalescing() and end_coalescing(): a unit does not nest");
    }
  }
  std::vector<std::shared_ptr<Work>> works;
  if (ops.empty()) return works;
  start_coalescing();
  try {
    for (const P2POp& op : ops) {
      works.push_back(op.kind == P2POp::Send ? send(op.tensor, op.peer, op.tag)
                                             : recv(op.tensor, op.peer, op.tag));
    }
  } catch (...) {
    // A refused op: post what was recorded (every rank refuses alike) and report the refusal.
    end_coalescing();
    throw;
  }
  end_coalescing();
  return works;
}

std::shared_ptr<Work> ProcessGroup::all_to_all_single(Tensor output, Tensor input,
                                                      std::vector<size_t> output_splits,
                                                      std::vector<size_t> input_splits) {
  return all_to_all(output, input, std::move(output_splits), std::move(input_splits));
}

// ---- monitored_barrier.

namespace {

std::string key_of(uint64_t n, std::string_view what) {
  return fmt::format("monitored_barrier/{}/{}", n, what);
}

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

void ProcessGroup::monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks) {
  State& s = *state_;
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.check_usable("monitored_barrier");
    n = ++s.monitored_barriers;
  }
  if (timeout.count() < 0) {
    throw Error(ErrorCode::InvalidArgument, s.context("monitored_barrier", n),
                fmt::format("timeout {} ms is negative", timeout.count()));
  }
  if (timeout.count() == 0) timeout = s.timeout;
  const ErrorContext where = s.context("monitored_barrier", n);
  if (s.size == 1) return;
  Store& store = *s.store;
  if (s.rank != 0) {
    store.set(key_of(n, fmt::format("arrived/{}", s.rank)), Bytes{1});
    Bytes result;
    try {
      // Rank 0 answers at most `timeout` after its own arrival; give it that once more.
      result = store.get(key_of(n, "result"), 2 * timeout);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Timeout) throw;
      throw Error(ErrorCode::Timeout, where,
                  fmt::format("rank 0 did not report within {} ms: rank 0 did not arrive",
                              2 * timeout.count()));
    }
    if (!result.empty()) {
      throw Error(ErrorCode::Timeout, where, std::string(result.begin(), result.end()));
    }
    return;
  }
  // Rank 0: wait for everyone, then name who is missing.
  std::vector<std::string> keys;
  for (int r = 1; r < s.size; ++r) keys.push_back(key_of(n, fmt::format("arrived/{}", r)));
  std::vector<int> missing;
  try {
    store.wait(keys, timeout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout) throw;
    for (int r = 1; r < s.size; ++r) {
      if (!store.check({keys[r - 1]})) {
        missing.push_back(r);
        if (!wait_all_ranks) break;
      }
    }
  }
  std::string failure;
  if (!missing.empty()) {
    failure = fmt::format(
        "{} did not arrive within {} ms{}", rank_list(missing), timeout.count(),
        wait_all_ranks ? "" : " (the first one missing; wait_all_ranks=true names all)");
  }
  store.set(key_of(n, "result"), Bytes(failure.begin(), failure.end()));
  // Every rank has read barrier n - 1's result before it arrived at n: those keys may go.
  if (missing.empty() && n > 1) {
    store.delete_key(key_of(n - 1, "result"));
    for (int r = 1; r < s.size; ++r) store.delete_key(key_of(n - 1, fmt::format("arrived/{}", r)));
  }
  if (!failure.empty()) throw Error(ErrorCode::Timeout, where, failure);
}

// ---- Object collectives.

namespace {

// Sizes as the int64 elements they travel as.
std::vector<int64_t> sizes_of(const std::vector<Bytes>& objects) {
  std::vector<int64_t> sizes;
  for (const Bytes& b : objects) sizes.push_back(static_cast<int64_t>(b.size()));
  return sizes;
}

// `blob` cut into objects of `sizes`, each block starting `stride` bytes after the previous one
// (0: packed).
std::vector<Bytes> cut(const Bytes& blob, const std::vector<int64_t>& sizes, size_t stride = 0) {
  std::vector<Bytes> out;
  size_t offset = 0;
  for (int64_t size : sizes) {
    out.emplace_back(blob.begin() + offset, blob.begin() + offset + size);
    offset += stride != 0 ? stride : static_cast<size_t>(size);
  }
  return out;
}

}  // namespace

std::vector<Bytes> ProcessGroup::all_gather_object(const Bytes& object) {
  const auto p = static_cast<size_t>(size());
  std::vector<int64_t> sizes(p);
  const int64_t mine = static_cast<int64_t>(object.size());
  all_gather_into_tensor(Tensor::of(sizes.data(), p), Tensor::of(&mine, 1))->wait();
  std::vector<size_t> counts(sizes.begin(), sizes.end());
  Bytes blob(std::accumulate(counts.begin(), counts.end(), size_t{0}));
  all_gather_uneven(Tensor::of(blob.data(), blob.size()), Tensor::of(object.data(), object.size()),
                    counts)
      ->wait();
  return cut(blob, sizes);
}

void ProcessGroup::broadcast_object_list(std::vector<Bytes>& objects, int root) {
  ArgumentChecker(*state_, "broadcast_object_list").root(root);
  int64_t n = rank() == root ? static_cast<int64_t>(objects.size()) : 0;
  broadcast(Tensor::of(&n, 1), root)->wait();
  std::vector<int64_t> sizes = rank() == root ? sizes_of(objects) : std::vector<int64_t>(n);
  broadcast(Tensor::of(sizes.data(), sizes.size()), root)->wait();
  Bytes blob;
  if (rank() == root) {
    for (const Bytes& b : objects) blob.insert(blob.end(), b.begin(), b.end());
  } else {
    blob.resize(std::accumulate(sizes.begin(), sizes.end(), size_t{0}));
  }
  broadcast(Tensor::of(blob.data(), blob.size()), root)->wait();
  if (rank() != root) objects = cut(blob, sizes);
}

std::vector<Bytes> ProcessGroup::gather_object(const Bytes& object, int root) {
  ArgumentChecker(*state_, "gather_object").root(root);
  const auto p = static_cast<size_t>(size());
  std::vector<int64_t> sizes(p);
  const int64_t mine = static_cast<int64_t>(object.size());
  all_gather_into_tensor(Tensor::of(sizes.data(), p), Tensor::of(&mine, 1))->wait();
  const auto block = static_cast<size_t>(*std::max_element(sizes.begin(), sizes.end()));
  Bytes padded(block);
  std::copy(object.begin(), object.end(), padded.begin());
  Bytes blob(rank() == root ? block * p : 0);
  gather_into_tensor(Tensor::of(blob.data(), blob.size()), Tensor::of(padded.data(), block), root)
      ->wait();
  if (rank() != root) return {};
  return cut(blob, sizes, block);
}

Bytes ProcessGroup::scatter_object_list(const std::vector<Bytes>& objects, int root) {
  ArgumentChecker check(*state_, "scatter_object_list");
  check.root(root);
  const auto p = static_cast<size_t>(size());
  if (rank() == root && objects.size() != p) {
    check.fail(fmt::format("objects has {} entries on root; expected one per rank ({})",
                           objects.size(), p));
  }
  std::vector<int64_t> sizes = rank() == root ? sizes_of(objects) : std::vector<int64_t>(p);
  broadcast(Tensor::of(sizes.data(), p), root)->wait();
  const auto block = static_cast<size_t>(*std::max_element(sizes.begin(), sizes.end()));
  Bytes blob;
  if (rank() == root) {
    blob.resize(block * p);
    for (size_t r = 0; r < p; ++r)
      std::copy(objects[r].begin(), objects[r].end(), blob.begin() + r * block);
  }
  Bytes mine(block);
  scatter_from_tensor(Tensor::of(mine.data(), block), Tensor::of(blob.data(), blob.size()), root)
      ->wait();
  mine.resize(static_cast<size_t>(sizes[static_cast<size_t>(rank())]));
  return mine;
}

}  // namespace weft
