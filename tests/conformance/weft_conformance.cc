// weft-conformance: the conformance suite (conformance_test.cc) as an installed program, for
// plugin authors: it runs every collective family against a backend named on the command line,
// built-in or plugin (by name through WEFT_PLUGIN_PATH and the install's plugin directory, or by
// path), without weft's build tree, and ends with a table of families and results.
//
//   weft-conformance --plugin ./libweft-backend-mine.so --only all_reduce,p2p
//   weft-conformance --plugin mine --unsupported=report   # a partial plugin: what it lacks
//   weft-conformance --symmetric                           # tcp, every tensor in symmetric memory
//
// The options set the suite's environment variables (WEFT_TEST_BACKEND, WEFT_TEST_UNSUPPORTED,
// WEFT_TEST_WORLD_SIZES, WEFT_TEST_FULL, WEFT_TEST_SYMMETRIC) and its Catch2 test spec; what
// follows `--` goes to Catch2 as is (e.g. `-- --durations yes`). Exit status: 0 when every family
// run passed (or, under --unsupported=report, passed or was unsupported), 1 when one failed, 2 for
// a usage error.
#define CATCH_CONFIG_RUNNER
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/backend.h"
#include "weft/error.h"

#include "tests/conformance/conformance_report.h"

namespace {

constexpr std::string_view kUsage = R"(usage: weft-conformance [options] [-- catch2 options]

Runs weft's conformance suite (every collective, dtype, op and form, on 1 to 8 real processes,
checked element by element) against one backend, then prints a table of the families run.

options:
  --plugin NAME|PATH    the backend under test: a plugin's name (libweft-backend-NAME.so, looked
                        up in WEFT_PLUGIN_PATH, then the install's plugin directory), a path to
                        the plugin's .so, or a built-in backend (default: tcp)
  --backend NAME|PATH   the same as --plugin
  --only F1,F2,...      run only these families (--list shows them)
  --skip F1,F2,...      run every family but these
  --unsupported=MODE    fail (default): an operation the backend reports Unsupported fails its
                        family; report: it is listed in the table as unsupported, not failed
  --world-sizes N,M,... run these world sizes only (default 1,2,3,4,5,8)
  --full                the whole cross product (world sizes 1 to 8, every form): minutes
  --symmetric           every tensor in a symmetric buffer of its group (tcp with shared memory
                        only; docs/symmetric-memory.md), and the symmetric family runs
  --list                list the families and their test cases, then exit
  -h, --help            this text
)";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "weft-conformance: %s\n(weft-conformance --help lists the options)\n",
               message.c_str());
  std::exit(2);
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    if (std::string_view item = text.substr(0, comma); !item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

// A test case's family: its tag other than [conformance].
std::string family_of(const Catch::TestCaseInfo& info) {
  for (const std::string& tag : info.tags) {
    if (tag != "conformance") return tag;
  }
  return "?";
}

// Families in the order the suite declares them, each with its test cases' names.
std::vector<std::pair<std::string, std::vector<std::string>>> families() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const Catch::TestCase& test : Catch::getRegistryHub().getTestCaseRegistry().getAllTests()) {
    const std::string family = family_of(test);
    auto it =
        std::find_if(out.begin(), out.end(), [&](const auto& f) { return f.first == family; });
    if (it == out.end()) it = out.insert(out.end(), {family, {}});
    it->second.push_back(test.name);
  }
  return out;
}

struct Row {
  std::string family;
  std::string name;
  bool failed = false;
  std::vector<weft::conformance::UnsupportedNote> unsupported;
  double seconds = 0;
};

std::vector<Row>& rows() {
  static std::vector<Row> table;
  return table;
}

// Records each test case's outcome for the table, with the suite's unsupported notes.
class TableListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    weft::conformance::unsupported_notes().clear();
    start_ = std::chrono::steady_clock::now();
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    Row row;
    row.family = family_of(stats.testInfo);
    row.name = stats.testInfo.name;
    row.failed = stats.totals.assertions.failed > 0;
    row.unsupported = weft::conformance::unsupported_notes();
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    rows().push_back(std::move(row));
    TestEventListenerBase::testCaseEnded(stats);
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

CATCH_REGISTER_LISTENER(TableListener)

void print_table(const std::string& backend) {
  std::printf("\nweft-conformance: backend %s\n", backend.c_str());
  std::printf("%-16s %-12s %8s  %s\n", "family", "result", "seconds", "detail");
  for (const Row& row : rows()) {
    std::string result = row.failed ? "FAIL" : "pass";
    std::string detail;
    if (!row.unsupported.empty()) {
      if (!row.failed) result = "unsupported";
      std::vector<int> sizes;
      for (const auto& note : row.unsupported) sizes.push_back(note.world_size);
      detail = fmt::format("world sizes {}: {}", fmt::join(sizes, ","), row.unsupported[0].what);
    } else if (row.failed) {
      detail = "see the failures above";
    }
    std::printf("%-16s %-12s %8.1f  %s\n", row.family.c_str(), result.c_str(), row.seconds,
                detail.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "tcp";
  std::vector<std::string> only, skip, catch_args;
  std::string unsupported = "fail";
  bool list = false;
  bool symmetric = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    // --name VALUE or --name=VALUE.
    auto value = [&](std::string_view name) -> std::optional<std::string> {
      if (arg == name) {
        if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", name));
        return std::string(argv[++i]);
      }
      if (arg.starts_with(name) && arg.size() > name.size() && arg[name.size()] == '=') {
        return std::string(arg.substr(name.size() + 1));
      }
      return std::nullopt;
    };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage.data(), stdout);
      return 0;
    } else if (arg == "--") {
      for (++i; i < argc; ++i) catch_args.emplace_back(argv[i]);
    } else if (auto v = value("--plugin")) {
      backend = *v;
    } else if (auto v = value("--backend")) {
      backend = *v;
    } else if (auto v = value("--only")) {
      for (auto& f : split_list(*v)) only.push_back(f);
    } else if (auto v = value("--skip")) {
      for (auto& f : split_list(*v)) skip.push_back(f);
    } else if (auto v = value("--unsupported")) {
      if (*v != "fail" && *v != "report") {
        usage_error(fmt::format("--unsupported={}: expected fail or report", *v));
      }
      unsupported = *v;
    } else if (auto v = value("--world-sizes")) {
      setenv("WEFT_TEST_WORLD_SIZES", v->c_str(), 1);
    } else if (arg == "--full") {
      setenv("WEFT_TEST_FULL", "1", 1);
    } else if (arg == "--symmetric") {
      symmetric = true;
    } else if (arg == "--list") {
      list = true;
    } else {
      usage_error(fmt::format("unknown argument \"{}\"", arg));
    }
  }

  const auto known = families();
  if (list) {
    for (const auto& [family, tests] : known) {
      std::printf("%s\n", family.c_str());
      for (const std::string& name : tests) std::printf("    %s\n", name.c_str());
    }
    return 0;
  }
  std::set<std::string> known_names;
  for (const auto& f : known) known_names.insert(f.first);
  for (const auto* names : {&only, &skip}) {
    for (const std::string& f : *names) {
      if (!known_names.contains(f)) {
        usage_error(
            fmt::format("no family \"{}\"; the families are: {}", f, fmt::join(known_names, ", ")));
      }
    }
  }

  // A path is made absolute (the ranks resolve it, and a backend string with a '/' is a path);
  // either way the backend is resolved here first, so that a missing or refused plugin is one
  // message, not one per rank and world size.
  if (backend.find('/') != std::string::npos) {
    std::error_code ec;
    backend = std::filesystem::absolute(backend, ec).string();
  }
  try {
    weft::Registry::global().resolve(backend);
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "weft-conformance: backend %s: %s\n", backend.c_str(), e.what());
    return 2;
  }
  setenv("WEFT_TEST_BACKEND", backend.c_str(), 1);
  setenv("WEFT_TEST_UNSUPPORTED", unsupported.c_str(), 1);
  if (symmetric) {
    if (backend != "tcp") {
      usage_error(fmt::format("--symmetric runs on the tcp backend only, not {}", backend));
    }
    setenv("WEFT_TEST_SYMMETRIC", "1", 1);
  } else if (std::find(only.begin(), only.end(), "symmetric") == only.end()) {
    skip.push_back("symmetric");  // its checks need symmetric memory: a pass would say nothing
  }

  // The Catch2 spec: "[a]~[s],[b]~[s]" (a comma is "or", juxtaposition "and").
  std::string spec;
  std::string excluded;
  for (const std::string& f : skip) excluded += "~[" + f + "]";
  if (only.empty()) {
    spec = excluded.empty() ? "[conformance]" : "[conformance]" + excluded;
  } else {
    for (const std::string& f : only)
      spec += (spec.empty() ? "" : ",") + ("[" + f + "]") + excluded;
  }
  std::vector<std::string> args = {argv[0], spec};
  args.insert(args.end(), catch_args.begin(), catch_args.end());
  std::vector<char*> catch_argv;
  for (std::string& a : args) catch_argv.push_back(a.data());

  Catch::Session session;
  if (const int rc =
          session.applyCommandLine(static_cast<int>(catch_argv.size()), catch_argv.data());
      rc != 0) {
    return 2;
  }
  const int failed = session.run();
  print_table(backend);
  if (rows().empty()) {
    std::fprintf(stderr, "weft-conformance: no test case matched %s\n", spec.c_str());
    return 1;
  }
  return failed == 0 ? 0 : 1;
}
