#include "spawn.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <csignal>
#include <cstring>

#include "lockstep/error.h"

extern char** environ;

namespace lockstep::launch {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void close_all(std::initializer_list<int> fds) {
  for (int fd : fds)
    if (fd >= 0) close(fd);
}

// Runs in the forked child: only async-signal-safe calls until exec.
[[noreturn]] void exec_child(char** argv, char** envp, int out_w, int err_w, int status_w,
                             pid_t launcher) {
  setpgid(0, 0);  // own group: the launcher's killpg reaches the rank's own children too
#ifdef __linux__
  // If the launcher is SIGKILLed it cannot tear down; let the kernel send SIGTERM instead.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher) _exit(1);  // the launcher already died before prctl
#endif
  // The launcher's handlers vanish at exec, but ignored signals and the mask are inherited.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT})
    sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0 && devnull != 0) {
    dup2(devnull, 0);
    close(devnull);
  }
  dup2(out_w, 1);  // dup2 clears close-on-exec on the copies
  dup2(err_w, 2);
  environ = envp;
  execvp(argv[0], argv);
  int e = errno;
  (void)!write(status_w, &e, sizeof e);
  _exit(127);
}

}  // namespace

SpawnedRank spawn_rank(const std::vector<std::string>& argv, const std::vector<std::string>& envp) {
  // Build every C array before fork: the child may not allocate.
  std::vector<char*> cargv = c_strings(argv), cenvp = c_strings(envp);
  int out[2], err[2], status[2];
  // Close-on-exec everywhere: a rank must not hold another rank's pipe open, or the
  // launcher would never see EOF on it.
  if (pipe2(out, O_CLOEXEC) != 0)
    throw Error(std::string("lockstep-run: pipe: ") + std::strerror(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close_all({out[0], out[1]});
    throw Error(std::string("lockstep-run: pipe: ") + std::strerror(errno));
  }
  if (pipe2(status, O_CLOEXEC) != 0) {
    close_all({out[0], out[1], err[0], err[1]});
    throw Error(std::string("lockstep-run: pipe: ") + std::strerror(errno));
  }
  pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close_all({out[0], out[1], err[0], err[1], status[0], status[1]});
    throw Error(std::string("lockstep-run: fork: ") + std::strerror(e));
  }
  if (pid == 0) exec_child(cargv.data(), cenvp.data(), out[1], err[1], status[1], launcher);

  setpgid(pid,
          pid);  // also here, so killpg works even before the child ran (EACCES after exec is fine)
  close_all({out[1], err[1], status[1]});
  SpawnedRank r;
  r.pid = pid;
  r.out_fd = out[0];
  r.err_fd = err[0];
  fcntl(r.out_fd, F_SETFL, O_NONBLOCK);
  fcntl(r.err_fd, F_SETFL, O_NONBLOCK);
  // The status pipe closes at a successful exec (close-on-exec) or carries execvp's errno.
  int e = 0;
  ssize_t n;
  do n = read(status[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  close(status[0]);
  if (n == sizeof e) {
    r.exec_errno = e;
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    close_all({r.out_fd, r.err_fd});
    r.out_fd = r.err_fd = -1;
  }
  return r;
}

}  // namespace lockstep::launch
