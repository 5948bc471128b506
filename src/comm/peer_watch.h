// Internal: watching the peers of a group that run on this machine, by pid.
//
// One component for every backend that can see its peers' processes: shm (all ranks on
// this machine), gloo and mpi (the ranks that share this machine). A peer counts as local
// when it runs under the same kernel boot and in the same pid namespace: only then does
// its pid mean the same process here. Checking costs a kill(pid, 0) and one small /proc
// read per peer, so a waiting op can do it every few milliseconds and notice a dead
// neighbour at once, without any network.
#pragma once

#include <lockstep/comm/types.h>

#include <sys/types.h>

#include <string>
#include <vector>

namespace lockstep::comm {

// "<boot id>/<pid namespace>": equal for two processes iff their pids are comparable.
// LOCKSTEP_LIVENESS_LOCAL=0 makes it unique to this process (no peer counts as local);
// empty when it cannot be read (then no peer counts as local either).
std::string machine_id();

// The state letter of /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...): 'X' when the process
// is gone, '?' when it cannot be read (then nothing is concluded) or pid <= 0.
char process_state(pid_t pid);

// True when `pid` (> 0) has exited or is a zombie nobody has reaped yet: kill() still
// succeeds on a zombie, /proc tells them apart.
bool process_exited(pid_t pid);

class PeerWatch {
 public:
  PeerWatch() = default;
  // ids[r], pids[r]: every rank's machine_id() and pid. Ranks other than `me` with this
  // machine's id are watched. A peer stopped (SIGSTOP, state T) for longer than
  // `stop_limit` counts as failed: it will not answer before the op's deadline.
  PeerWatch(int me, const std::vector<std::string>& ids, const std::vector<pid_t>& pids,
            Clock::duration stop_limit);

  // The first watched rank that exited (or is a zombie) or has stayed stopped past the
  // limit, with a description in *what ("rank 2 (pid 812, this host) exited"); -1 if none.
  // Not thread-safe: one caller at a time.
  int check(std::string* what);
  bool empty() const { return peers_.empty(); }

 private:
  struct Peer {
    int rank = -1;
    pid_t pid = 0;
    Clock::time_point stopped_since{};  // zero: running
    Clock::time_point resumed_at{};     // when it last ran again after a long stop
  };
  std::vector<Peer> peers_;
  Clock::duration stop_limit_{};
};

}  // namespace lockstep::comm
