// Waiting on shared-memory flags: back-off, deadlines, liveness, abort propagation.
#include "comm/backends/shm/shm_sync.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace lockstep::comm::shm {

WaitPolicy WaitPolicy::for_group(int local_ranks) {
  WaitPolicy p;
  cpu_set_t set;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (local_ranks > cores) {
    // A spinning waiter would steal the core of the rank it waits for.
    p.spin_iters = 0;
    p.yield_window = std::chrono::microseconds(100);
  }
  // LOCKSTEP_SHM_SPIN=<iterations> overrides (0: never spin, e.g. on a busy shared host).
  if (const char* v = std::getenv("LOCKSTEP_SHM_SPIN"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 100000000)
      throw ConfigError(
          detail::concat("LOCKSTEP_SHM_SPIN=", v, ": expected a spin iteration count >= 0"));
    p.spin_iters = static_cast<int>(n);
    if (n == 0) p.yield_window = std::chrono::microseconds(100);
  }
  return p;
}

// Layout: bit 63 set | kind (8 bits) | by_rank + 1 (16 bits) | peer + 1 (16 bits).
uint64_t encode_failure(const Failure& f) {
  return (uint64_t{1} << 63) | (static_cast<uint64_t>(f.kind) & 0xff) << 32 |
         (static_cast<uint64_t>(f.by_rank + 1) & 0xffff) << 16 |
         (static_cast<uint64_t>(f.peer + 1) & 0xffff);
}

Failure decode_failure(uint64_t w) {
  Failure f;
  f.kind = static_cast<CommError::Kind>((w >> 32) & 0xff);
  f.by_rank = static_cast<int>((w >> 16) & 0xffff) - 1;
  f.peer = static_cast<int>(w & 0xffff) - 1;
  return f;
}

bool process_gone(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A dead child stays a zombie until its parent reaps it, and kill() still
  // succeeds on zombies; /proc tells them apart ("pid (comm) Z ...").
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // comm may itself contain ')'
  if (paren == nullptr || paren[1] == '\0' || paren[2] == '\0') return false;
  return paren[2] == 'Z' || paren[2] == 'X';
}

Waiter::Waiter(const Segment& seg, const std::vector<pid_t>& pids, int rank,
               const WaitPolicy& policy, const OpContext& ctx, CommContext base,
               const std::atomic<bool>& local_abort)
    : seg_(seg),
      pids_(pids),
      rank_(rank),
      policy_(policy),
      ctx_(ctx),
      base_(std::move(base)),
      local_abort_(local_abort) {}

bool Waiter::detect_failure(Clock::time_point now, int peer, bool full) {
  const uint64_t word = seg_.header().abort_word.load(std::memory_order_acquire);
  if (word != 0) {
    const Failure f = decode_failure(word);
    pending_ = f;
    pending_what_ =
        f.kind == CommError::Kind::Aborted
            ? detail::concat("the group was aborted (by rank ", f.by_rank, ")")
            : detail::concat("rank ", f.by_rank, " failed: ", CommError::kind_name(f.kind),
                             f.peer >= 0 ? detail::concat(" (rank ", f.peer, ")") : "");
    // From our side, the rank that failed us is the one at fault, or else the one
    // that gave up (when we ourselves are "at fault", e.g. we arrived too late).
    if ((f.peer < 0 || f.peer == rank_) && f.by_rank != rank_) pending_.peer = f.by_rank;
    return true;
  }
  if (local_abort_.load(std::memory_order_acquire)) {
    pending_ = Failure{CommError::Kind::Aborted, rank_, -1};
    pending_what_ = "the group was aborted";
    return true;
  }
  if (now >= ctx_.deadline) {
    pending_ = Failure{CommError::Kind::Timeout, rank_, peer};
    pending_what_ =
        peer >= 0 ? detail::concat("timed out waiting for rank ", peer) : std::string("timed out");
    return true;
  }
  if (!full) return false;
  const int P = static_cast<int>(pids_.size());
  for (int r = 0; r < P; ++r) {
    if (r == rank_ || (peer >= 0 && r != peer)) continue;
    if (process_gone(pids_[r])) {
      pending_ = Failure{CommError::Kind::PeerGone, rank_, r};
      pending_what_ = detail::concat("rank ", r, " (pid ", pids_[r], ") exited");
      return true;
    }
  }
  return false;
}

void Waiter::raise_pending() {
  // Publish our own findings (first writer wins) so peers stop waiting too.
  if (pending_.by_rank == rank_) {
    uint64_t expected = 0;
    seg_.header().abort_word.compare_exchange_strong(expected, encode_failure(pending_),
                                                     std::memory_order_acq_rel);
  }
  CommContext c = base_;
  c.peer = pending_.peer;
  c.elapsed_s = std::chrono::duration<double>(Clock::now() - ctx_.start).count();
  throw CommError(pending_.kind, c, pending_what_);
}

void Waiter::fail(CommError::Kind kind, int peer, const std::string& what) {
  pending_ = Failure{kind, rank_, peer};
  pending_what_ = what;
  raise_pending();
}

void Waiter::back_off(Clock::duration slow_for) const {
  if (slow_for < policy_.yield_window) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(policy_.nap);
  }
}

}  // namespace lockstep::comm::shm
