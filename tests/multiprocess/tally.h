// The pass/fail tally of the multi-process equivalence programs: one line per check on
// stdout (ok) or stderr (FAIL), and the summary line "rank R: N passed, M failed".
#pragma once
#include <cstdio>
#include <string>

namespace tally {

inline int passed = 0, failed = 0, rank = 0;
inline const char* subject = "result";  // "max |<subject> - reference|"

// A difference against its tolerance (NaN fails).
inline void report(const std::string& what, double diff, double tol) {
  const bool ok = diff <= tol;
  (ok ? passed : failed)++;
  std::fprintf(ok ? stdout : stderr, "rank %d %s %s: max |%s - reference| = %.3g (tol %.1g)\n",
               rank, ok ? "ok  " : "FAIL", what.c_str(), subject, diff, tol);
}

inline void check(const std::string& what, bool ok, const std::string& detail = "") {
  (ok ? passed : failed)++;
  std::fprintf(ok ? stdout : stderr, "rank %d %s %s%s%s\n", rank, ok ? "ok  " : "FAIL",
               what.c_str(), detail.empty() ? "" : ": ", detail.c_str());
}

// The summary line; the program's exit status.
inline int finish() {
  std::printf("rank %d: %d passed, %d failed\n", rank, passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace tally
