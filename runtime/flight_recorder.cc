#include "runtime/flight_recorder.h"

#include <sys/syscall.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "weft/error.h"

#include "runtime/log.h"

namespace weft {
namespace {

// The caller's Linux thread id, asked of the kernel once per thread.
int32_t this_thread_id() {
  thread_local const int32_t tid = static_cast<int32_t>(syscall(SYS_gettid));
  return tid;
}

const char* state_name(uint8_t state) {
  switch (state) {
    case 0:
      return "queued";
    case 1:
      return "started";
    case 2:
      return "completed";
    default:
      return "failed";
  }
}

void raise_to(std::atomic<uint64_t>& value, uint64_t to) {
  uint64_t now = value.load(std::memory_order_relaxed);
  while (now < to && !value.compare_exchange_weak(now, to, std::memory_order_relaxed)) {
  }
}

uint64_t total_count(const std::vector<Tensor>& tensors) {
  uint64_t n = 0;
  for (const Tensor& t : tensors) n += t.count;
  return n;
}

bool has_reduce_op(CollectiveKind kind) {
  return kind == CollectiveKind::AllReduce || kind == CollectiveKind::Reduce ||
         kind == CollectiveKind::ReduceScatter;
}

bool has_root(CollectiveKind kind) {
  return kind == CollectiveKind::Reduce || kind == CollectiveKind::Broadcast ||
         kind == CollectiveKind::Gather || kind == CollectiveKind::Scatter;
}

}  // namespace

// A copy of one slot, read without tearing (FlightRecorder::read).
struct FlightRecorder::Entry {
  uint64_t id;
  uint64_t seq;
  uint64_t tag;
  uint64_t count_in;
  uint64_t count_out;
  int64_t queued_ns;
  int64_t started_ns;
  int64_t ended_ns;
  std::string_view algorithm;
  int32_t root;
  int32_t peer;
  int32_t thread;
  uint16_t fingerprint;
  uint8_t kind;
  uint8_t dtype;
  int16_t reduce_op;
  uint8_t state;
};

int64_t FlightRecorder::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Timestamps are taken three times per operation, and a wall-clock read (vDSO) costs ~25 ns
// here, most of the recorder's ~95 ns: where the CPU has an invariant TSC (x86 with
// constant_tsc and nonstop_tsc, the kernel's own clocksource on such machines) the recorder
// stores raw TSC ticks (~10 ns to read) and converts them to wall-clock nanoseconds only when a
// dump reads them, by the rate measured between the first stamp and the read.
namespace {

bool invariant_tsc() {
#if defined(__x86_64__)
  static const bool invariant = [] {
    std::FILE* cpuinfo = std::fopen("/proc/cpuinfo", "r");
    if (cpuinfo == nullptr) return false;
    char line[8192];
    bool constant = false, nonstop = false;
    while (std::fgets(line, sizeof line, cpuinfo) != nullptr) {
      if (std::strncmp(line, "flags", 5) != 0) continue;
      constant = std::strstr(line, " constant_tsc") != nullptr;
      nonstop = std::strstr(line, " nonstop_tsc") != nullptr;
      break;
    }
    std::fclose(cpuinfo);
    return constant && nonstop;
  }();
  return invariant;
#else
  return false;
#endif
}

int64_t read_ticks() {
#if defined(__x86_64__)
  return static_cast<int64_t>(__rdtsc());
#else
  return 0;
#endif
}

// The first stamp's tick count and wall-clock time: the origin of every conversion.
struct Epoch {
  int64_t ticks;
  int64_t ns;
};
const Epoch& epoch() {
  static const Epoch first{read_ticks(), FlightRecorder::now_ns()};
  return first;
}

}  // namespace

int64_t FlightRecorder::stamp() {
  if (!invariant_tsc()) return now_ns();
  static_cast<void>(epoch());
  return read_ticks();
}

int64_t FlightRecorder::stamp_to_ns(int64_t stamp) {
  if (stamp == 0 || !invariant_tsc()) return stamp;
  const Epoch& origin = epoch();
  int64_t ticks = read_ticks();
  int64_t ns = now_ns();
  // Too short a span gives a poor rate: measure over at least 20 ms (only a dump taken within
  // 20 ms of the process's first operation waits).
  if (ns - origin.ns < 20'000'000) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(20'000'000 - (ns - origin.ns)));
    ticks = read_ticks();
    ns = now_ns();
  }
  const double ns_per_tick =
      static_cast<double>(ns - origin.ns) / static_cast<double>(ticks - origin.ticks);
  return origin.ns + static_cast<int64_t>(static_cast<double>(stamp - origin.ticks) * ns_per_tick);
}

FlightRecorder::FlightRecorder(GroupInfo info, size_t capacity, FailureHook on_failure)
    : info_(std::move(info)),
      capacity_(capacity),
      on_failure_(std::move(on_failure)),
      slots_(std::make_unique<Slot[]>(capacity)) {
  WEFT_CHECK(capacity_ > 0, "a flight recorder needs room for at least one operation");
}

FlightRecorder::~FlightRecorder() = default;

uint64_t FlightRecorder::queued(const Collective& c, DType dtype, uint16_t fingerprint) {
  constexpr auto relaxed = std::memory_order_relaxed;
  const uint64_t id = next_id_.load(relaxed);
  Slot& s = *slot_of(id);
  // Retire the slot's previous occupant first, so that a reader never pairs its id with ours.
  s.id.store(kEmpty, relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.seq.store(c.seq, relaxed);
  s.tag.store(c.tag, relaxed);
  s.count_in.store(total_count(c.inputs), relaxed);
  s.count_out.store(total_count(c.outputs), relaxed);
  s.queued_ns.store(stamp(), relaxed);
  s.started_ns.store(0, relaxed);
  s.ended_ns.store(0, relaxed);
  s.algorithm.store(nullptr, relaxed);
  s.algorithm_length.store(0, relaxed);
  s.root.store(has_root(c.kind) ? c.root : -1, relaxed);
  const bool p2p = c.kind == CollectiveKind::Send || c.kind == CollectiveKind::Recv;
  s.peer.store(p2p ? c.peer : -1, relaxed);
  s.thread.store(this_thread_id(), relaxed);
  s.fingerprint.store(fingerprint, relaxed);
  s.kind.store(static_cast<uint8_t>(c.kind), relaxed);
  s.dtype.store(static_cast<uint8_t>(dtype), relaxed);
  s.reduce_op.store(has_reduce_op(c.kind) ? static_cast<int16_t>(c.op.kind) : int16_t{-1}, relaxed);
  s.state.store(static_cast<uint8_t>(State::Queued), relaxed);
  s.id.store(id, std::memory_order_release);
  next_id_.store(id + 1, std::memory_order_release);
  if (c.seq != 0 && !p2p) raise_to(last_queued_seq_, c.seq);
  return id;
}

void FlightRecorder::started(const TraceRef& trace) {
  const int64_t now = stamp();
  for (uint64_t id = trace.first; id < trace.first + trace.count; ++id) {
    Slot& s = *slot_of(id);
    if (s.id.load(std::memory_order_acquire) != id) continue;  // overwritten: see Limits
    s.started_ns.store(now, std::memory_order_relaxed);
    s.state.store(static_cast<uint8_t>(State::Started), std::memory_order_release);
  }
  if (trace.seq != 0) raise_to(last_started_seq_, trace.seq);
  running_first_.store(trace.first, std::memory_order_relaxed);
  running_seq_.store(trace.seq, std::memory_order_relaxed);
  running_since_ns_.store(now, std::memory_order_release);
}

void FlightRecorder::note_algorithm(uint64_t id, std::string_view name) {
  Slot& s = *slot_of(id);
  if (s.id.load(std::memory_order_acquire) != id) return;
  s.algorithm_length.store(static_cast<uint32_t>(name.size()), std::memory_order_relaxed);
  s.algorithm.store(name.data(), std::memory_order_release);
}

void FlightRecorder::finished(const TraceRef& trace, const std::exception_ptr& error) {
  const uint64_t first = trace.first;
  const uint64_t count = trace.count;
  const int64_t now = stamp();
  const State state = error ? State::Failed : State::Completed;
  for (uint64_t id = first; id < first + count; ++id) {
    Slot& s = *slot_of(id);
    if (s.id.load(std::memory_order_acquire) != id) continue;
    s.ended_ns.store(now, std::memory_order_relaxed);
    s.state.store(static_cast<uint8_t>(state), std::memory_order_release);
  }
  if (!error && trace.seq != 0) raise_to(last_completed_seq_, trace.seq);
  if (running_first_.load(std::memory_order_relaxed) == first) {
    running_since_ns_.store(0, std::memory_order_release);
  }
  last_ended_ns_.store(now, std::memory_order_relaxed);
  if (!error) return;

  // Cold path from here: keep the message, and dump on the group's first real failure.
  std::optional<ErrorCode> code;  // none: not a weft::Error
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    code = e.code();
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "a non-standard exception";
  }
  const std::string code_name = code ? std::string(error_code_name(*code)) : "exception";
  {
    std::lock_guard<std::mutex> lock(failures_mutex_);
    if (failures_.empty()) failures_.resize(capacity_);
    for (uint64_t id = first; id < first + count; ++id) {
      failures_[id % capacity_] = Failure{id, code_name, message};
    }
  }
  if (code == ErrorCode::Timeout || code == ErrorCode::PeerLost || code == ErrorCode::Desync) {
    if (on_failure_ && !failure_dumped_.exchange(true)) on_failure_(*code, message);
  }
}

bool FlightRecorder::read(uint64_t id, Entry& e) const {
  constexpr auto relaxed = std::memory_order_relaxed;
  const Slot& s = *slot_of(id);
  if (s.id.load(std::memory_order_acquire) != id) return false;
  e.id = id;
  e.state = s.state.load(std::memory_order_acquire);
  e.seq = s.seq.load(relaxed);
  e.tag = s.tag.load(relaxed);
  e.count_in = s.count_in.load(relaxed);
  e.count_out = s.count_out.load(relaxed);
  e.queued_ns = s.queued_ns.load(relaxed);  // stamps: converted below, once the copy is whole
  e.started_ns = s.started_ns.load(relaxed);
  e.ended_ns = s.ended_ns.load(relaxed);
  const char* algorithm = s.algorithm.load(std::memory_order_acquire);
  e.algorithm = algorithm ? std::string_view(algorithm, s.algorithm_length.load(relaxed))
                          : std::string_view();
  e.root = s.root.load(relaxed);
  e.peer = s.peer.load(relaxed);
  e.thread = s.thread.load(relaxed);
  e.fingerprint = s.fingerprint.load(relaxed);
  e.kind = s.kind.load(relaxed);
  e.dtype = s.dtype.load(relaxed);
  e.reduce_op = s.reduce_op.load(relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  // Overwritten while we read it: the copy may mix two operations.
  if (s.id.load(relaxed) != id) return false;
  e.queued_ns = stamp_to_ns(e.queued_ns);
  e.started_ns = stamp_to_ns(e.started_ns);
  e.ended_ns = stamp_to_ns(e.ended_ns);
  return true;
}

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void FlightRecorder::append_json(std::string& out) const {
  const uint64_t end = recorded();
  const uint64_t begin = end > capacity_ ? end - capacity_ : 0;
  out += "{\"name\": ";
  append_json_string(out, info_.name);
  out += ", \"id\": ";
  append_json_string(out, info_.id);
  out += fmt::format(", \"rank\": {}, \"size\": {}, \"global_ranks\": [{}]", info_.rank, info_.size,
                     fmt::join(info_.global_ranks, ", "));
  out += fmt::format(
      ", \"capacity\": {}, \"recorded\": {}, \"last_queued_seq\": {}, \"last_started_seq\": {}, "
      "\"last_completed_seq\": {}, ",
      capacity_, end, last_queued_seq_.load(std::memory_order_relaxed),
      last_started_seq_.load(std::memory_order_relaxed),
      last_completed_seq_.load(std::memory_order_relaxed));
  if (const int64_t since = running_since_ns_.load(std::memory_order_acquire); since != 0) {
    out += fmt::format("\"running\": {{\"id\": {}, \"seq\": {}, \"started_ns\": {}}}, ",
                       running_first_.load(std::memory_order_relaxed),
                       running_seq_.load(std::memory_order_relaxed), stamp_to_ns(since));
  } else {
    out += "\"running\": null, ";
  }
  out += "\"entries\": [";
  // Copied out, so that the lock is not held while formatting (failures are rare: usually empty).
  std::vector<Failure> failures;
  {
    std::lock_guard<std::mutex> lock(failures_mutex_);
    failures = failures_;
  }
  auto failure_of = [&](uint64_t id) -> const Failure* {
    if (failures.empty() || failures[id % capacity_].id != id) return nullptr;
    return &failures[id % capacity_];
  };
  bool first = true;
  Entry e{};
  for (uint64_t id = begin; id < end; ++id) {
    if (!read(id, e)) continue;
    const auto kind = static_cast<CollectiveKind>(e.kind);
    out += first ? "\n  " : ",\n  ";
    first = false;
    out += fmt::format(
        "{{\"id\": {}, \"seq\": {}, \"op\": \"{}\", \"dtype\": \"{}\", \"count_in\": {}, "
        "\"count_out\": {}, \"reduce_op\": \"{}\", \"root\": {}, \"peer\": {}, \"tag\": {}, "
        "\"fingerprint\": {}, \"algorithm\": ",
        e.id, e.seq, collective_name(kind), dtype_name(static_cast<DType>(e.dtype)), e.count_in,
        e.count_out,
        e.reduce_op < 0 ? std::string_view()
                        : reduce_op_name(ReduceOp(static_cast<ReduceOp::Kind>(e.reduce_op))),
        e.root, e.peer, e.tag, e.fingerprint);
    append_json_string(out, e.algorithm);
    out += fmt::format(
        ", \"state\": \"{}\", \"queued_ns\": {}, \"started_ns\": {}, \"ended_ns\": {}, "
        "\"thread\": {}",
        state_name(e.state), e.queued_ns, e.started_ns, e.ended_ns, e.thread);
    if (e.state == static_cast<uint8_t>(State::Failed)) {
      const Failure* failure = failure_of(e.id);
      out += ", \"error_code\": ";
      append_json_string(out, failure != nullptr ? failure->code : "");
      out += ", \"error\": ";
      append_json_string(out, failure != nullptr ? failure->message : "");
    }
    out += '}';
  }
  out += first ? "]}" : "\n]}";
}

std::optional<std::string> FlightRecorder::overdue(std::chrono::nanoseconds grace, int64_t now) {
  const int64_t limit = std::chrono::nanoseconds(info_.timeout).count() + grace.count();
  const uint64_t end = recorded();
  const uint64_t begin = end > capacity_ ? end - capacity_ : 0;
  auto name = [&](uint64_t id, uint64_t seq) {
    Entry e{};
    if (read(id, e)) {
      const auto kind = static_cast<CollectiveKind>(e.kind);
      return e.seq != 0 ? fmt::format("{} #{}", collective_name(kind), e.seq)
                        : fmt::format("{} (tag {})", collective_name(kind), e.tag);
    }
    return fmt::format("operation #{}", seq);
  };

  // Something runs: past its timeout (and the grace), its own deadline should have ended it.
  if (const int64_t started = running_since_ns_.load(std::memory_order_acquire); started != 0) {
    const int64_t since = stamp_to_ns(started);
    const uint64_t id = running_first_.load(std::memory_order_relaxed);
    if (now - since < limit) return std::nullopt;
    if (watchdog_reported_.exchange(id) == id) return std::nullopt;
    return fmt::format(
        "rank {}/{} group \"{}\": {} started {:.1f} s ago and has not ended, past its timeout "
        "({} ms): the thread running it is stuck (its transport ignores the deadline, or a bug); "
        "later operations of the group cannot start",
        info_.rank, info_.size, info_.name, name(id, running_seq_.load(std::memory_order_relaxed)),
        static_cast<double>(now - since) / 1e9, info_.timeout.count());
  }
  // Nothing runs: the oldest operation waiting to start. Operations end in issue order, so walk
  // back from the newest until one has ended.
  Entry e{};
  std::optional<Entry> oldest;
  for (uint64_t id = end; id > begin; --id) {
    if (!read(id - 1, e)) break;
    if (e.state >= static_cast<uint8_t>(State::Started)) break;
    oldest = e;
  }
  if (!oldest) return std::nullopt;
  // A queued operation cannot start before the one ahead of it ended.
  const int64_t since =
      std::max(oldest->queued_ns, stamp_to_ns(last_ended_ns_.load(std::memory_order_relaxed)));
  if (now - since < limit) return std::nullopt;
  if (watchdog_reported_.exchange(oldest->id) == oldest->id) return std::nullopt;
  return fmt::format(
      "rank {}/{} group \"{}\": {}{} was issued and has not started for {:.1f} s, past the "
      "group's timeout ({} ms): the group's progress thread is stuck (a completion callback that "
      "blocks, or a bug)",
      info_.rank, info_.size, info_.name, name(oldest->id, oldest->seq),
      oldest->id == begin && begin > 0 ? " (the oldest still recorded)" : "",
      static_cast<double>(now - since) / 1e9, info_.timeout.count());
}

}  // namespace weft
