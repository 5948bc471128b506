// init()'s options from InitOptions and the LOCKSTEP_* environment (init_options.h).
#include "comm/init_options.h"

#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include <strings.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep::comm {
namespace {

constexpr double kMaxTimeoutS = 30 * 24 * 3600;  // 30 days: far beyond any op, no overflow

// A number of seconds in [lo, kMaxTimeoutS] from the environment variable `name`, if set;
// otherwise nothing. `lo_text` says the lower bound in the error message.
std::optional<Millis> env_seconds(const char* name, double lo, const char* lo_text) {
  const char* s = env_value(name);
  if (s == nullptr) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= lo && v <= kMaxTimeoutS))
    throw ConfigError(lockstep::detail::concat(
        name, "='", s, "' is not a number of seconds between ", lo_text, " and ", kMaxTimeoutS));
  return Millis(static_cast<int64_t>(v * 1000));
}

Millis default_timeout(const InitOptions& o) {
  if (o.timeout) return *o.timeout;
  return env_seconds(lockstep::env::kTimeoutSeconds, 0.001, "0.001")
      .value_or(ProcessGroupOptions{}.timeout);
}

void check_timeout(Millis t) {
  if (t.count() < 1 || t.count() > kMaxTimeoutS * 1000)
    throw ConfigError(lockstep::detail::concat("InitOptions::timeout of ", t.count(),
                                               " ms is outside 1 ms .. ", kMaxTimeoutS, " s"));
}

bool check_collectives(const InitOptions& o) {
  if (o.check_collectives) return *o.check_collectives;
  if (const char* s = env_value(lockstep::env::kCheckCollectives)) {
    const std::string v = s;
    if (v != "0" && v != "1")
      throw ConfigError(
          lockstep::detail::concat(lockstep::env::kCheckCollectives, "='", v, "' must be 0 or 1"));
    return v == "1";
  }
  return true;
}

// LOCKSTEP_DEBUG=DETAIL (any case) turns on the fingerprint check on every backend.
bool debug_detail(const InitOptions& o) {
  if (o.detail) return *o.detail;
  const char* s = env_value(lockstep::env::kDebug);
  return s != nullptr && strcasecmp(s, lockstep::env::kDebugDetail) == 0;
}

Millis stall_warn(const InitOptions& o) {
  if (o.stall_warn) return *o.stall_warn;
  return env_seconds(lockstep::env::kStallWarnSeconds, 0, "0 (never warn)")
      .value_or(ProcessGroupOptions{}.stall_warn);
}

}  // namespace

const char* env_value(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

ProcessGroupOptions group_options(const InitOptions& options) {
  ProcessGroupOptions pgo;
  pgo.timeout = default_timeout(options);
  check_timeout(pgo.timeout);
  pgo.check_collectives = check_collectives(options);
  pgo.detail = debug_detail(options);
  pgo.stall_warn = stall_warn(options);
  return pgo;
}

bool debug_on() {
  const char* s = env_value(lockstep::env::kDebug);
  return s != nullptr && std::string_view(s) != "0";
}

bool hier_requested(const InitOptions& o) {
  const char* b = env_value(lockstep::env::kBackend);
  return o.backend == "hier" || (o.backend == "auto" && b != nullptr && std::string(b) == "hier");
}

}  // namespace lockstep::comm
