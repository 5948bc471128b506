// Choosing the shm allreduce's path by measurement (see path_choice.h).
#include "comm/backends/shm/path_choice.h"

#include <lockstep/error.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace lockstep::comm::shm {

PathMode path_mode_from_environment() {
  const char* v = std::getenv("LOCKSTEP_SHM_PATH");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return PathMode::Auto;
  if (std::strcmp(v, "cached") == 0) return PathMode::Cached;
  if (std::strcmp(v, "streaming") == 0) return PathMode::Streaming;
  throw ConfigError(
      lockstep::detail::concat("LOCKSTEP_SHM_PATH=", v, ": expected auto, cached or streaming"));
}

const char* path_name(ShmPath p) { return p == ShmPath::Streaming ? "streaming" : "cached"; }

int PathChooser::size_class(uint64_t bytes) {
  int c = 0;
  while (c < 63 && (bytes >> (c + 1)) != 0) ++c;  // floor(log2(bytes))
  return c;
}

ShmPath PathChooser::choose(uint64_t bytes) {
  if (mode_ == PathMode::Cached) return ShmPath::Cached;
  if (mode_ == PathMode::Streaming) return ShmPath::Streaming;
  if (bytes < kMinBytes) return ShmPath::Cached;
  SizeClass& c = classes_[size_class(bytes)];
  const uint64_t op = c.ops++;
  if (c.path[0].n == 0) return ShmPath::Cached;
  if (c.path[1].n == 0) return ShmPath::Streaming;
  const ShmPath best = cost(ShmPath::Cached, bytes) <= cost(ShmPath::Streaming, bytes)
                           ? ShmPath::Cached
                           : ShmPath::Streaming;
  if (op % kProbeEvery != 0) return best;
  return best == ShmPath::Cached ? ShmPath::Streaming : ShmPath::Cached;
}

void PathChooser::record(ShmPath path, uint64_t bytes, double seconds) {
  if (mode_ != PathMode::Auto || bytes < kMinBytes) return;
  PathStats& p = classes_[size_class(bytes)].path[static_cast<int>(path)];
  p.s[p.n % kSamples] = seconds / static_cast<double>(bytes);
  ++p.n;
}

double PathChooser::cost(ShmPath path, uint64_t bytes) const {
  const PathStats& p = classes_[size_class(bytes)].path[static_cast<int>(path)];
  static_assert(kSamples == 3, "the median below is of three samples");
  if (p.n == 0) return 0;
  if (p.n == 1) return p.s[0];
  if (p.n == 2) return std::max(p.s[0], p.s[1]);
  const double a = p.s[0], b = p.s[1], c = p.s[2];
  return std::max(std::min(a, b), std::min(std::max(a, b), c));
}

}  // namespace lockstep::comm::shm
