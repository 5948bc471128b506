// signal_pipe.h (internal): turns asynchronous signals into bytes on a pipe, so the
// launcher's poll() loop wakes up for SIGCHLD / SIGINT / SIGTERM / SIGHUP without races.
#pragma once

#include <csignal>
#include <vector>

namespace lockstep::launch {

// Installs the handlers in the constructor and restores the previous dispositions in the
// destructor. At most one may exist at a time (signal handlers are process-wide); the
// constructor throws lockstep::Error otherwise. Also ignores SIGPIPE, so a closed stdout of
// the launcher makes writes fail instead of killing it and orphaning the ranks.
class SignalPipe {
 public:
  SignalPipe();
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int read_fd() const { return fds_[0]; }
  // The signals delivered since the last call, in arrival order (non-blocking).
  std::vector<int> drain();

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_[5] = {};
};

}  // namespace lockstep::launch
