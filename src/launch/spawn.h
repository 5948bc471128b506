// spawn.h (internal): starting one rank as a child process in its own process group.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace lockstep::launch {

struct SpawnedRank {
  pid_t pid = -1;      // also the process-group id (the rank leads its own group)
  int out_fd = -1;     // read end of the rank's stdout pipe (non-blocking, close-on-exec)
  int err_fd = -1;     // read end of the rank's stderr pipe
  int exec_errno = 0;  // non-zero: execvp failed with this errno; the child is reaped, fds closed
};

// Forks and execs argv (PATH lookup as execvp) with exactly envp as its environment and
// /dev/null as stdin (a rank in a background process group reading the terminal would be
// stopped by SIGTTIN). Throws lockstep::Error when pipes or fork fail.
SpawnedRank spawn_rank(const std::vector<std::string>& argv, const std::vector<std::string>& envp);

}  // namespace lockstep::launch
