// Waiting on shared-memory flags: back-off, deadlines, liveness, abort propagation.
#include "comm/backends/shm/shm_sync.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace lockstep::comm::shm {

WaitPolicy WaitPolicy::for_group(int local_ranks) {
  WaitPolicy p;
  cpu_set_t set;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (local_ranks > cores) {
    // A spinning waiter would steal the core of the rank it waits for.
    p.spin = Clock::duration::zero();
    p.yield_window = std::chrono::microseconds(100);
  }
  // LOCKSTEP_SHM_SPIN=<microseconds> overrides (0: sleep at once, e.g. on a busy host).
  if (const char* v = std::getenv("LOCKSTEP_SHM_SPIN"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n > 10000000)
      throw ConfigError(lockstep::detail::concat(
          "LOCKSTEP_SHM_SPIN=", v, ": expected microseconds of spinning, 0 to 10000000"));
    p.spin = std::chrono::microseconds(n);
    if (n == 0) p.yield_window = std::chrono::microseconds(100);
  }
  return p;
}

namespace {
// The futex word of a progress counter: its low 32 bits, which change on every post.
uint32_t* futex_word(Progress& p) {
  static_assert(sizeof(std::atomic<uint64_t>) == 8, "a plain 64-bit counter");
  auto* w = reinterpret_cast<uint32_t*>(&p.value);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  ++w;
#endif
  return w;
}
}  // namespace

void futex_sleep(Progress& p, uint64_t seen, Clock::duration timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::max(timeout, Clock::duration(std::chrono::microseconds(10))))
                      .count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // EAGAIN (the word moved on), EINTR, ETIMEDOUT: the caller re-checks in every case.
  ::syscall(SYS_futex, futex_word(p), FUTEX_WAIT, static_cast<uint32_t>(seen), &ts, nullptr, 0);
}

void futex_wake(Progress& p) {
  ::syscall(SYS_futex, futex_word(p), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

PeerPoller::PeerPoller(int rank, const std::vector<pid_t>& pids, const WaitPolicy& policy)
    : rank_(rank), pids_(pids), every_(policy.liveness_every) {
  // Every rank of an shm group runs on this machine; PeerWatch needs its id to agree.
  const std::vector<std::string> ids(pids.size(), machine_id());
  peers_ = PeerWatch(rank, ids, pids, policy.stop_limit);
}

int PeerPoller::check(Clock::time_point now, int peer, std::string* what) {
  next_ = now + every_;
  std::string found;
  const int r = peers_.empty() ? -1 : peers_.check(&found);
  // A rank we do not wait on may have finished and left (send/recv between others).
  if (r >= 0 && (peer < 0 || r == peer)) {
    *what = std::move(found);
    return r;
  }
  // No comparable pid namespace (PeerWatch watches nobody), or it named another
  // rank: whether the one we wait on exited.
  for (int q = 0; q < static_cast<int>(pids_.size()); ++q) {
    if (q == rank_ || (peer >= 0 && q != peer) || !process_exited(pids_[q])) continue;
    *what = lockstep::detail::concat("rank ", q, " (pid ", pids_[q], ") exited");
    return q;
  }
  return -1;
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

void wake_all(const Segment& seg) {
  for (int r = 0; r < seg.config().world_size; ++r) futex_wake(seg.progress(r));
}

Waiter::Waiter(const Segment& seg, PeerPoller& peers, int rank, const WaitPolicy& policy,
               const OpContext& ctx, CommContext base, const std::atomic<bool>& local_abort)
    : seg_(seg),
      peers_(peers),
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
            ? lockstep::detail::concat("the group was aborted (by rank ", f.by_rank, ")")
            : lockstep::detail::concat(
                  "rank ", f.by_rank, " failed: ", CommError::kind_name(f.kind),
                  f.peer >= 0 ? lockstep::detail::concat(" (rank ", f.peer, ")") : "");
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
    pending_what_ = peer >= 0 ? lockstep::detail::concat("timed out waiting for rank ", peer)
                              : std::string("timed out");
    return true;
  }
  if (!full) return false;
  std::string what;
  const int gone = peers_.check(now, peer, &what);
  if (gone < 0) return false;
  pending_ = Failure{CommError::Kind::PeerGone, rank_, gone};
  pending_what_ = std::move(what);
  return true;
}

void Waiter::sleep(Progress& p, uint64_t target, Clock::time_point now) {
  p.sleepers.fetch_add(1, std::memory_order_seq_cst);
  const uint64_t seen = p.value.load(std::memory_order_seq_cst);
  if (seen < target) {
    const Clock::time_point until = std::min(ctx_.deadline, peers_.next_due());
    futex_sleep(p, seen, std::min<Clock::duration>(until - now, policy_.liveness_every));
  }
  p.sleepers.fetch_sub(1, std::memory_order_release);
}

void Waiter::raise_pending() {
  // Publish our own findings (first writer wins) so peers stop waiting too.
  if (pending_.by_rank == rank_) {
    uint64_t expected = 0;
    if (seg_.header().abort_word.compare_exchange_strong(expected, encode_failure(pending_),
                                                         std::memory_order_acq_rel))
      wake_all(seg_);
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
