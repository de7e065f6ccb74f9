// tests/conformance/conformance_report.h: what the conformance suite (conformance_test.cc) tells
// the program that runs it beyond pass and fail: the cases a backend does not support, noted
// under WEFT_TEST_UNSUPPORTED=report. weft-conformance (weft_conformance.cc) prints them as a
// table; the meson test's runner ignores them.
//
// Thread safety: none needed; the suite runs its test cases one at a time on the main thread (the
// ranks are processes, which report through their output).
#pragma once

#include <string>
#include <vector>

namespace weft::conformance {

struct UnsupportedNote {
  int world_size = 0;
  std::string what;  // the Error(Unsupported)'s text, from the first rank that reported it
};

// The notes of the running test case so far; the runner clears it when a case starts.
std::vector<UnsupportedNote>& unsupported_notes();

}  // namespace weft::conformance
