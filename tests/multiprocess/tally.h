// The pass/fail tally of the multi-process test programs: one line per check on stdout (ok)
// or stderr (FAIL), and the summary line "rank R: N passed, M failed" (its exit status).
// Every multi-process test program that counts checks counts them here (docs/development.md).
// Not thread-safe: check from one thread at a time.
#pragma once
#include <cstdarg>
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

// printf into a string, for a check's detail.
__attribute__((format(printf, 1, 2))) inline std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  char buf[512];
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

// The summary line; the program's exit status. `about` follows the rank in it
// ("rank 0/4 [shm]: 93 passed, 0 failed" with about "/4 [shm]").
inline int finish(const std::string& about = "") {
  std::printf("rank %d%s: %d passed, %d failed\n", rank, about.c_str(), passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace tally
