// Internal: waiting on shared-memory flags without hanging forever.
//
// Every wait in the shm backend goes through Waiter::wait_until, which:
//  - spins (a peer on another core answers in ~100 ns) for up to WaitPolicy::spin,
//    reading only the flag and, every 64 turns, the clock (vDSO: no syscall);
//  - then, for progress counters (the collectives), sleeps in futex_wait on the
//    counter's low 32 bits after counting itself in the counter's `sleepers`; the
//    owner's post() makes the wake syscall only when `sleepers` is nonzero, so a
//    collective whose ranks arrive within the spin window makes no syscall at all.
//    Other flags (send/recv rings) yield, then nap, as before;
//  - checks the op's deadline (-> CommError Timeout), the peers' liveness (-> PeerGone
//    naming the rank: exited, a zombie, or stopped by SIGSTOP for longer than
//    WaitPolicy::stop_limit; checked at most every liveness_every, across ops, and only
//    once spinning is over), and the segment's abort word (-> the failure another rank
//    published, so all ranks raise the same kind promptly instead of waiting out their
//    timeouts). Whoever publishes a failure or aborts wakes every sleeper.
// The readiness predicate is always re-checked before a failure is raised, so a
// wait that was satisfied never throws because of a failure that came later.
#pragma once

#include "comm/backends/shm/shm_segment.h"
#include "comm/peer_watch.h"

#include <lockstep/error.h>

#include <sched.h>
#include <sys/types.h>

#include <atomic>
#include <string>
#include <vector>

namespace lockstep::comm::shm {

// How waits burn CPU. Oversubscribed groups (more ranks than cores) skip spinning;
// LOCKSTEP_SHM_SPIN=<microseconds> overrides the spin length.
struct WaitPolicy {
  // Pure spinning: covers a peer on another core that arrives a little later, with
  // no syscall at all.
  Clock::duration spin = std::chrono::microseconds(10);
  // Then sched_yield (~1 us each): lets a peer that shares our core (a loaded host)
  // run at once. Then sleep: futex on progress counters, naps on rings.
  Clock::duration yield_window = std::chrono::microseconds(200);
  Clock::duration nap = std::chrono::microseconds(50);
  Clock::duration liveness_every = std::chrono::milliseconds(5);
  Clock::duration stop_limit = std::chrono::seconds(3);  // SIGSTOPped this long: failed
  static WaitPolicy for_group(int local_ranks);
};

// Futex helpers on a progress counter (process-shared: the segment is MAP_SHARED).
// Sleeps until the counter's low 32 bits differ from `seen`, a wake, or `timeout`.
void futex_sleep(Progress& p, uint64_t seen, Clock::duration timeout);
// Wakes every rank asleep on `p`.
void futex_wake(Progress& p);
// Wakes every sleeper of the group (after publishing a failure or an abort).
void wake_all(const Segment& seg);
// Bumps `p` to `value` (release) and wakes sleepers, if any (one load of a line we own).
inline void publish(Progress& p, uint64_t value) {
  // seq_cst store + load: a waiter that counted itself in `sleepers` before reading the
  // old value is seen here (both sides are in the single total order of seq_cst ops).
  p.cpu.store(sched_getcpu(), std::memory_order_relaxed);  // glibc: rseq or vDSO, no syscall
  p.value.store(value, std::memory_order_seq_cst);
  if (p.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(p);
}

// The abort word: one 64-bit value, first writer wins, re-raised by every rank.
struct Failure {
  CommError::Kind kind = CommError::Kind::Aborted;
  int by_rank = -1;  // who published it
  int peer = -1;     // the rank at fault (PeerGone/Timeout), -1 if none
};
uint64_t encode_failure(const Failure& f);
Failure decode_failure(uint64_t word);

// The waits' poll of the peers: whether the group's other ranks are still there (exited
// or a zombie, or stopped by SIGSTOP for longer than the limit: comm's PeerWatch, where
// this machine's pids can be read; otherwise exits only). Rate-limited across ops: a run
// of short waits that each outlast the spin pays the /proc reads once per
// WaitPolicy::liveness_every, not once per wait.
class PeerPoller {
 public:
  PeerPoller() = default;
  PeerPoller(int rank, const std::vector<pid_t>& pids, const WaitPolicy& policy);
  bool due(Clock::time_point now) const { return now >= next_; }
  Clock::time_point next_due() const { return next_; }
  // Checks now (and schedules the next check): the failed rank, described in *what,
  // or -1 if all is well. With `peer` >= 0 only that rank counts: others may have
  // finished and left (send/recv between other ranks).
  int check(Clock::time_point now, int peer, std::string* what);

 private:
  int rank_ = -1;
  std::vector<pid_t> pids_;
  PeerWatch peers_;
  Clock::duration every_{};
  Clock::time_point next_{};
};

// One op's view of the world while it waits. Cheap to build per op (no allocation).
class Waiter {
 public:
  Waiter(const Segment& seg, PeerPoller& peers, int rank, const WaitPolicy& policy,
         const OpContext& ctx, CommContext base, const std::atomic<bool>& local_abort);

  // Blocks until ready() is true. `peer` is who we wait on (for messages); -1 means
  // any rank of the group. With `sleep_on` (the progress counter ready() watches for
  // `target`), sleeps on it once spinning is over; otherwise yields, then naps.
  template <typename Ready>
  void wait_until(Ready&& ready, int peer, Progress* sleep_on = nullptr, uint64_t target = 0) {
    if (ready()) return;
    // A peer that last ran on our CPU cannot answer while we spin: go yield at once.
    const bool alone =
        sleep_on == nullptr || sleep_on->cpu.load(std::memory_order_relaxed) != sched_getcpu();
    const Clock::time_point spin_from = Clock::now();
    for (uint32_t i = 1; alone; ++i) {
      cpu_relax();
      if (ready()) return;
      if ((i & 63) == 0 && Clock::now() - spin_from >= policy_.spin) break;
    }
    const Clock::time_point slow_since = Clock::now();
    for (;;) {
      if (ready()) return;
      const Clock::time_point now = Clock::now();
      if (detect_failure(now, peer, peers_.due(now))) {
        if (ready()) return;
        raise_pending();
      }
      if (sleep_on != nullptr && now - slow_since >= policy_.yield_window)
        sleep(*sleep_on, target, now);
      else
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
  // One futex sleep on `p` until it reaches `target`, bounded by the next liveness
  // check and the deadline (so both are still checked on time).
  void sleep(Progress& p, uint64_t target, Clock::time_point now);

  const Segment& seg_;
  PeerPoller& peers_;
  const int rank_;
  const WaitPolicy& policy_;
  const OpContext& ctx_;
  CommContext base_;
  const std::atomic<bool>& local_abort_;
  Failure pending_;
  std::string pending_what_;
};

}  // namespace lockstep::comm::shm
