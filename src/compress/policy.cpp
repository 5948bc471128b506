// Per-layer compression policy and its environment overrides (see policy.h).
#include <lockstep/compress/policy.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace lockstep::compress {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v;  // nullptr when unset; "" is a value (e.g. EXCLUDE="" = exclude nothing)
}

int64_t parse_int(const char* var, const char* v, int64_t lo, int64_t hi, const char* what) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi)
    throw ConfigError(lockstep::detail::concat(var, "='", v, "' is not valid: expected ", what));
  return x;
}

}  // namespace

void validate(const QsgdOptions& o) {
  LOCKSTEP_CHECK((o.bits >= 1 && o.bits <= 8) || o.bits == 32,
                 "QsgdOptions::bits must be 1..8 or 32 (off), got ", o.bits);
  LOCKSTEP_CHECK(o.bucket_size >= 1 && o.bucket_size <= (int64_t(1) << 24),
                 "QsgdOptions::bucket_size must be 1..2^24, got ", o.bucket_size);
  LOCKSTEP_CHECK(o.min_layer >= 0, "QsgdOptions::min_layer must be >= 0, got ", o.min_layer);
  LOCKSTEP_CHECK(o.pipeline_chunk >= 0, "QsgdOptions::pipeline_chunk must be >= 0, got ",
                 o.pipeline_chunk);
}

QsgdOptions apply_env(QsgdOptions o) {
  if (const char* v = env("LOCKSTEP_COMPRESSION_BITS")) {
    const int64_t b = parse_int("LOCKSTEP_COMPRESSION_BITS", v, 1, 32, "1..8, or 32 for off");
    if (b > 8 && b != 32)
      throw ConfigError(lockstep::detail::concat("LOCKSTEP_COMPRESSION_BITS='", v,
                                                 "' is not valid: expected 1..8, or 32 for off"));
    o.bits = int(b);
  }
  if (const char* v = env("LOCKSTEP_COMPRESSION_BUCKET_SIZE"))
    o.bucket_size = parse_int("LOCKSTEP_COMPRESSION_BUCKET_SIZE", v, 1, int64_t(1) << 24,
                              "an element count in 1..16777216");
  if (const char* v = env("LOCKSTEP_COMPRESSION_MIN_LAYER"))
    o.min_layer =
        parse_int("LOCKSTEP_COMPRESSION_MIN_LAYER", v, 0, INT64_MAX, "an element count >= 0");
  if (const char* v = env("LOCKSTEP_COMPRESSION_EXCLUDE")) {
    o.exclude.clear();
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) o.exclude.push_back(item);
  }
  if (const char* v = env("LOCKSTEP_COMPRESSION_ERROR_FEEDBACK"))
    o.error_feedback = parse_int("LOCKSTEP_COMPRESSION_ERROR_FEEDBACK", v, 0, 1, "0 or 1") != 0;
  if (const char* v = env("LOCKSTEP_COMPRESSION_SEED"))
    o.seed = uint64_t(parse_int("LOCKSTEP_COMPRESSION_SEED", v, 0, INT64_MAX, "an integer >= 0"));
  validate(o);
  return o;
}

std::optional<QsgdOptions> options_from_env() {
  if (!env("LOCKSTEP_COMPRESSION_BITS")) return std::nullopt;
  return apply_env(QsgdOptions{});
}

bool should_compress(const QsgdOptions& o, const std::string& name, int64_t numel) {
  if (!o.enabled() || numel < o.min_layer || numel == 0) return false;
  for (const auto& pat : o.exclude)
    if (!pat.empty() && name.find(pat) != std::string::npos) return false;
  return true;
}

}  // namespace lockstep::compress
