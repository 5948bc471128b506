#include "signal_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/error.h"

namespace lockstep::launch {
namespace {

// The one piece of process-wide state: a signal handler can only reach a global. It holds
// the write end of the current SignalPipe, or -1.
volatile sig_atomic_t g_write_fd = -1;

constexpr int kSignals[5] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE};

extern "C" void on_signal(int sig) {
  int saved = errno;  // write() may clobber errno of the interrupted code
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_write_fd >= 0) (void)!write(g_write_fd, &b, 1);  // pipe full: a wakeup is pending anyway
  errno = saved;
}

}  // namespace

SignalPipe::SignalPipe() {
  if (g_write_fd != -1) throw Error("lockstep-run: only one SignalPipe may exist at a time");
  if (pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("lockstep-run: pipe: ") + std::strerror(errno));
  g_write_fd = fds_[1];
  for (int i = 0; i < 5; ++i) {
    struct sigaction sa = {};
    sa.sa_handler = kSignals[i] == SIGPIPE ? SIG_IGN : on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (kSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigaction(kSignals[i], &sa, &old_[i]);
  }
}

SignalPipe::~SignalPipe() {
  for (int i = 0; i < 5; ++i) sigaction(kSignals[i], &old_[i], nullptr);
  g_write_fd = -1;
  close(fds_[0]);
  close(fds_[1]);
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> sigs;
  unsigned char buf[64];
  for (;;) {
    ssize_t n = read(fds_[0], buf, sizeof buf);
    if (n > 0) {
      sigs.insert(sigs.end(), buf, buf + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: empty
  }
  return sigs;
}

}  // namespace lockstep::launch
