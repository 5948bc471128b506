// Internal: how the shm allreduce moves a large tensor, chosen by measurement.
//
// Cached (the default): staging writes are ordinary stores, so a peer reads each
//   chunk out of the cache both cores share. Fastest when they share the last-level
//   cache (one die).
// Streaming: staging writes bypass the cache (non-temporal stores) and peers read
//   them from memory. Much faster when the ranks' cores do NOT share a last-level
//   cache (two dies or sockets, or a VM whose vCPUs the host spreads over dies),
//   where reading lines another die has just modified is slow. Slower otherwise.
// Which case holds may change while a job runs (a host migrates vCPUs) and a VM's
// reported topology does not show it, so rank 0 times both paths and picks; its
// choice travels in the collective's descriptor and every rank follows it.
//
// Policy, per size class (powers of two from kMinBytes; ops below it stay Cached):
// try each path once, then take the path with the lower cost (median of its last
// three seconds-per-byte samples), and every kProbeEvery-th op of the class try the
// other one, so a change of the machine's state is noticed within two probes.
// LOCKSTEP_SHM_PATH=cached|streaming fixes the path (rank 0's setting decides).
#pragma once

#include <array>
#include <cstdint>

namespace lockstep::comm::shm {

enum class ShmPath : int32_t { Cached = 0, Streaming = 1 };
enum class PathMode { Auto, Cached, Streaming };

// LOCKSTEP_SHM_PATH: unset/empty/"auto", "cached" or "streaming"; anything else
// throws ConfigError naming the valid values.
PathMode path_mode_from_environment();
const char* path_name(ShmPath p);

class PathChooser {
 public:
  static constexpr uint64_t kMinBytes = uint64_t{4} << 20;
  static constexpr int kProbeEvery = 16;

  explicit PathChooser(PathMode mode = PathMode::Auto) : mode_(mode) {}
  // The path for an op of `bytes`.
  ShmPath choose(uint64_t bytes);
  // How long the data phase of an op of `bytes` took on `path`.
  void record(ShmPath path, uint64_t bytes, double seconds);
  // Seconds per byte: median of the last samples of `path` in the class of `bytes`,
  // 0 if none yet (for tests and diagnostics).
  double cost(ShmPath path, uint64_t bytes) const;

 private:
  static constexpr int kSamples = 3;
  struct PathStats {
    std::array<double, kSamples> s{};
    int n = 0;  // samples recorded (the ring holds the last kSamples)
  };
  struct SizeClass {
    std::array<PathStats, 2> path;
    uint64_t ops = 0;
  };
  static int size_class(uint64_t bytes);
  PathMode mode_;
  std::array<SizeClass, 64> classes_{};
};

}  // namespace lockstep::comm::shm
