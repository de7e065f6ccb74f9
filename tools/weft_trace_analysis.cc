// weft_trace_analysis.cc: parsing (docs/flight-recorder.md, version 1), the store request, the
// analysis and both renderings. See weft_trace_analysis.h for what each part promises.
#include "weft_trace_analysis.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/store.h"

namespace weft::trace {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr int kFormatVersion = 1;
constexpr const char* kDumpPrefix = "weft-trace-rank";
constexpr const char* kDumpSuffix = ".json";
constexpr const char* kNoDump = "no dump (dead or unreachable)";
// Error messages run to hundreds of characters (every rank's state); the summary keeps the start.
constexpr size_t kShortMessageChars = 160;
// Past this many dumps the header lists only the earliest few (a 1024-rank job's header would
// otherwise bury the analysis).
constexpr size_t kListedDumps = 16;

// ---- Parsing ------------------------------------------------------------------------------

// Reads fields of one dump, naming the file and the field's path in every error.
class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    if (where.empty()) throw TraceError(fmt::format("{}: {}", source_, what));
    throw TraceError(fmt::format("{}: {}: {}", source_, where, what));
  }

  const json* find(const json& object, const char* key, const std::string& where,
                   bool required) const {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) {
      if (required) fail(where, fmt::format("\"{}\" is missing", key));
      return nullptr;
    }
    return &*it;
  }

  int64_t integer(const json& object, const char* key, const std::string& where,
                  bool required = true) const {
    const json* value = find(object, key, where, required);
    if (value == nullptr) return 0;
    if (value->is_number_unsigned()) {
      uint64_t v = value->get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX)) {
        fail(where, fmt::format("\"{}\" is {}, too large", key, v));
      }
      return static_cast<int64_t>(v);
    }
    if (!value->is_number_integer()) {
      fail(where, fmt::format("\"{}\" should be an integer, not {}", key, value->type_name()));
    }
    return value->get<int64_t>();
  }

  uint64_t count(const json& object, const char* key, const std::string& where,
                 bool required = true) const {
    int64_t v = integer(object, key, where, required);
    if (v < 0) fail(where, fmt::format("\"{}\" is {}, should not be negative", key, v));
    return static_cast<uint64_t>(v);
  }

  std::string string(const json& object, const char* key, const std::string& where,
                     bool required = true) const {
    const json* value = find(object, key, where, required);
    if (value == nullptr) return "";
    if (!value->is_string()) {
      fail(where, fmt::format("\"{}\" should be a string, not {}", key, value->type_name()));
    }
    return value->get<std::string>();
  }

  const json& array(const json& object, const char* key, const std::string& where) const {
    const json* value = find(object, key, where, true);
    if (!value->is_array()) {
      fail(where, fmt::format("\"{}\" should be an array, not {}", key, value->type_name()));
    }
    return *value;
  }

 private:
  const std::string& source_;
};

Entry parse_entry(const Reader& in, const json& object, const std::string& where) {
  if (!object.is_object()) in.fail(where, "should be an object");
  Entry e;
  e.id = in.count(object, "id", where);
  e.seq = in.count(object, "seq", where);
  e.op = in.string(object, "op", where);
  e.state = in.string(object, "state", where);
  if (e.state != "queued" && e.state != "started" && e.state != "completed" &&
      e.state != "failed") {
    in.fail(where,
            fmt::format("\"state\" is \"{}\", not queued, started, completed or failed", e.state));
  }
  e.dtype = in.string(object, "dtype", where, false);
  e.count_in = in.integer(object, "count_in", where, false);
  e.count_out = in.integer(object, "count_out", where, false);
  e.reduce_op = in.string(object, "reduce_op", where, false);
  e.root = object.contains("root") ? in.integer(object, "root", where) : -1;
  e.peer = object.contains("peer") ? in.integer(object, "peer", where) : -1;
  e.tag = in.integer(object, "tag", where, false);
  e.fingerprint = in.integer(object, "fingerprint", where, false);
  e.algorithm = in.string(object, "algorithm", where, false);
  e.queued_ns = in.integer(object, "queued_ns", where, false);
  e.started_ns = in.integer(object, "started_ns", where, false);
  e.ended_ns = in.integer(object, "ended_ns", where, false);
  e.thread = in.integer(object, "thread", where, false);
  e.error_code = in.string(object, "error_code", where, false);
  e.error = in.string(object, "error", where, false);
  return e;
}

GroupDump parse_group(const Reader& in, const json& object, const std::string& where) {
  if (!object.is_object()) in.fail(where, "should be an object");
  GroupDump g;
  g.name = in.string(object, "name", where);
  g.id = in.string(object, "id", where);
  g.size = static_cast<int>(in.count(object, "size", where));
  g.rank = static_cast<int>(in.count(object, "rank", where));
  if (g.size == 0 || g.rank >= g.size) {
    in.fail(where, fmt::format("rank {} is not within size {}", g.rank, g.size));
  }
  const json& ranks = in.array(object, "global_ranks", where);
  for (const json& r : ranks) {
    if (!r.is_number_integer() || r.get<int64_t>() < 0) {
      in.fail(where, "\"global_ranks\" should hold non-negative integers");
    }
    g.global_ranks.push_back(static_cast<int>(r.get<int64_t>()));
  }
  if (static_cast<int>(g.global_ranks.size()) != g.size) {
    in.fail(where, fmt::format("\"global_ranks\" has {} ranks, size is {}", g.global_ranks.size(),
                               g.size));
  }
  g.capacity = in.count(object, "capacity", where);
  g.recorded = in.count(object, "recorded", where);
  g.last_queued_seq = in.count(object, "last_queued_seq", where);
  g.last_started_seq = in.count(object, "last_started_seq", where);
  g.last_completed_seq = in.count(object, "last_completed_seq", where);
  if (auto running = object.find("running"); running != object.end() && running->is_object()) {
    g.running_seq = in.count(*running, "seq", where + ".running");
    g.running_started_ns =
        static_cast<int64_t>(in.count(*running, "started_ns", where + ".running"));
  }
  const json& entries = in.array(object, "entries", where);
  g.entries.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    g.entries.push_back(parse_entry(in, entries[i], fmt::format("{}.entries[{}]", where, i)));
  }
  return g;
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw TraceError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw TraceError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  return text.str();
}

// The rank in "weft-trace-rank<R>.json", or -1.
int rank_of_file_name(const std::string& name) {
  const std::string prefix = kDumpPrefix, suffix = kDumpSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoi(digits);
}

// ---- Wording ------------------------------------------------------------------------------

std::string duration(int64_t ns) {
  if (ns < 0) return fmt::format("-{}", duration(-ns));
  double s = static_cast<double>(ns) / 1e9;
  if (ns < 1000) return fmt::format("{} ns", ns);
  if (ns < 1'000'000) return fmt::format("{} us", ns / 1000);
  if (s < 1) return fmt::format("{:.0f} ms", s * 1e3);
  if (s < 100) return fmt::format("{:.2f} s", s);
  return fmt::format("{:.0f} s", s);
}

// "0-3, 5, 7-9"
std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    if (j >= i + 2) {
      out += fmt::format("{}-{}", ranks[i], ranks[j]);
    } else {
      out += std::to_string(ranks[i]);
      if (j == i + 1) out += fmt::format(", {}", ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

std::string plural_ranks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", rank_list(ranks));
}

// "rank 3" or "rank 3 (group rank 1)" when the group numbers it otherwise.
std::string member_name(const Member& m) {
  if (m.rank == m.group_rank) return fmt::format("rank {}", m.rank);
  return fmt::format("rank {} (group rank {})", m.rank, m.group_rank);
}

// "ranks 1, 3" or "ranks 1, 3 (group ranks 0, 1)".
std::string members_name(const std::vector<const Member*>& members) {
  std::vector<int> world, group;
  bool differs = false;
  for (const Member* m : members) {
    world.push_back(m->rank);
    group.push_back(m->group_rank);
    differs = differs || m->rank != m->group_rank;
  }
  std::string out = plural_ranks(world);
  if (differs) {
    out += fmt::format(" ({} {})", members.size() == 1 ? "group rank" : "group ranks",
                       rank_list(group));
  }
  return out;
}

bool is_p2p(const Entry& e) { return e.op == "send" || e.op == "recv"; }
bool is_pending(const Entry& e) { return e.state == "queued" || e.state == "started"; }

std::string call_text(const Entry& e, bool with_seq) {
  std::string detail;
  if (!e.dtype.empty()) {
    detail = e.count_in == e.count_out || e.count_out == 0 || e.count_in == 0
                 ? fmt::format("{} x {}", e.dtype, std::max(e.count_in, e.count_out))
                 : fmt::format("{} x {} -> {}", e.dtype, e.count_in, e.count_out);
  }
  auto add = [&](const std::string& part) { detail += (detail.empty() ? "" : ", ") + part; };
  if (!e.reduce_op.empty()) add(e.reduce_op);
  if (e.root >= 0) add(fmt::format("root {}", e.root));
  if (is_p2p(e)) {
    if (e.peer == -2) {
      add("from any source");
    } else {
      add(fmt::format("{} peer {}", e.op == "send" ? "to" : "from", e.peer));
    }
    add(fmt::format("tag {}", e.tag));
    return fmt::format("{} ({})", e.op, detail);
  }
  std::string name = with_seq ? fmt::format("{} #{}", e.op, e.seq) : e.op;
  if (detail.empty()) return name;
  return fmt::format("{} ({})", name, detail);
}

const Entry* entry_at(const GroupDump& g, uint64_t seq) {
  for (auto it = g.entries.rbegin(); it != g.entries.rend(); ++it) {
    if (it->seq == seq && !is_p2p(*it)) return &*it;
  }
  return nullptr;
}

// When the entry reached its state, relative to the dump: "failed with Timeout 2 ms before its
// dump, after running 1.00 s".
std::string timeline(const Entry& e, int64_t dumped_at_ns) {
  auto before = [&](int64_t t) {
    if (t == 0 || dumped_at_ns == 0) return std::string();
    return fmt::format(" {} before its dump", duration(dumped_at_ns - t));
  };
  auto ran = [&]() {
    if (e.started_ns == 0 || e.ended_ns == 0) return std::string();
    return fmt::format(", after running {}", duration(e.ended_ns - e.started_ns));
  };
  if (e.state == "queued") return fmt::format("queued{}, not started", before(e.queued_ns));
  if (e.state == "started") return fmt::format("started{}, still running", before(e.started_ns));
  if (e.state == "completed") return fmt::format("completed{}{}", before(e.ended_ns), ran());
  std::string code = e.error_code.empty() ? "" : " with " + e.error_code;
  return fmt::format("failed{}{}{}", code, before(e.ended_ns), ran());
}

std::string short_message(const Entry& e) {
  std::string message = e.error;
  if (!e.error_code.empty()) {
    size_t at = message.find(": " + e.error_code + ": ");
    if (at != std::string::npos) message = message.substr(at + e.error_code.size() + 4);
  }
  if (message.size() > kShortMessageChars) {
    message = message.substr(0, kShortMessageChars - 3) + "...";
  }
  return message;
}

// What every rank must agree on for one seq (docs/flight-recorder.md: the fingerprint, plus the
// fields it hashes, in case two calls collide in 16 bits).
bool same_call(const Entry& a, const Entry& b) {
  return a.fingerprint == b.fingerprint && a.op == b.op && a.dtype == b.dtype &&
         a.reduce_op == b.reduce_op && a.root == b.root;
}

std::string call_fields(const Entry& e) {
  return fmt::format("{} dtype {} count_in {} count_out {} reduce_op {} root {} fingerprint {}",
                     e.op, e.dtype.empty() ? "-" : e.dtype, e.count_in, e.count_out,
                     e.reduce_op.empty() ? "-" : e.reduce_op,
                     e.root < 0 ? std::string("-") : std::to_string(e.root), e.fingerprint);
}

// ---- Analysis -----------------------------------------------------------------------------

void analyze_group(GroupAnalysis& g) {
  std::vector<Member*> have;
  for (Member& m : g.members) {
    if (m.dump != nullptr) {
      have.push_back(&m);
    } else {
      g.missing.push_back(&m);
    }
  }
  for (Member* m : have) {
    for (const Entry& e : m->dump->entries) {
      if (e.state == "failed") {
        g.errors.push_back({m->rank, m->group_rank, &e, short_message(e)});
        break;
      }
    }
  }
  if (have.empty()) return;

  // Who is behind: first in issuing, then (when every rank issued the same) in completing.
  uint64_t max_issued = 0, max_completed = 0;
  for (Member* m : have) {
    max_issued = std::max(max_issued, m->dump->last_queued_seq);
    max_completed = std::max(max_completed, m->dump->last_completed_seq);
  }
  auto op_at = [&](uint64_t seq) {
    for (Member* m : have) {
      if (const Entry* e = entry_at(*m->dump, seq)) return e->op;
    }
    return std::string();
  };
  // The oldest collective some rank is still in: only a rank that has not even issued that one
  // holds the others up. (A program may issue far ahead of what has run, nccl-tests style: a
  // rank that issued less than another but more than where everyone is stuck is not behind.)
  uint64_t stuck = std::numeric_limits<uint64_t>::max();
  for (Member* m : have) {
    if (m->dump->last_queued_seq > m->dump->last_completed_seq) {
      stuck = std::min(stuck, m->dump->last_completed_seq + 1);
    }
  }
  std::set<const Member*> behind_set;
  for (Member* m : have) {
    if (m->dump->last_queued_seq < max_issued && m->dump->last_queued_seq < stuck) {
      uint64_t seq = m->dump->last_queued_seq + 1;
      const Entry* last = m->dump->entries.empty() ? nullptr : &m->dump->entries.back();
      g.behind.push_back({m->rank, m->group_rank, true, seq, op_at(seq), m, last});
      behind_set.insert(m);
    }
  }
  if (g.behind.empty()) {
    for (Member* m : have) {
      if (m->dump->last_completed_seq < max_completed) {
        uint64_t seq = m->dump->last_completed_seq + 1;
        const Entry* own = entry_at(*m->dump, seq);
        const Entry* last = m->dump->entries.empty() ? nullptr : &m->dump->entries.back();
        g.behind.push_back(
            {m->rank, m->group_rank, false, seq, own ? own->op : op_at(seq), m, own ? own : last});
        behind_set.insert(m);
      }
    }
  }

  // What the others are in: the oldest collective each has not completed (they run in order, so
  // it is the one that holds the rest up), or else a pending send/recv.
  // Grouped by what they called as well, so that a desync shows as two lines.
  std::map<std::tuple<uint64_t, std::string, std::string, int64_t>, size_t> waiting_index;
  bool pending = false;
  for (Member* m : have) {
    const GroupDump& d = *m->dump;
    const Entry* e = nullptr;
    if (d.last_queued_seq > d.last_completed_seq) {
      e = entry_at(d, d.last_completed_seq + 1);
      pending = true;
    }
    if (e == nullptr) {
      for (const Entry& p : d.entries) {
        if (is_p2p(p) && is_pending(p)) {
          e = &p;
          pending = true;
          break;
        }
      }
    }
    if (e == nullptr || behind_set.count(m) != 0) continue;
    auto key = std::make_tuple(e->seq, e->op, e->state, e->fingerprint);
    auto [it, added] = waiting_index.emplace(key, g.waiting.size());
    if (added) g.waiting.push_back({{}, e->seq, e->op, e->state, e});
    g.waiting[it->second].members.push_back(m);
  }
  std::stable_sort(g.waiting.begin(), g.waiting.end(), [](const Waiting& a, const Waiting& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.members.front()->rank < b.members.front()->rank;
  });

  g.all_done = g.missing.empty() && g.behind.empty() && !pending;
  if (g.all_done) {
    for (Member* m : have) {
      if (m->dump->last_completed_seq != max_issued) g.all_done = false;
      for (const Entry& e : m->dump->entries) g.all_done = g.all_done && !is_pending(e);
    }
    g.done_seq = max_issued;
  }

  // The first seq where members called different things, over the seqs every member still holds.
  Mismatch& mm = g.mismatch;
  uint64_t from = 1, to = UINT64_MAX;
  std::vector<std::unordered_map<uint64_t, const Entry*>> by_seq(have.size());
  for (size_t i = 0; i < have.size(); ++i) {
    const GroupDump& d = *have[i]->dump;
    if (d.recorded > d.capacity) mm.wrapped.push_back(have[i]);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const Entry& e : d.entries) {
      if (e.seq == 0 || is_p2p(e)) continue;
      by_seq[i][e.seq] = &e;
      lo = std::min(lo, e.seq);
      hi = std::max(hi, e.seq);
    }
    if (hi == 0) {
      mm.why_not_checked =
          d.last_queued_seq == 0
              ? fmt::format("{} issued no collective", member_name(*have[i]))
              : fmt::format("the ring of {} holds no collective (recorded {}, capacity {})",
                            member_name(*have[i]), d.recorded, d.capacity);
      return;
    }
    from = std::max(from, lo);
    to = std::min(to, hi);
  }
  if (from > to) {
    mm.why_not_checked = "no seq is still held by every rank (their rings do not overlap)";
    return;
  }
  mm.checked = true;
  mm.from = from;
  mm.to = to;
  for (uint64_t seq = from; seq <= to && !mm.found; ++seq) {
    const Entry* first = nullptr;
    for (size_t i = 0; i < have.size(); ++i) {
      auto it = by_seq[i].find(seq);
      if (it == by_seq[i].end()) continue;
      if (first == nullptr) first = it->second;
      if (!same_call(*first, *it->second)) mm.found = true;
    }
    if (mm.found) {
      mm.seq = seq;
      for (size_t i = 0; i < have.size(); ++i) {
        auto it = by_seq[i].find(seq);
        if (it != by_seq[i].end()) mm.calls.emplace_back(have[i], it->second);
      }
    }
  }
}

// The calls at a mismatch, grouped by what was called: [(describe, members)], the largest first.
std::vector<std::pair<std::string, std::vector<const Member*>>> group_calls(const Mismatch& mm) {
  std::vector<std::pair<std::string, std::vector<const Member*>>> out;
  std::vector<const Entry*> firsts;
  for (const auto& [m, e] : mm.calls) {
    size_t i = 0;
    while (i < firsts.size() && !same_call(*firsts[i], *e)) ++i;
    if (i == firsts.size()) {
      firsts.push_back(e);
      out.push_back({call_text(*e, false), {}});
    }
    out[i].second.push_back(m);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  return out;
}

std::string group_label(const GroupAnalysis& g) { return fmt::format("group \"{}\"", g.name); }

// "rank 2 (group "world")", or "rank 3 (rank 1 in group "odds")" where the numberings differ.
std::string members_in_group(const std::vector<const Member*>& members, const GroupAnalysis& g) {
  std::vector<int> world, group;
  bool differs = false;
  for (const Member* m : members) {
    world.push_back(m->rank);
    group.push_back(m->group_rank);
    differs = differs || m->rank != m->group_rank;
  }
  if (!differs) return fmt::format("{} ({})", plural_ranks(world), group_label(g));
  return fmt::format("{} ({} in {})", plural_ranks(world), plural_ranks(group), group_label(g));
}

std::string verdict(const Analysis& a) {
  // A desync is a bug in the program: it explains everything after it.
  for (const GroupAnalysis& g : a.groups) {
    if (!g.mismatch.found) continue;
    auto calls = group_calls(g.mismatch);
    std::string out = fmt::format("{} desync at #{}: ", group_label(g), g.mismatch.seq);
    if (calls.size() == 2) {
      out += fmt::format("{} called {} while {} called {}", members_name(calls[1].second),
                         calls[1].first, members_name(calls[0].second), calls[0].first);
    } else {
      for (size_t i = 0; i < calls.size(); ++i) {
        out += fmt::format("{}{} called {}", i == 0 ? "" : "; ", members_name(calls[i].second),
                           calls[i].first);
      }
    }
    return out;
  }
  for (const GroupAnalysis& g : a.groups) {
    if (g.behind.empty() || !g.behind.front().not_issued) continue;
    std::vector<const Member*> members;
    std::set<uint64_t> seqs;
    for (const Behind& b : g.behind) {
      members.push_back(b.member);
      seqs.insert(b.seq);
    }
    const Behind& first = g.behind.front();
    std::string what = first.op.empty() ? fmt::format("#{}", first.seq)
                                        : fmt::format("{} #{}", first.op, first.seq);
    if (seqs.size() > 1) what = fmt::format("#{} and later", *seqs.begin());
    std::vector<const Member*> waiting;
    bool all_in_it = true;
    for (const Waiting& w : g.waiting) {
      all_in_it = all_in_it && w.seq == first.seq && seqs.size() == 1;
      waiting.insert(waiting.end(), w.members.begin(), w.members.end());
    }
    std::sort(waiting.begin(), waiting.end(),
              [](const Member* x, const Member* y) { return x->rank < y->rank; });
    std::string rest = "the other ranks are waiting for it";
    if (!waiting.empty() && all_in_it) {
      rest = fmt::format("{} {} waiting in it", members_name(waiting),
                         waiting.size() == 1 ? "is" : "are");
    }
    return fmt::format("{} never issued {}; {}", members_in_group(members, g), what, rest);
  }
  for (const GroupAnalysis& g : a.groups) {
    if (g.missing.empty() || g.all_done) continue;
    std::string out =
        fmt::format("{} left no dump (dead or unreachable)", members_in_group(g.missing, g));
    for (const Waiting& w : g.waiting) {
      if (w.state == "failed") {
        out += fmt::format("; {} failed in {}{}", members_name(w.members), describe(*w.entry),
                           w.entry->error_code.empty() ? "" : " with " + w.entry->error_code);
      } else {
        out += fmt::format("; {} {} in {} ({})", members_name(w.members),
                           w.members.size() == 1 ? "is" : "are", describe(*w.entry), w.state);
      }
    }
    return out;
  }
  for (const GroupAnalysis& g : a.groups) {
    if (g.behind.empty()) continue;
    std::vector<const Member*> members, others;
    for (const Behind& b : g.behind) members.push_back(b.member);
    for (const Member& m : g.members) {
      if (m.dump != nullptr && std::find(members.begin(), members.end(), &m) == members.end()) {
        others.push_back(&m);
      }
    }
    const Behind& first = g.behind.front();
    return fmt::format("{} {} not completed {}, which {} completed", members_in_group(members, g),
                       members.size() == 1 ? "has" : "have",
                       first.op.empty() ? fmt::format("#{}", first.seq)
                                        : fmt::format("{} #{}", first.op, first.seq),
                       members_name(others));
  }
  if (!a.missing.empty()) {
    std::vector<int> ranks;
    for (const auto& [rank, why] : a.missing) ranks.push_back(rank);
    return fmt::format("{} left no dump (dead or unreachable)", plural_ranks(ranks));
  }
  for (const GroupAnalysis& g : a.groups) {
    if (g.waiting.size() != 1 || g.waiting.front().seq == 0) continue;
    const Waiting& w = g.waiting.front();
    if (w.members.size() != g.members.size()) continue;
    return fmt::format("no rank is behind: all {} ranks of {} are in {} (see their errors)",
                       w.members.size(), group_label(g), describe(*w.entry));
  }
  // A send or recv nobody on the other side matches (same tag, this rank or any source).
  for (const GroupAnalysis& g : a.groups) {
    for (const Waiting& w : g.waiting) {
      const Entry& e = *w.entry;
      if (!is_p2p(e) || e.peer < 0 || e.peer >= g.size) continue;
      const Member& peer = g.members[e.peer];
      if (peer.dump == nullptr) continue;
      for (const Member* self : w.members) {
        bool matched = false;
        for (const Entry& p : peer.dump->entries) {
          matched = matched || (is_pending(p) && p.op == (e.op == "send" ? "recv" : "send") &&
                                p.tag == e.tag && (p.peer == self->group_rank || p.peer == -2));
        }
        if (!matched) {
          return fmt::format("{} is in {}, and {} has no matching {} pending",
                             members_in_group({self}, g), describe(e), member_name(peer),
                             e.op == "send" ? "recv" : "send");
        }
      }
    }
  }
  bool all_done = !a.groups.empty();
  for (const GroupAnalysis& g : a.groups) all_done = all_done && g.all_done;
  if (all_done) return "every group completed all it issued; nothing is pending";
  return "";
}

// ---- JSON ---------------------------------------------------------------------------------

ordered_json entry_json(const Entry* e) {
  if (e == nullptr) return nullptr;
  ordered_json j;
  j["id"] = e->id;
  j["seq"] = e->seq;
  j["op"] = e->op;
  j["dtype"] = e->dtype;
  j["count_in"] = e->count_in;
  j["count_out"] = e->count_out;
  j["reduce_op"] = e->reduce_op;
  j["root"] = e->root;
  j["peer"] = e->peer;
  j["tag"] = e->tag;
  j["fingerprint"] = e->fingerprint;
  j["algorithm"] = e->algorithm;
  j["state"] = e->state;
  j["queued_ns"] = e->queued_ns;
  j["started_ns"] = e->started_ns;
  j["ended_ns"] = e->ended_ns;
  j["error_code"] = e->error_code;
  j["error"] = e->error;
  j["describe"] = describe(*e);
  return j;
}

ordered_json error_json(const ErrorInfo& info) {
  ordered_json j;
  j["rank"] = info.rank;
  j["group_rank"] = info.group_rank;
  j["seq"] = info.entry->seq;
  j["op"] = info.entry->op;
  j["error_code"] = info.entry->error_code;
  j["message"] = info.entry->error;
  j["short_message"] = info.short_message;
  return j;
}

ordered_json ranks_json(const std::vector<const Member*>& members, bool group) {
  ordered_json j = ordered_json::array();
  for (const Member* m : members) j.push_back(group ? m->group_rank : m->rank);
  return j;
}

}  // namespace

// ---- Public functions ---------------------------------------------------------------------

Dump parse_dump(const std::string& text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann's what() starts with "[json.exception.parse_error.101] parse error at ...".
    std::string what = e.what();
    size_t at = what.find("] ");
    throw TraceError(fmt::format("{}: not valid JSON: {}", source,
                                 at == std::string::npos ? what : what.substr(at + 2)));
  }
  Reader in(source);
  if (!doc.is_object()) in.fail("", "not a weft-trace dump (the top level is not an object)");
  if (!doc.contains("format")) in.fail("", "not a weft-trace dump (no \"format\")");
  std::string format = in.string(doc, "format", "");
  if (format != "weft-trace") {
    in.fail("",
            fmt::format("not a weft-trace dump (format is \"{}\", not \"weft-trace\")", format));
  }
  int64_t version = in.integer(doc, "version", "");
  if (version != kFormatVersion) {
    in.fail("", fmt::format("format version {} is not one this weft-trace reads (it reads "
                            "version {}); use the weft-trace of the weft that wrote it",
                            version, kFormatVersion));
  }
  Dump d;
  d.source = source;
  d.job = in.string(doc, "job", "", false);
  d.world_size = static_cast<int>(in.count(doc, "world_size", ""));
  d.rank = static_cast<int>(in.count(doc, "rank", ""));
  if (d.world_size == 0 || d.rank >= d.world_size) {
    in.fail("", fmt::format("rank {} is not within world_size {}", d.rank, d.world_size));
  }
  d.host = in.string(doc, "host", "", false);
  d.pid = in.integer(doc, "pid", "", false);
  d.weft_version = in.string(doc, "weft_version", "", false);
  d.reason = in.string(doc, "reason", "", false);
  d.dumped_at_ns = in.integer(doc, "dumped_at_ns", "", false);
  const json& groups = in.array(doc, "groups", "");
  std::set<std::string> ids;
  for (size_t i = 0; i < groups.size(); ++i) {
    std::string where = fmt::format("groups[{}]", i);
    GroupDump g = parse_group(in, groups[i], where);
    if (!ids.insert(g.id).second) in.fail(where, fmt::format("group id \"{}\" twice", g.id));
    if (g.global_ranks[g.rank] != d.rank) {
      in.fail(where, fmt::format("global_ranks[{}] is {}, but this is rank {}'s dump", g.rank,
                                 g.global_ranks[g.rank], d.rank));
    }
    d.groups.push_back(std::move(g));
  }
  return d;
}

Dump load_dump_file(const std::string& path) { return parse_dump(read_file(path), path); }

std::vector<std::string> find_dump_files(const std::string& dir) {
  std::vector<std::pair<int, std::string>> found;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) throw TraceError(fmt::format("{}: cannot read the directory: {}", dir, ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) throw TraceError(fmt::format("{}: cannot read the directory: {}", dir, ec.message()));
    std::string name = it->path().filename().string();
    int rank = rank_of_file_name(name);
    if (rank >= 0) found.emplace_back(rank, it->path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [rank, path] : found) paths.push_back(std::move(path));
  return paths;
}

DumpSet load_dumps(const std::vector<std::string>& paths) {
  DumpSet set;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      std::vector<std::string> files = find_dump_files(path);
      if (files.empty()) {
        throw TraceError(
            fmt::format("{}: no {}*{} in this directory", path, kDumpPrefix, kDumpSuffix));
      }
      for (const std::string& file : files) set.dumps.push_back(load_dump_file(file));
    } else {
      set.dumps.push_back(load_dump_file(path));
    }
  }
  if (set.dumps.empty()) throw TraceError("no dumps to analyse");
  return set;
}

DumpSet request_dumps(Store& store, std::chrono::milliseconds timeout, const std::string& reason) {
  using Clock = std::chrono::steady_clock;
  const std::string world_size_key = "weft/trace/world_size";
  Bytes value;
  try {
    value = store.get(world_size_key, timeout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout) throw;
    throw TraceError(fmt::format(
        "no weft job with a flight recorder on this store: no key {} after {} ms (is the job "
        "running, with WEFT_TRACE_BUFFER not 0, and is this its world group's store?)",
        world_size_key, timeout.count()));
  }
  std::string text(value.begin(), value.end());
  int world_size = 0;
  try {
    size_t used = 0;
    world_size = std::stoi(text, &used);
    if (used != text.size() || world_size <= 0) world_size = 0;
  } catch (const std::exception&) {
    world_size = 0;
  }
  if (world_size == 0) {
    throw TraceError(
        fmt::format("the store's {} is \"{}\", not a world size", world_size_key, text));
  }
  DumpSet set;
  set.world_size = world_size;
  if (store.check({"weft/trace/job"})) {
    Bytes job = store.get("weft/trace/job", timeout);
    set.job.assign(job.begin(), job.end());
  }

  const int64_t n = store.add("weft/trace/requests", 1);
  const std::string request_key = fmt::format("weft/trace/request/{}", n);
  auto reply_key = [n](int rank) { return fmt::format("weft/trace/reply/{}/{}", n, rank); };
  const auto deadline = Clock::now() + timeout;
  std::string request = "store " + reason;
  store.set(request_key, Bytes(request.begin(), request.end()));

  // Wait for the ranks in order, each with what is left of the timeout; once it is spent, take
  // whatever replies are already there without waiting.
  std::vector<std::optional<Bytes>> replies(world_size);
  std::exception_ptr failure;
  try {
    for (int rank = 0; rank < world_size; ++rank) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() > 0) {
        try {
          replies[rank] = store.get(reply_key(rank), left);
        } catch (const Error& e) {
          if (e.code() != ErrorCode::Timeout) throw;
        }
      } else if (store.check({reply_key(rank)})) {
        replies[rank] = store.get(reply_key(rank), timeout);
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  // Delete the request and the replies even when reading failed, so that the store does not
  // keep megabytes of dumps. A rank that answers after this leaves its reply behind.
  try {
    store.delete_key(request_key);
    for (int rank = 0; rank < world_size; ++rank) store.delete_key(reply_key(rank));
  } catch (...) {
    if (!failure) failure = std::current_exception();
  }
  if (failure) std::rethrow_exception(failure);

  for (int rank = 0; rank < world_size; ++rank) {
    if (!replies[rank]) {
      set.unanswered.emplace_back(rank, kNoDump);
      continue;
    }
    std::string source = fmt::format("store reply {}", reply_key(rank));
    try {
      Dump d = parse_dump(std::string(replies[rank]->begin(), replies[rank]->end()), source);
      if (d.rank != rank) {
        set.notes.push_back(fmt::format("{} holds rank {}'s dump", source, d.rank));
      }
      set.dumps.push_back(std::move(d));
    } catch (const TraceError& e) {
      set.ignored.push_back({source, e.what()});
      set.unanswered.emplace_back(rank, "no dump (its reply is not a valid dump)");
    }
  }
  return set;
}

std::string describe(const Entry& e) { return call_text(e, true); }

Analysis analyze(DumpSet set) {
  Analysis a;
  a.ignored = std::move(set.ignored);
  a.notes = std::move(set.notes);

  // The job: the store's, else the one most dumps name (ties: the lowest rank's).
  a.job = set.job;
  if (a.job.empty()) {
    std::map<std::string, int> votes;
    for (const Dump& d : set.dumps) {
      if (!d.job.empty()) ++votes[d.job];
    }
    int best = 0, best_rank = INT32_MAX;
    for (const Dump& d : set.dumps) {
      if (d.job.empty()) continue;
      int v = votes[d.job];
      if (v > best || (v == best && d.rank < best_rank)) {
        best = v;
        best_rank = d.rank;
        a.job = d.job;
      }
    }
  }
  std::vector<Dump> kept;
  for (Dump& d : set.dumps) {
    if (d.job.empty() && !a.job.empty()) {
      a.notes.push_back(fmt::format(
          "{} has no job id (dumped before the job agreed on one); taken as job \"{}\"'s", d.source,
          a.job));
    }
    if (!d.job.empty() && !a.job.empty() && d.job != a.job) {
      a.ignored.push_back(
          {d.source, fmt::format("job \"{}\", not \"{}\" (a dump of another job)", d.job, a.job)});
    } else {
      kept.push_back(std::move(d));
    }
  }
  // One dump per rank: a later dump of a process replaces its earlier one.
  std::stable_sort(kept.begin(), kept.end(), [](const Dump& x, const Dump& y) {
    return x.rank != y.rank ? x.rank < y.rank : x.dumped_at_ns > y.dumped_at_ns;
  });
  for (Dump& d : kept) {
    if (!a.dumps.empty() && a.dumps.back().rank == d.rank) {
      a.ignored.push_back({d.source, fmt::format("an older dump of rank {} than {}", d.rank,
                                                 a.dumps.back().source)});
    } else {
      a.dumps.push_back(std::move(d));
    }
  }

  // The world size: the store's, else the one most dumps give (ties: the larger).
  a.world_size = set.world_size;
  if (a.world_size == 0) {
    std::map<int, int> votes;
    for (const Dump& d : a.dumps) ++votes[d.world_size];
    int best = 0;
    for (auto [size, v] : votes) {
      if (v >= best) {
        best = v;
        a.world_size = size;
      }
    }
  }
  for (const Dump& d : a.dumps) {
    if (d.world_size != a.world_size) {
      a.notes.push_back(fmt::format("{} says world_size {}, the others {}", d.source, d.world_size,
                                    a.world_size));
    }
  }

  std::map<int, const Dump*> by_rank;
  for (const Dump& d : a.dumps) by_rank[d.rank] = &d;
  std::map<int, std::string> why_missing;
  for (const auto& [rank, why] : set.unanswered) why_missing[rank] = why;
  for (int rank = 0; rank < a.world_size; ++rank) {
    if (by_rank.count(rank) == 0) {
      auto it = why_missing.find(rank);
      a.missing.emplace_back(rank, it == why_missing.end() ? kNoDump : it->second);
    }
  }

  // Groups by id, in the order the dumps list them (lowest rank first).
  std::vector<std::string> order;
  std::map<std::string, const GroupDump*> reference;
  for (const Dump& d : a.dumps) {
    for (const GroupDump& g : d.groups) {
      if (reference.emplace(g.id, &g).second) order.push_back(g.id);
    }
  }
  for (const std::string& id : order) {
    const GroupDump& ref = *reference[id];
    GroupAnalysis g;
    g.name = ref.name;
    g.id = id;
    g.size = ref.size;
    g.global_ranks = ref.global_ranks;
    for (int r = 0; r < g.size; ++r) {
      Member m;
      m.group_rank = r;
      m.rank = g.global_ranks[r];
      g.numbering_differs = g.numbering_differs || m.rank != r;
      auto it = by_rank.find(m.rank);
      if (it == by_rank.end()) {
        auto why = why_missing.find(m.rank);
        m.why_no_dump = why == why_missing.end() ? kNoDump : why->second;
      } else {
        for (const GroupDump& gd : it->second->groups) {
          if (gd.id != id) continue;
          if (gd.size != ref.size || gd.global_ranks != ref.global_ranks || gd.rank != r) {
            g.notes.push_back(fmt::format(
                "{} sees group \"{}\" otherwise: size {}, global_ranks differ or its group rank "
                "is {}, not {}",
                it->second->source, g.name, gd.size, gd.rank, r));
          }
          m.dump = &gd;
          m.process = it->second;
        }
        if (m.dump == nullptr) {
          m.why_no_dump =
              fmt::format("its dump ({}) has no group \"{}\" (not created yet there, or destroyed)",
                          it->second->source, g.name);
        }
      }
      g.members.push_back(std::move(m));
    }
    analyze_group(g);
    a.groups.push_back(std::move(g));
  }
  a.verdict = verdict(a);
  return a;
}

std::string render_text(const Analysis& a) {
  std::string out;
  auto line = [&](const std::string& text) { out += text + "\n"; };

  int64_t first = INT64_MAX, last = 0;
  for (const Dump& d : a.dumps) {
    if (d.dumped_at_ns == 0) continue;
    first = std::min(first, d.dumped_at_ns);
    last = std::max(last, d.dumped_at_ns);
  }
  std::string span;
  if (last != 0 && a.dumps.size() > 1) {
    span = last == first ? ", taken at the same instant"
                         : fmt::format(", taken within {} of each other", duration(last - first));
  }
  line(fmt::format("weft-trace: {} {} of job {} (world size {}){}", a.dumps.size(),
                   a.dumps.size() == 1 ? "dump" : "dumps",
                   a.job.empty() ? "(unknown)" : "\"" + a.job + "\"", a.world_size, span));
  // Every dump when they are few; else the earliest (they carry the trigger), with a count.
  std::vector<const Dump*> listed;
  for (const Dump& d : a.dumps) listed.push_back(&d);
  if (listed.size() > kListedDumps) {
    std::stable_sort(listed.begin(), listed.end(), [](const Dump* x, const Dump* y) {
      return x->dumped_at_ns < y->dumped_at_ns;
    });
    listed.resize(kListedDumps / 2);
  }
  for (const Dump* d : listed) {
    line(fmt::format("  rank {}: {} ({} pid {}): {}", d->rank, d->source,
                     d->host.empty() ? "?" : d->host, d->pid, d->reason.empty() ? "-" : d->reason));
  }
  if (listed.size() < a.dumps.size()) {
    line(fmt::format("  ... the earliest {} of {} dumps; --json lists them all", listed.size(),
                     a.dumps.size()));
  }
  for (const Ignored& i : a.ignored) line(fmt::format("  ignored {}: {}", i.source, i.why));
  for (const auto& [rank, why] : a.missing) line(fmt::format("  rank {}: {}", rank, why));
  for (const std::string& note : a.notes) line("  note: " + note);

  for (const GroupAnalysis& g : a.groups) {
    line("");
    std::vector<int> world;
    for (const Member& m : g.members) world.push_back(m.rank);
    std::string header =
        fmt::format("group \"{}\" (id \"{}\"), {} ranks: {}", g.name, g.id, g.size,
                    g.numbering_differs ? "world ranks " + rank_list(world) : rank_list(world));
    line(header);
    if (g.numbering_differs) {
      line(
          "  ranks below are world ranks (as the launcher numbers them); group ranks are "
          "named as such");
    }
    for (const std::string& note : g.notes) line("  note: " + note);
    if (g.all_done) {
      line(fmt::format("  all {} ranks completed #{}; nothing pending", g.size, g.done_seq));
      continue;
    }

    line(g.numbering_differs ? "   rank  group rank  last issued  last started  last completed  "
                               "oldest pending (or newest) operation"
                             : "   rank  last issued  last started  last completed  oldest pending "
                               "(or newest) operation");
    for (const Member& m : g.members) {
      std::string cols = g.numbering_differs ? fmt::format("  {:>5}  {:>10}", m.rank, m.group_rank)
                                             : fmt::format("  {:>5}", m.rank);
      if (m.dump == nullptr) {
        line(fmt::format("{}  {}", cols, m.why_no_dump));
        continue;
      }
      const GroupDump& d = *m.dump;
      // What holds the rank up: the oldest collective it has not completed (it runs them in
      // order) when its ring still has it, else the newest operation it recorded.
      std::string newest = "(empty ring)";
      const Entry* shown = d.last_queued_seq > d.last_completed_seq
                               ? entry_at(d, d.last_completed_seq + 1)
                               : nullptr;
      if (shown == nullptr && d.running_started_ns != 0 && d.running_seq != 0) {
        // Issued so far ahead that the ring no longer holds it (benchmarks issue every iteration
        // before they wait): the dump still says what runs.
        newest =
            fmt::format("#{}: started {} before its dump, still running (no longer in the ring)",
                        d.running_seq, duration(m.process->dumped_at_ns - d.running_started_ns));
      } else {
        if (shown == nullptr && !d.entries.empty()) shown = &d.entries.back();
        if (shown != nullptr) {
          newest = describe(*shown) + ": " + timeline(*shown, m.process->dumped_at_ns);
        }
      }
      line(fmt::format("{}  {:>11}  {:>12}  {:>14}  {}", cols,
                       "#" + std::to_string(d.last_queued_seq),
                       "#" + std::to_string(d.last_started_seq),
                       "#" + std::to_string(d.last_completed_seq), newest));
    }

    if (g.behind.empty()) {
      line("  behind: no rank (every rank with a dump issued and completed as much as the others)");
    }
    for (const Behind& b : g.behind) {
      const GroupDump& d = *b.member->dump;
      std::string what =
          b.op.empty() ? fmt::format("#{}", b.seq) : fmt::format("{} #{}", b.op, b.seq);
      std::string last = b.last_op == nullptr
                             ? "its ring is empty"
                             : fmt::format("{}: {}", describe(*b.last_op),
                                           timeline(*b.last_op, b.member->process->dumped_at_ns));
      if (b.not_issued) {
        line(
            fmt::format("  behind: {} has not issued {}: it stopped after #{}; its newest "
                        "operation is {}",
                        member_name(*b.member), what, d.last_queued_seq, last));
      } else {
        line(fmt::format("  behind: {} has not completed {}, which other ranks completed: {}",
                         member_name(*b.member), what, last));
      }
    }
    for (const Waiting& w : g.waiting) {
      std::string when;
      if (w.members.size() == 1) {
        when = timeline(*w.entry, w.members.front()->process->dumped_at_ns);
      } else {
        when = w.state == "failed" && !w.entry->error_code.empty()
                   ? "failed with " + w.entry->error_code
                   : w.state;
      }
      line(fmt::format("  waiting: {} {} in {}: {}", members_name(w.members),
                       w.members.size() == 1 ? "is" : "are", describe(*w.entry), when));
    }

    const Mismatch& mm = g.mismatch;
    if (!mm.checked) {
      line(fmt::format("  mismatch: not checked: {}", mm.why_not_checked));
    } else if (!mm.found) {
      line(fmt::format("  mismatch: none in #{}..#{} (the seqs every rank still holds)", mm.from,
                       mm.to));
    } else {
      std::string agree = mm.seq == mm.from
                              ? fmt::format("#{} is the oldest seq every rank holds", mm.from)
                              : fmt::format("#{}..#{} agree", mm.from, mm.seq - 1);
      line(fmt::format("  mismatch: first at #{} ({}); each rank's call:", mm.seq, agree));
      for (const auto& [m, e] : mm.calls) {
        line(fmt::format("    {}: {}", member_name(*m), call_fields(*e)));
      }
    }
    if (!mm.wrapped.empty()) {
      std::vector<const Member*> wrapped(mm.wrapped.begin(), mm.wrapped.end());
      const GroupDump& d = *wrapped.front()->dump;
      line(
          fmt::format("  note: the rings of {} wrapped (e.g. recorded {} > capacity {}): the "
                      "mismatch search starts at #{}, the oldest seq every rank still holds",
                      members_name(wrapped), d.recorded, d.capacity, mm.from));
    }

    for (const Member* m : g.missing) {
      line(fmt::format("  {}: {}", member_name(*m), m->why_no_dump));
    }
    if (!g.errors.empty()) line("  first error of each rank:");
    for (const ErrorInfo& e : g.errors) {
      Member m;
      m.rank = e.rank;
      m.group_rank = e.group_rank;
      line(fmt::format("    {}: {} #{}: {}: {}", member_name(m), e.entry->op, e.entry->seq,
                       e.entry->error_code.empty() ? "failed" : e.entry->error_code,
                       e.short_message));
    }
  }
  line("");
  line(a.verdict.empty() ? "verdict: none clear; read the groups above" : "verdict: " + a.verdict);
  return out;
}

std::string render_json(const Analysis& a) {
  ordered_json j;
  j["job"] = a.job;
  j["world_size"] = a.world_size;
  j["dumps"] = ordered_json::array();
  for (const Dump& d : a.dumps) {
    ordered_json x;
    x["rank"] = d.rank;
    x["source"] = d.source;
    x["host"] = d.host;
    x["pid"] = d.pid;
    x["reason"] = d.reason;
    x["dumped_at_ns"] = d.dumped_at_ns;
    j["dumps"].push_back(x);
  }
  j["ignored"] = ordered_json::array();
  for (const Ignored& i : a.ignored) j["ignored"].push_back({{"source", i.source}, {"why", i.why}});
  j["notes"] = a.notes;
  j["missing_ranks"] = ordered_json::array();
  for (const auto& [rank, why] : a.missing) j["missing_ranks"].push_back(rank);
  j["groups"] = ordered_json::array();
  for (const GroupAnalysis& g : a.groups) {
    ordered_json x;
    x["name"] = g.name;
    x["id"] = g.id;
    x["size"] = g.size;
    x["global_ranks"] = g.global_ranks;
    x["members"] = ordered_json::array();
    for (const Member& m : g.members) {
      ordered_json y;
      y["rank"] = m.rank;
      y["group_rank"] = m.group_rank;
      y["dump"] = m.dump != nullptr;
      if (m.dump == nullptr) {
        y["why_no_dump"] = m.why_no_dump;
      } else {
        y["last_queued_seq"] = m.dump->last_queued_seq;
        y["last_started_seq"] = m.dump->last_started_seq;
        y["last_completed_seq"] = m.dump->last_completed_seq;
        y["last_op"] = entry_json(m.dump->entries.empty() ? nullptr : &m.dump->entries.back());
        y["first_error"] = nullptr;
        for (const ErrorInfo& e : g.errors) {
          if (e.rank == m.rank) y["first_error"] = error_json(e);
        }
      }
      x["members"].push_back(y);
    }
    x["all_done"] = g.all_done;
    if (g.all_done) x["done_seq"] = g.done_seq;
    x["behind"] = ordered_json::array();
    for (const Behind& b : g.behind) {
      ordered_json y;
      y["rank"] = b.rank;
      y["group_rank"] = b.group_rank;
      y["kind"] = b.not_issued ? "not_issued" : "not_completed";
      y["seq"] = b.seq;
      y["op"] = b.op;
      y["last_issued_seq"] = b.member->dump->last_queued_seq;
      y["last_completed_seq"] = b.member->dump->last_completed_seq;
      y["last_op"] = entry_json(b.last_op);
      x["behind"].push_back(y);
    }
    x["waiting"] = ordered_json::array();
    for (const Waiting& w : g.waiting) {
      ordered_json y;
      y["ranks"] = ranks_json(w.members, false);
      y["group_ranks"] = ranks_json(w.members, true);
      y["seq"] = w.seq;
      y["op"] = w.op;
      y["state"] = w.state;
      y["call"] = entry_json(w.entry);
      x["waiting"].push_back(y);
    }
    const Mismatch& mm = g.mismatch;
    ordered_json y;
    y["checked"] = mm.checked;
    if (mm.checked) {
      y["from"] = mm.from;
      y["to"] = mm.to;
    } else {
      y["why_not_checked"] = mm.why_not_checked;
    }
    std::vector<const Member*> wrapped(mm.wrapped.begin(), mm.wrapped.end());
    y["wrapped_ranks"] = ranks_json(wrapped, false);
    y["first"] = nullptr;
    if (mm.found) {
      ordered_json calls = ordered_json::array();
      for (const auto& [m, e] : mm.calls) {
        ordered_json c;
        c["rank"] = m->rank;
        c["group_rank"] = m->group_rank;
        ordered_json entry = entry_json(e);
        for (auto it = entry.begin(); it != entry.end(); ++it) c[it.key()] = it.value();
        calls.push_back(c);
      }
      y["first"] = {{"seq", mm.seq}, {"calls", calls}};
    }
    x["mismatch"] = y;
    x["missing"] = ordered_json::array();
    for (const Member* m : g.missing) {
      x["missing"].push_back(
          {{"rank", m->rank}, {"group_rank", m->group_rank}, {"why", m->why_no_dump}});
    }
    x["errors"] = ordered_json::array();
    for (const ErrorInfo& e : g.errors) x["errors"].push_back(error_json(e));
    x["notes"] = g.notes;
    j["groups"].push_back(x);
  }
  j["verdict"] = a.verdict.empty() ? ordered_json(nullptr) : ordered_json(a.verdict);
  return j.dump(2) + "\n";
}

}  // namespace weft::trace
