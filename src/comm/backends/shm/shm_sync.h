// Internal: waiting on shared-memory flags without hanging forever.
//
// Every wait in the shm backend goes through Waiter::wait_until, which:
//  - spins briefly (a peer on another core answers in ~100 ns), then yields
//    (a ~1 us syscall when nobody else wants the core; measured faster than long
//    spins on a loaded 2-core host),
//    then sleeps in short naps, so 4 ranks on 2 cores still make progress;
//  - checks the op's deadline (-> CommError Timeout), the peers' liveness every
//    few ms (-> PeerGone naming the rank; a zombie counts as gone), and the
//    segment's abort word (-> the failure another rank published, so all ranks
//    raise the same kind promptly instead of waiting out their timeouts).
// The readiness predicate is always re-checked before a failure is raised, so a
// wait that was satisfied never throws because of a failure that came later.
#pragma once

#include "comm/backends/shm/shm_segment.h"

#include <lockstep/error.h>

#include <sys/types.h>

#include <atomic>
#include <string>
#include <vector>

namespace lockstep::comm::shm {

// How waits burn CPU. Oversubscribed groups (more ranks than cores) skip spinning;
// LOCKSTEP_SHM_SPIN=<iterations> overrides the spin length.
struct WaitPolicy {
  int spin_iters = 200;  // short: sched_yield costs ~1 us and is kinder on busy hosts
  Clock::duration yield_window = std::chrono::microseconds(500);
  Clock::duration nap = std::chrono::microseconds(50);
  Clock::duration liveness_every = std::chrono::milliseconds(5);
  static WaitPolicy for_group(int local_ranks);
};

// The abort word: one 64-bit value, first writer wins, re-raised by every rank.
struct Failure {
  CommError::Kind kind = CommError::Kind::Aborted;
  int by_rank = -1;  // who published it
  int peer = -1;     // the rank at fault (PeerGone/Timeout), -1 if none
};
uint64_t encode_failure(const Failure& f);
Failure decode_failure(uint64_t word);

// True when `pid` has exited (ESRCH) or is a zombie nobody has reaped yet.
bool process_gone(pid_t pid);

// One op's view of the world while it waits. Cheap to build per op.
class Waiter {
 public:
  Waiter(const Segment& seg, const std::vector<pid_t>& pids, int rank, const WaitPolicy& policy,
         const OpContext& ctx, CommContext base, const std::atomic<bool>& local_abort);

  // Blocks until ready() is true. `peer` is who we wait on (for messages and the
  // liveness check); -1 means any rank of the group.
  template <typename Ready>
  void wait_until(Ready&& ready, int peer) {
    if (ready()) return;
    for (int i = 0; i < policy_.spin_iters; ++i) {
      cpu_relax();
      if (ready()) return;
    }
    const Clock::time_point slow_since = Clock::now();
    Clock::time_point next_live = slow_since;
    for (;;) {
      if (ready()) return;
      const Clock::time_point now = Clock::now();
      const bool full = now >= next_live;
      if (full) next_live = now + policy_.liveness_every;
      if (detect_failure(now, peer, full)) {
        if (ready()) return;
        raise_pending();
      }
      back_off(now - slow_since);
    }
  }

  // Throws at once if the group is already broken (aborted or failed earlier).
  void raise_if_failed() {
    if (detect_failure(Clock::time_point::min(), -1, false)) raise_pending();
  }
  // Raises (and publishes) a failure of this rank, e.g. a descriptor mismatch.
  [[noreturn]] void fail(CommError::Kind kind, int peer, const std::string& what);
  const CommContext& context() const { return base_; }

 private:
  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  // Looks for abort/deadline (always) and dead peers (when `full`); records what it
  // found so raise_pending() can throw it after the caller re-checked readiness.
  bool detect_failure(Clock::time_point now, int peer, bool full);
  [[noreturn]] void raise_pending();
  void back_off(Clock::duration slow_for) const;

  const Segment& seg_;
  const std::vector<pid_t>& pids_;
  const int rank_;
  const WaitPolicy& policy_;
  const OpContext& ctx_;
  CommContext base_;
  const std::atomic<bool>& local_abort_;
  Failure pending_;
  std::string pending_what_;
};

}  // namespace lockstep::comm::shm
