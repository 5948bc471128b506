// Supervision of one start of the group: a single poll() loop over every rank's stdout and
// stderr pipes plus the signal pipe, so no rank can block the launcher.
#include "group.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "coordinator.h"
#include "exit_status.h"
#include "lockstep/env_contract.h"
#include "lockstep/launch/error_file.h"
#include "lockstep/launch/launcher.h"
#include "spawn.h"

namespace lockstep::launch {
namespace {

// Whole lines go out in one write(), so lines of different ranks never interleave.
void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EPIPE etc.: the reader is gone; keep supervising anyway
    off += std::size_t(n);
  }
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

Group::Group(const LaunchOptions& opt, const GroupContext& ctx, const EnvMap& base,
             SignalPipe& signals, const std::vector<int>& log_fds, std::string error_dir)
    : opt_(opt),
      ctx_(ctx),
      base_(base),
      signals_(signals),
      log_fds_(log_fds),
      error_dir_(std::move(error_dir)) {}

Group::~Group() {
  for (Rank& r : ranks_)
    for (int s = 0; s < 2; ++s)
      if (r.fds[s] >= 0) close(r.fds[s]);
}

AttemptResult Group::run() {
  bool spawned = spawn_all();
  loop();
  drain_output();
  // Every replica failed: when the quorum service stopped the job, it exits (within 2 s of
  // its STOP) with the reason, which is the job's.
  for (int i = 0; i < 60 && opt_.fault_tolerant && ctx_.service_pid > 0 && !service_gone_ &&
                  !service_done_ && first_failed_ >= 0 && !any_succeeded();
       ++i) {
    check_service();
    if (!service_gone_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  AttemptResult res;
  if (interrupted_by_) {
    print_interrupt_summary();
    res.outcome = AttemptResult::Outcome::Interrupted;
    res.exit_code = 128 + interrupted_by_;
  } else if (!spawned) {
    res.outcome = AttemptResult::Outcome::CannotExecute;
    res.exit_code = 127;
  } else if (service_gone_) {
    res.outcome = AttemptResult::Outcome::ServiceLost;
    const bool stop = WIFEXITED(service_status_) && WEXITSTATUS(service_status_) == kExitQuorumStop;
    res.exit_code = stop ? kExitQuorumStop : 1;
  } else if (opt_.fault_tolerant && first_failed_ >= 0) {
    // The job succeeded if a replica finished it; the failures were said as they came.
    if (!any_succeeded()) {
      print_failure_summary();
      res.outcome = AttemptResult::Outcome::RankFailed;
      res.exit_code = exit_code_of(ranks_[std::size_t(first_failed_)].status);
    }
  } else if (first_failed_ >= 0) {
    print_failure_summary();
    res.outcome = AttemptResult::Outcome::RankFailed;
    res.exit_code = exit_code_of(ranks_[std::size_t(first_failed_)].status);
  }
  return res;
}

// Returns false when the program cannot be executed; ranks already started are torn down.
bool Group::spawn_all() {
  ranks_.reserve(std::size_t(opt_.nproc_per_node));
  for (int local = 0; local < opt_.nproc_per_node; ++local) {
    Rank r;
    if (!spawn_one(local, 0, r)) {
      begin_teardown();
      return false;
    }
    ranks_.push_back(std::move(r));
  }
  return true;
}

bool Group::spawn_one(int local, int restarts, Rank& r) {
  EnvMap vars = rank_env(opt_, local, ctx_, base_);
  if (restarts > 0) {
    vars[env::kRestartCount] = std::to_string(restarts);
    vars[env::kTorchelasticRestartCount] = vars[env::kRestartCount];
  }
  if (opt_.replica_size > 1) {  // a replica's ranks are started together, its rank 0 first
    const std::size_t replica = std::size_t(local / opt_.replica_size);
    replica_ports_.resize(std::size_t(opt_.nproc_per_node / opt_.replica_size));
    if (local % opt_.replica_size == 0) replica_ports_[replica] = pick_free_port("127.0.0.1");
    make_replica_env(opt_, local, replica_ports_[replica], restarts, vars);
  }
  if (!error_dir_.empty()) {
    const std::string path = error_file_path(error_dir_, opt_.global_rank(local));
    unlink(path.c_str());  // a previous start's error must not be read as this start's
    vars[env::kErrorFile] = path;
    vars[env::kTorchelasticErrorFile] = path;
  }
  std::vector<std::string> envp = to_envp(vars);
  SpawnedRank sp;
  try {
    sp = spawn_rank(opt_.program, envp);
  } catch (const std::exception& e) {
    say(std::string(e.what()) + " (starting local rank " + std::to_string(local) + ")");
    exec_errno_ = -1;
  }
  if (sp.exec_errno != 0) {
    say("cannot execute '" + opt_.program[0] + "': " + std::strerror(sp.exec_errno));
    exec_errno_ = sp.exec_errno;
  }
  if (exec_errno_ != 0) return false;
  // Field by field: `r` may be a failed replica's slot, restarted in place.
  r.local_rank = local;
  r.rank = opt_.global_rank(local);
  r.pid = sp.pid;
  r.fds[0] = sp.out_fd;
  r.fds[1] = sp.err_fd;
  r.start = Clock::now();
  r.running = true;
  r.status = 0;
  r.stopped = Stop::None;
  r.stop_signal = 0;
  r.tail.clear();
  r.restarts = restarts;
  r.replica_restart = false;
  return true;
}

void Group::loop() {
  while (any_running()) {
    std::vector<pollfd> pfds;
    std::vector<std::pair<std::size_t, int>> owners;  // (rank index, stream) per pollfd
    pfds.push_back({signals_.read_fd(), POLLIN, 0});
    for (std::size_t i = 0; i < ranks_.size(); ++i)
      for (int s = 0; s < 2; ++s)
        if (ranks_[i].fds[s] >= 0) {
          pfds.push_back({ranks_[i].fds[s], POLLIN, 0});
          owners.emplace_back(i, s);
        }
    int n = poll(pfds.data(), pfds.size(), poll_timeout_ms());
    if (n < 0 && errno != EINTR) break;
    for (std::size_t k = 1; n > 0 && k < pfds.size(); ++k)
      if (pfds[k].revents) read_stream(ranks_[owners[k - 1].first], owners[k - 1].second);
    handle_signals();
    reap();  // after reading, so a dying rank's last words print before the summary
    if (ctx_.service_pid > 0 && !service_gone_ && !service_done_) check_service();
    if (opt_.fault_tolerant && !tearing_down_ && any_running() && only_stopped_left() &&
        any_succeeded()) {
      say("the job is done; only stopped replicas are left, which the quorum dropped: "
          "ending them");
      begin_teardown();
    }
    if (noticing_ && !tearing_down_ && (Clock::now() >= term_at_ || only_stopped_left()))
      begin_teardown();
    if (tearing_down_ && !killed_ && Clock::now() >= kill_at_) {
      signal_groups(SIGKILL);
      killed_ = true;
    }
  }
}

int Group::poll_timeout_ms() const {
  // The signal pipe wakes us for SIGCHLD; the timeout is a safety net and the grace clock.
  int ms = 250;
  if (noticing_ && !tearing_down_) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(term_at_ - Clock::now()).count();
    ms = int(std::max<long long>(0, std::min<long long>(ms, left)));
  }
  if (tearing_down_ && !killed_) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now()).count();
    ms = int(std::max<long long>(0, std::min<long long>(ms, left)));
  }
  return ms;
}

void Group::handle_signals() {
  for (int sig : signals_.drain()) {
    if (sig == SIGCHLD) continue;  // reap() runs after every wakeup
    if (interrupted_by_ && tearing_down_ && !killed_) {
      say("received " + signal_name(sig) + " again: killing all ranks now");
      signal_groups(SIGKILL);
      killed_ = true;
      continue;
    }
    if (!interrupted_by_) interrupted_by_ = sig;
    say("received " + signal_name(sig) + ": stopping all ranks (again to kill them at once)");
    if (!tearing_down_) begin_teardown();
  }
}

void Group::read_stream(Rank& r, int stream) {
  char buf[16384];
  for (int rounds = 0; rounds < 8; ++rounds) {  // bounded: one chatty rank must not starve others
    ssize_t n = read(r.fds[stream], buf, sizeof buf);
    if (n > 0) {
      for (std::string& line : r.lines[stream].feed(buf, std::size_t(n))) emit(r, stream, line);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    close_stream(r, stream);  // EOF or error
    return;
  }
}

void Group::emit(Rank& r, int stream, const std::string& line) {
  write_all(stream == 0 ? 1 : 2, "[rank " + std::to_string(r.rank) + "] " + line + "\n");
  int log = log_fds_.empty() ? -1 : log_fds_[std::size_t(r.local_rank)];
  if (log >= 0) write_all(log, line + "\n");
  if (stream == 1) r.tail.push(line);
}

void Group::close_stream(Rank& r, int stream) {
  std::string partial;
  if (r.lines[stream].flush(&partial)) emit(r, stream, partial);
  close(r.fds[stream]);
  r.fds[stream] = -1;
}

void Group::reap() {
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (!r.running) continue;
    int st = 0;
    pid_t p = waitpid(r.pid, &st, WNOHANG | WUNTRACED | WCONTINUED);
    if (p == 0 || (p < 0 && errno == EINTR)) continue;
    if (p > 0 && WIFSTOPPED(st)) {  // remembered: a stopped rank fails its peers, not itself
      if (!r.stop_signal) r.stopped_at = Clock::now();
      r.stop_signal = WSTOPSIG(st);
      continue;
    }
    if (p > 0 && WIFCONTINUED(st)) {
      r.stop_signal = 0;
      continue;
    }
    r.running = false;
    r.status = p < 0 ? (1 << 8) : st;  // ECHILD should not happen; count it as a failure
    r.end = Clock::now();
    if (r.replica_restart && !tearing_down_) {
      respawn_replica_when_down(i);
      continue;
    }
    if (succeeded(r.status) || tearing_down_) continue;
    if (opt_.fault_tolerant)
      replica_failed(i);
    else if (first_failed_ < 0)
      first_failure(i);
  }
}

// The others go on (their quorum drops the failed replica at the next step boundary); a
// restarted one joins a later quorum and heals from a live peer (docs/fault-tolerance.md).
void Group::replica_failed(std::size_t i) {
  if (first_failed_ < 0) first_failed_ = int(i);
  const std::string how = describe_wait_status(ranks_[i].status);
  const int size = opt_.replica_size;
  const std::string name =
      "rank " + std::to_string(ranks_[i].rank) +
      (size > 1 ? " (replica " + std::to_string(ranks_[i].rank / size) + ")" : "");
  if (any_succeeded()) {
    say(name + " failed (" + how + ") after other replicas finished the job; not restarted");
    return;
  }
  if (remote_service_lost()) return;
  if (usage_error_in_replica(i)) {
    say(name + " failed (" + how +
        "): a usage or configuration error, which a restart would repeat; not restarted");
    return;
  }
  if (ft_restarts_ >= opt_.max_restarts) {
    say(name + " failed (" + how + "); not restarted (--max-restarts " +
        std::to_string(opt_.max_restarts) + " used); the other replicas go on without it");
    return;
  }
  ++ft_restarts_;
  const std::string count = " (restart " + std::to_string(ft_restarts_) + " of " +
                            std::to_string(opt_.max_restarts) + ")";
  if (size == 1) {
    last_words(ranks_[i]);
    say(name + " failed (" + how + "); restarting it alone" + count + "; the other replicas go on");
    spawn_one(ranks_[i].local_rank, ranks_[i].restarts + 1, ranks_[i]);
    return;
  }
  // Its mates cannot go on without it (their shard group is broken): all restart together.
  const std::size_t first = i - i % std::size_t(size);
  say(name + " failed (" + how + "); restarting its replica's " + std::to_string(size) + " ranks " +
      std::to_string(ranks_[first].rank) + "-" + std::to_string(ranks_[first].rank + size - 1) +
      count + "; the other replicas go on");
  for (std::size_t k = first; k < first + std::size_t(size); ++k) {
    ranks_[k].replica_restart = true;
    if (ranks_[k].running) {
      ranks_[k].stopped = Stop::Kill;
      killpg(ranks_[k].pid, SIGKILL);
    }
  }
  respawn_replica_when_down(i);
}

// Rank i, or (--replica-size) a rank of its replica, exited with kExitUsage (also every
// configuration error's code): its mates fail after it, with other codes.
bool Group::usage_error_in_replica(std::size_t i) const {
  const std::size_t size = std::size_t(opt_.replica_size), first = i - i % size;
  for (std::size_t k = first; k < first + size; ++k) {
    const int st = ranks_[k].status;
    if (!ranks_[k].running && WIFEXITED(st) && WEXITSTATUS(st) == kExitUsage) return true;
  }
  return false;
}

void Group::respawn_replica_when_down(std::size_t i) {
  const std::size_t size = std::size_t(opt_.replica_size), first = i - i % size;
  for (std::size_t k = first; k < first + size; ++k)
    if (ranks_[k].running) return;
  if (any_succeeded()) return;  // the job finished meanwhile
  for (std::size_t k = first; k < first + size; ++k) {
    last_words(ranks_[k]);
    spawn_one(ranks_[k].local_rank, ranks_[k].restarts + 1, ranks_[k]);
  }
}

// What an exited rank still had in its pipes, before its slot is reused by a restart.
void Group::last_words(Rank& r) {
  for (int s = 0; s < 2; ++s)
    for (int rounds = 0; rounds < 64 && r.fds[s] >= 0; ++rounds) read_stream(r, s);
  for (int s = 0; s < 2; ++s)
    if (r.fds[s] >= 0) close_stream(r, s);
}

// On a node without the quorum service, before a restart: a service that stopped the job
// or died cannot be restarted from here, and a replica restarted without it would only
// fail again, restart after restart. The service is given 5 s to answer (a network
// partition that is healing).
bool Group::remote_service_lost() {
  if (ctx_.service_pid > 0 || ctx_.coordinator.empty()) return false;
  if (service_reachable(ctx_.coordinator, 5000)) return false;
  service_gone_ = true;
  service_status_ = 1 << 8;  // as an exit with code 1
  say("the quorum service at " + ctx_.coordinator +
      " cannot be reached: it stopped the job or is gone (the one single point of failure, "
      "docs/fault-tolerance.md); not restarting, stopping this node's ranks");
  if (!tearing_down_ && any_running()) begin_teardown();
  return true;
}

void Group::check_service() {
  int st = 0;
  if (waitpid(ctx_.service_pid, &st, WNOHANG) <= 0) return;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
    // The job finished and every replica left it; a rank may still be at work after its
    // BYE (the report), and a stopped one is ended as when the service is there.
    service_done_ = true;
    return;
  }
  service_gone_ = true;
  service_status_ = st;
  if (WIFEXITED(st) && WEXITSTATUS(st) == kExitQuorumStop)
    say("the quorum service stopped the job (its reason is above); stopping every rank");
  else
    say("the quorum service (pid " + std::to_string(ctx_.service_pid) + ") " +
        describe_wait_status(st) +
        ": a fault-tolerant job cannot go on without it (its one single point of failure, "
        "docs/fault-tolerance.md); stopping every rank");
  if (!tearing_down_ && any_running()) begin_teardown();
}

// The first failure: the others get --notice-seconds to see it in their communication
// and exit with their own error (naming the rank), then the group is torn down.
void Group::first_failure(std::size_t i) {
  first_failed_ = int(i);
  bool others = false;
  for (const Rank& r : ranks_) others = others || r.running;
  if (!others || opt_.notice_seconds <= 0) {
    begin_teardown();
    return;
  }
  noticing_ = true;
  term_at_ = Clock::now() + std::chrono::milliseconds(long(opt_.notice_seconds * 1000));
}

void Group::begin_teardown() {
  tearing_down_ = true;
  kill_at_ = Clock::now() + std::chrono::milliseconds(long(opt_.grace_seconds * 1000));
  for (Rank& r : ranks_)
    if (r.running) r.stopped = Stop::Term;
  // Also the groups whose leader already exited: their own children may still run.
  signal_groups(SIGTERM);
  signal_groups(SIGCONT);  // a stopped rank acts on SIGTERM only once it runs again
}

void Group::signal_groups(int sig) {
  for (Rank& r : ranks_) {
    if (r.pid <= 0) continue;
    if (sig == SIGKILL && r.running) r.stopped = Stop::Kill;
    killpg(r.pid, sig);  // ESRCH (group already empty) is expected and harmless
  }
}

// Every rank is reaped; collect what is still in the pipes. A rank's background child may
// hold a pipe open forever, so stop after a short quiet period instead of waiting for EOF.
void Group::drain_output() {
  auto give_up = Clock::now() + std::chrono::seconds(2);
  while (any_open() && Clock::now() < give_up) {
    std::vector<pollfd> pfds;
    std::vector<std::pair<std::size_t, int>> owners;
    for (std::size_t i = 0; i < ranks_.size(); ++i)
      for (int s = 0; s < 2; ++s)
        if (ranks_[i].fds[s] >= 0) {
          pfds.push_back({ranks_[i].fds[s], POLLIN, 0});
          owners.emplace_back(i, s);
        }
    int n = poll(pfds.data(), pfds.size(), 100);
    if (n == 0) break;
    if (n < 0 && errno != EINTR) break;
    for (std::size_t k = 0; n > 0 && k < pfds.size(); ++k)
      if (pfds[k].revents) read_stream(ranks_[owners[k].first], owners[k].second);
  }
  for (Rank& r : ranks_)
    for (int s = 0; s < 2; ++s)
      if (r.fds[s] >= 0) close_stream(r, s);
  signals_.drain();  // SIGCHLDs of this attempt must not wake the next one for nothing
}

bool Group::any_running() const {
  for (const Rank& r : ranks_)
    if (r.running) return true;
  return false;
}

// Every rank still running is stopped (SIGSTOP): none of them can notice anything.
bool Group::only_stopped_left() const {
  for (const Rank& r : ranks_)
    if (r.running && !r.stop_signal) return false;
  return true;
}

bool Group::any_succeeded() const {
  for (const Rank& r : ranks_)
    if (!r.running && succeeded(r.status)) return true;
  return false;
}

bool Group::any_open() const {
  for (const Rank& r : ranks_)
    if (r.fds[0] >= 0 || r.fds[1] >= 0) return true;
  return false;
}

std::string Group::outcome_of(const Rank& r) const {
  std::string how = describe_wait_status(r.status);
  if (r.stopped == Stop::None) return how;
  if (r.stopped == Stop::Term) return "stopped by lockstep-run with SIGTERM (" + how + ")";
  return "still running after SIGTERM; stopped by lockstep-run with SIGKILL (" + how + ")";
}

std::string Group::error_of(const Rank& r) const {
  return error_dir_.empty() ? std::string() : read_error_file(error_file_path(error_dir_, r.rank));
}

void Group::print_failure_summary() const {
  const Rank& f = ranks_[std::size_t(first_failed_)];
  double secs = std::chrono::duration<double>(f.end - f.start).count();
  const std::string name = "rank " + std::to_string(f.rank);
  std::string msg = "lockstep-run: " + name + " (local rank " + std::to_string(f.local_rank) +
                    ", pid " + std::to_string(f.pid) +
                    ") failed first: " + describe_wait_status(f.status) + " after " +
                    seconds(secs) + "\n";
  const std::string error = error_of(f);
  if (!error.empty()) {
    msg += "lockstep-run: error reported by " + name + ":\n";
    std::size_t at = 0;
    while (at <= error.size()) {
      std::size_t nl = error.find('\n', at);
      if (nl == std::string::npos) nl = error.size();
      msg += "    " + error.substr(at, nl - at) + "\n";
      at = nl + 1;
    }
  } else if (f.tail.lines().empty()) {
    msg += "lockstep-run: " + name + " wrote nothing to stderr\n";
  } else {
    msg += "lockstep-run: last stderr lines of " + name + ":\n";
    for (const std::string& l : f.tail.lines()) msg += "    " + l + "\n";
  }
  // A rank stopped before the failure (SIGSTOP) did not exit, but its peers failed for it.
  for (const Rank& r : ranks_)
    if (r.stop_signal && r.stopped_at <= f.end)
      msg += "lockstep-run: note: rank " + std::to_string(r.rank) + " was stopped by " +
             signal_name(r.stop_signal) + " " +
             seconds(std::chrono::duration<double>(f.end - r.stopped_at).count()) + " before " +
             name + " failed: it did not exit, but its peers could not go on without it\n";
  if (ranks_.size() > 1) msg += "lockstep-run: other ranks:\n";
  for (const Rank& r : ranks_) {
    if (&r == &f) continue;
    msg += "    rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) +
           "): " + outcome_of(r) + "\n";
    std::string e = error_of(r);
    if (e.empty()) continue;
    e = e.substr(0, e.find('\n'));
    if (e.size() > 400) e = e.substr(0, 400) + " ...";
    msg += "        error: " + e + "\n";
  }
  write_all(2, msg);
}

void Group::print_interrupt_summary() const {
  std::string msg;
  for (const Rank& r : ranks_)
    msg += "    rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) +
           "): " + outcome_of(r) + "\n";
  write_all(2, "lockstep-run: interrupted by " + signal_name(interrupted_by_) + "; ranks:\n" + msg);
}

void say(const std::string& msg) { write_all(2, "lockstep-run: " + msg + "\n"); }

}  // namespace lockstep::launch
