// Watching same-machine peers by pid: exited, zombie, or stopped for too long (peer_watch.h).
#include "comm/peer_watch.h"

#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace lockstep::comm {
namespace {

constexpr Clock::duration kLongStop = std::chrono::seconds(1);  // not a scheduling blip
constexpr Clock::duration kRecent = std::chrono::seconds(2);

}  // namespace

char process_state(pid_t pid) {
  if (pid <= 0) return '?';  // kill(0 or -n, 0) would ask about process groups
  if (::kill(pid, 0) != 0 && errno == ESRCH) return 'X';
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 'X' : '?';
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return '?';
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // comm may itself contain ')'
  if (paren == nullptr || paren[1] == '\0' || paren[2] == '\0') return '?';
  return paren[2];
}

bool process_exited(pid_t pid) {
  const char s = process_state(pid);
  return s == 'X' || s == 'Z';
}

std::string machine_id() {
  if (const char* v = std::getenv(env::kLivenessLocal); v && std::string(v) == "0")
    return lockstep::detail::concat("pid-", ::getpid());  // unique: no peer counts as local
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (boot.empty() || n <= 0) return {};  // unknown: no peer counts as local
  return boot + "/" + std::string(ns, static_cast<size_t>(n));
}

PeerWatch::PeerWatch(int me, const std::vector<std::string>& ids, const std::vector<pid_t>& pids,
                     Clock::duration stop_limit)
    : stop_limit_(stop_limit) {
  const std::string mine = machine_id();
  if (mine.empty()) return;
  for (size_t r = 0; r < ids.size() && r < pids.size(); ++r)
    if (static_cast<int>(r) != me && ids[r] == mine && pids[r] > 0)
      peers_.push_back(Peer{static_cast<int>(r), pids[r], {}});
}

int PeerWatch::check(std::string* what) {
  const auto now = Clock::now();
  const Peer* exited = nullptr;
  const Peer* stopped = nullptr;  // the one stopped longest
  for (Peer& p : peers_) {
    const char s = process_state(p.pid);
    if (s == 'X' || s == 'Z') {
      if (!exited) exited = &p;
      continue;
    }
    if (s != 'T') {  // 't' (stopped by a debugger) is left alone: someone is looking at it
      if (p.stopped_since != Clock::time_point{} && now - p.stopped_since >= kLongStop)
        p.resumed_at = now;
      p.stopped_since = {};
      // Just continued after a long stop (mpirun SIGCONTs every rank as it aborts a job):
      // still the likely cause of a peer's exit.
      if (now - p.resumed_at < kRecent && !stopped) stopped = &p;
      continue;
    }
    if (p.stopped_since == Clock::time_point{}) p.stopped_since = now;
    if (!stopped || stopped->stopped_since == Clock::time_point{} ||
        p.stopped_since < stopped->stopped_since)
      stopped = &p;
  }
  // A peer that exited while another is (or just was) stopped most likely gave up on the
  // stopped one: name the stopped one, the cause.
  const bool now_stopped = stopped && stopped->stopped_since != Clock::time_point{};
  if (stopped && (exited || (now_stopped && now - stopped->stopped_since >= stop_limit_))) {
    *what = lockstep::detail::concat("rank ", stopped->rank, " (pid ", stopped->pid,
                                     ", this host) is stopped (SIGSTOP/SIGTSTP) and not answering");
    if (exited) *what += lockstep::detail::concat("; rank ", exited->rank, " has exited meanwhile");
    return stopped->rank;
  }
  if (exited) {
    *what = lockstep::detail::concat("rank ", exited->rank, " (pid ", exited->pid,
                                     ", this host) exited");
    return exited->rank;
  }
  return -1;
}

}  // namespace lockstep::comm
