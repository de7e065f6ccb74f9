// weft_trace_analysis.h: reads flight-recorder dumps, merges those of one job and says which rank
// is behind, on what, and whether the ranks called the same collectives. The engine of weft-trace
// (tools/weft_trace.cc); docs/flight-recorder.md gives the dump format (version 1) and the store
// protocol this file implements.
//
//   DumpSet set = load_dumps({"/tmp/crash"});            // a directory or files
//   Analysis a = analyze(set);
//   std::fputs(render_text(a).c_str(), stdout);
//
// Rank numbering: every rank this file reports is a world rank (what the launcher calls the
// process); group ranks appear next to it, named as such, where the two differ.
//
// Errors: a file that cannot be read, is not JSON, is not a weft-trace dump, has a version this
// reader does not know, or lacks a field the format requires throws TraceError naming the file
// and what is wrong. Dumps of another job are not errors: load and analyze list them as ignored.
// Thread safety: no shared state; every function may run on any thread.
//
// JSON output (render_json), one object:
//   job            the job's id ("" when no dump knew it)
//   world_size     the world size the dumps agree on
//   dumps          [{rank, source, host, pid, reason, dumped_at_ns}] the dumps analysed, by rank
//   ignored        [{source, why}] dumps (or store replies) left out
//   notes          [string] anything else worth knowing (dumps disagreeing on world_size, ...)
//   missing_ranks  [int] world ranks 0..world_size-1 with no dump
//   groups         one per group id, in the order the lowest rank's dump lists them:
//     name, id, size, global_ranks (group rank r is world rank global_ranks[r])
//     members      [{rank, group_rank, dump: bool, why_no_dump (when dump is false),
//                    last_queued_seq, last_started_seq, last_completed_seq,
//                    last_op (an entry, below, or null), first_error ({rank, group_rank, seq, op,
//                    error_code, message, short_message}, or null)}]
//     all_done     true when every member completed the same last seq with nothing pending;
//                  done_seq is that seq
//     behind       [{rank, group_rank, kind: "not_issued" | "not_completed", seq (what it has
//                    not issued / completed), op (the others' op at seq), last_issued_seq,
//                    last_completed_seq, last_op (entry or null)}]
//     waiting      [{ranks, group_ranks, seq, op, state, call (entry of the lowest rank)}]
//                  the ranks not behind, grouped by the oldest operation they have not completed
//     mismatch     {checked: bool, from, to (the seq range every member still holds),
//                   why_not_checked (string, when checked is false), wrapped_ranks ([int]),
//                   first (null, or {seq, calls: [{rank, group_rank, ...entry}]})}
//     missing      [{rank, group_rank, why}] members without a dump of this group
//     errors       [first_error of each member that has one]
//     notes        [string] members that see the group otherwise (size, global_ranks)
//   verdict        one sentence naming the likely culprit, or null when none is clear
// An entry is {id, seq, op, dtype, count_in, count_out, reduce_op, root, peer, tag, fingerprint,
// algorithm, state, queued_ns, started_ns, ended_ns, error_code, error, describe (the call as
// error messages print it: "all_reduce #10 (float32 x 8, sum)")}.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace weft {
class Store;
}

namespace weft::trace {

// A dump this reader cannot use; what() is "SOURCE: what is wrong".
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One recorded operation (docs/flight-recorder.md, "Per entry").
struct Entry {
  uint64_t id = 0;
  uint64_t seq = 0;  // 0 for send and recv
  std::string op;
  std::string dtype;
  int64_t count_in = 0;
  int64_t count_out = 0;
  std::string reduce_op;
  int64_t root = -1;  // a group rank
  int64_t peer = -1;  // a group rank; -2: any source
  int64_t tag = 0;
  int64_t fingerprint = 0;
  std::string algorithm;
  std::string state;  // queued, started, completed, failed
  int64_t queued_ns = 0;
  int64_t started_ns = 0;
  int64_t ended_ns = 0;
  int64_t thread = 0;
  std::string error_code;
  std::string error;
};

// One process's view of one group.
struct GroupDump {
  std::string name;
  std::string id;
  int rank = 0;  // in the group
  int size = 0;
  std::vector<int> global_ranks;
  uint64_t capacity = 0;
  uint64_t recorded = 0;
  uint64_t last_queued_seq = 0;
  uint64_t last_started_seq = 0;
  uint64_t last_completed_seq = 0;
  // The operation running at the dump ("running", kept outside the ring): seq 0 and started 0
  // when none ran (or the dump predates the field).
  uint64_t running_seq = 0;
  int64_t running_started_ns = 0;
  std::vector<Entry> entries;  // oldest first
};

// One file (or one store reply).
struct Dump {
  std::string source;  // the file's path, or "store reply weft/trace/reply/<n>/<rank>"
  std::string job;
  int rank = 0;
  int world_size = 0;
  std::string host;
  int64_t pid = 0;
  std::string weft_version;
  std::string reason;
  int64_t dumped_at_ns = 0;
  std::vector<GroupDump> groups;
};

struct Ignored {
  std::string source;
  std::string why;
};

// What analyze() works on: the dumps and what was left out before it saw them.
struct DumpSet {
  std::vector<Dump> dumps;
  std::vector<Ignored> ignored;
  std::vector<std::string> notes;
  // The job and world size when known from elsewhere (the store); "" / 0: from the dumps.
  std::string job;
  int world_size = 0;
  // Ranks asked for a dump that gave none, and why ("no dump (dead or unreachable)").
  std::vector<std::pair<int, std::string>> unanswered;
};

// Parses one dump. Throws TraceError("SOURCE: ...") when it is not a valid version-1 dump.
Dump parse_dump(const std::string& text, const std::string& source);

// Reads and parses one file. Throws TraceError naming the file.
Dump load_dump_file(const std::string& path);

// The dump files in dir: every weft-trace-rank*.json, by rank. Throws TraceError when dir
// cannot be read.
std::vector<std::string> find_dump_files(const std::string& dir);

// Each path is a directory (its dump files) or a file. Throws TraceError on the first file that
// fails and when there is no dump at all.
DumpSet load_dumps(const std::vector<std::string>& paths);

// Asks a live job for dumps through its store (mode "store" of docs/flight-recorder.md): reads
// weft/trace/world_size (waiting up to timeout), makes a request, waits for the replies of ranks
// 0..world_size-1 until timeout after the request, then deletes the request and reply keys.
// Ranks that do not answer are listed in unanswered. Throws TraceError when the store holds no
// weft/trace/world_size after timeout (no weft job with a flight recorder uses it), and
// weft::Error for the store's own failures.
DumpSet request_dumps(Store& store, std::chrono::milliseconds timeout, const std::string& reason);

struct Member {
  int rank = -1;                    // world rank
  int group_rank = -1;              // rank in this group
  const GroupDump* dump = nullptr;  // null: no dump of this group for this rank
  const Dump* process = nullptr;    // the file it came from, when dump is set
  std::string why_no_dump;
};

struct ErrorInfo {
  int rank = -1;
  int group_rank = -1;
  const Entry* entry = nullptr;
  std::string short_message;  // the message after "<context>: <Code>: ", shortened
};

struct Behind {
  int rank = -1;
  int group_rank = -1;
  bool not_issued = true;  // false: issued it, but has not completed it
  uint64_t seq = 0;        // the seq it has not issued / completed
  std::string op;          // the others' op at seq ("" when nobody holds it)
  const Member* member = nullptr;
  const Entry* last_op = nullptr;  // its newest entry
};

struct Waiting {
  std::vector<const Member*> members;
  uint64_t seq = 0;
  std::string op;
  std::string state;
  const Entry* entry = nullptr;  // the lowest rank's
};

struct Mismatch {
  bool checked = false;
  std::string why_not_checked;
  uint64_t from = 0, to = 0;
  std::vector<const Member*> wrapped;
  bool found = false;
  uint64_t seq = 0;
  std::vector<std::pair<const Member*, const Entry*>> calls;  // at seq, every member holding it
};

struct GroupAnalysis {
  std::string name;
  std::string id;
  int size = 0;
  std::vector<int> global_ranks;
  bool numbering_differs = false;  // some group rank is not its world rank
  std::vector<Member> members;     // by group rank
  bool all_done = false;
  uint64_t done_seq = 0;
  std::vector<Behind> behind;
  std::vector<Waiting> waiting;
  Mismatch mismatch;
  std::vector<const Member*> missing;
  std::vector<ErrorInfo> errors;
  std::vector<std::string> notes;
};

// Owns its dumps; groups point into them, so an Analysis is moved, never copied.
struct Analysis {
  std::vector<Dump> dumps;  // by rank
  std::vector<Ignored> ignored;
  std::vector<std::string> notes;
  std::string job;
  int world_size = 0;
  std::vector<std::pair<int, std::string>> missing;  // world ranks without a dump, and why
  std::vector<GroupAnalysis> groups;
  std::string verdict;  // "" when none is clear

  Analysis() = default;
  Analysis(Analysis&&) = default;
  Analysis& operator=(Analysis&&) = default;
  Analysis(const Analysis&) = delete;
  Analysis& operator=(const Analysis&) = delete;
};

// Keeps the dumps of one job (the store's, else the one most dumps name; dumps with job "" are
// kept), drops duplicates of a rank (keeping the newest), and analyses every group.
Analysis analyze(DumpSet set);

// The call as weft's error messages print it: "all_reduce #10 (float32 x 8, sum)".
std::string describe(const Entry& entry);

std::string render_text(const Analysis& analysis);
std::string render_json(const Analysis& analysis);  // pretty-printed, ends with a newline

}  // namespace weft::trace
