// lockstep-bench faults: a soak of fault-tolerant training. The same job runs three times
// in one run: without faults; fault tolerant (lockstep-run --fault-tolerant,
// lockstep::ft::Manager) while a replica is SIGKILLed (or SIGSTOPped, --stops) every
// --fault-every seconds (at a random moment, so at a random point of a step); and, with
// the same fault schedule,
// today's path (lockstep-run --max-restarts, every rank restarts and resumes from the
// newest checkpoint). It reports faults injected, steps committed against attempted, the
// replica-step efficiency against its bound, heal times, hangs and unrecoverable errors,
// and each path's wall time (docs/fault-tolerance.md, docs/benchmarks.md).
#include "bench_util.h"
#include "commands.h"
#include "faults_bench.h"
#include "jobs.h"

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace lockstep::bench {
namespace {

namespace fs = std::filesystem;

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Event {
  double t = 0;
  std::string what;
  double a = 0, b = 0;
};

// Every replica's (or rank's) event log: DIR/log_<id>, lines "<time> <what> [a] [b]".
std::map<int, std::vector<Event>> read_logs(const std::string& dir, int replicas) {
  std::map<int, std::vector<Event>> logs;
  for (int id = 0; id < replicas; ++id) {
    std::ifstream in(dir + "/log_" + std::to_string(id));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream l(line);
      Event e;
      l >> e.t >> e.what >> e.a >> e.b;
      logs[id].push_back(e);
    }
  }
  return logs;
}

pid_t pid_of(const std::string& dir, int id) {
  std::ifstream in(dir + "/pid_" + std::to_string(id));
  pid_t p = 0;
  in >> p;
  return p > 0 && ::kill(p, 0) == 0 ? p : 0;
}

// Whether replica `id` committed a step in the last second: it holds the job's state
// (a replica resumed after a stop shows an old commit last, and no longer does).
bool committing(const std::string& dir, int id) {
  std::ifstream in(dir + "/log_" + std::to_string(id));
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return last.find(" commit ") != std::string::npos && wall_now() - std::stod(last) < 1.0;
}

struct Fault {
  double t;
  int victim;
  char kind;  // 'k' SIGKILL, 's' SIGSTOP (then SIGCONT), 'c' its host cut off the network
};

// Faults struck: a cut takes every replica of its host at once (one line each), one fault.
int64_t fault_count(const std::vector<Fault>& faults, char kind = 0) {
  std::set<double> cuts;  // a cut's lines share its time
  int64_t others = 0;
  for (const Fault& f : faults) {
    if (kind && f.kind != kind) continue;
    if (f.kind == 'c')
      cuts.insert(f.t);
    else
      ++others;
  }
  return others + int64_t(cuts.size());
}

// Strikes a replica every [0.5, 1.5] x `every` seconds while the job runs: SIGKILL, or with
// probability --stops SIGSTOP and SIGCONT --stop-seconds later (a hung host that comes
// back: dropped from the quorum meanwhile, it finds its place gone, exits and is
// restarted). Fault tolerant: only replicas that are committing, and only while another
// one is (killing the last holder of the state is a total loss no replica scheme survives).
std::vector<Fault> inject(const FaultsOptions& o, const std::string& dir, bool ft,
                          const std::atomic<bool>& running) {
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> gap(0.5 * o.fault_every, 1.5 * o.fault_every);
  std::uniform_real_distribution<double> coin(0, 1);
  std::vector<Fault> faults;
  std::map<pid_t, double> stopped;  // pid -> when to resume it
  double next = now_s() + gap(rng);
  while (running) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto it = stopped.begin(); it != stopped.end();)
      if (now_s() >= it->second) {
        ::kill(it->first, SIGCONT);
        it = stopped.erase(it);
      } else {
        ++it;
      }
    if (now_s() < next) continue;
    std::vector<int> candidates;
    for (int id = 0; id < o.replicas; ++id) {
      const pid_t p = pid_of(dir, id);
      if (p && !stopped.count(p) && (!ft || committing(dir, id))) candidates.push_back(id);
    }
    if (candidates.size() < (ft ? 2u : 1u)) continue;
    const int victim = candidates[rng() % candidates.size()];
    const pid_t pid = pid_of(dir, victim);
    const bool stop = coin(rng) < o.stops;
    if (::kill(pid, stop ? SIGSTOP : SIGKILL) == 0) {
      faults.push_back({wall_now(), victim, stop ? 's' : 'k'});
      if (stop) stopped[pid] = now_s() + o.stop_seconds;
    }
    next = now_s() + gap(rng);
  }
  for (const auto& [pid, when] : stopped) ::kill(pid, SIGCONT);
  return faults;
}

struct Outcome {
  std::string name;
  JobOutput job;
  double wall = 0;
  std::vector<Fault> faults;
  std::map<int, std::vector<Event>> logs;
};

std::string job_command(const FaultsOptions& o, const std::string& dir, bool ft, double limit) {
  std::ostringstream c;
  c << "timeout " << limit << " env " << rank_environment() << "LOCKSTEP_BACKEND=" << o.backend
    << " " << LOCKSTEP_RUN_PATH << " --nproc-per-node " << o.replicas
    << (ft ? " --fault-tolerant" : "") << " --max-restarts 100000 --master-port 0 "
    << self_command() << " faults --worker --mode " << (ft ? "ft" : "restart") << " --dir '" << dir
    << "' --steps " << o.steps << " --step-ms " << o.step_ms << " --ballast " << o.ballast
    << " --checkpoint-every " << o.checkpoint_every;
  return c.str();
}

// One job; `limit`: seconds after which it is stopped (status 124).
Outcome run(const FaultsOptions& o, const std::string& name, bool ft, bool faults, double limit) {
  std::printf("running %s ...\n", name.c_str());
  std::fflush(stdout);
  Outcome out;
  out.name = name;
  const std::string dir =
      (fs::temp_directory_path() / ("lockstep-faults-" + std::to_string(::getpid()) + "-" + name))
          .string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::atomic<bool> running{true};
  const double t0 = now_s();
  std::thread job([&] {
    out.job = run_job_quiet(job_command(o, dir, ft, limit));
    running = false;
  });
  if (faults) out.faults = inject(o, dir, ft, running);
  job.join();
  out.wall = now_s() - t0;
  out.logs = read_logs(dir, o.replicas);
  fs::remove_all(dir);
  return out;
}

struct Tally {
  int64_t committed = 0, discarded = 0, steps = 0, heals = 0, starts = 0;
  std::vector<double> heal_s;
  double down_s = 0;  // replica-seconds the faults took out: kill -> the victim's next commit
};

Tally tally(const Outcome& r) {
  Tally t;
  double end = 0;
  for (const auto& [id, events] : r.logs)
    for (const Event& e : events) {
      end = std::max(end, e.t);
      if (e.what == "commit") ++t.committed, t.steps = std::max(t.steps, int64_t(e.a) + 1);
      if (e.what == "discard") ++t.discarded;
      if (e.what == "start") ++t.starts;
      if (e.what == "heal") ++t.heals, t.heal_s.push_back(e.a);
    }
  for (const Fault& f : r.faults) {
    double back = end;
    for (const Event& e : r.logs.at(f.victim))
      if (e.t > f.t && e.what == "commit") {
        back = e.t;
        break;
      }
    t.down_s += back - f.t;
  }
  return t;
}

bool timed_out(const JobOutput& j) { return WIFEXITED(j.status) && WEXITSTATUS(j.status) == 124; }

// ok, error N, hung (a fault-tolerant job past --timeout) or unfinished (today's path
// stopped at its limit: slow, not stuck).
std::string status_of(const Outcome& r) {
  if (timed_out(r.job)) return r.name == "restart-all" ? "unfinished" : "hung";
  return r.job.status == 0 ? "ok" : "error " + std::to_string(WEXITSTATUS(r.job.status));
}

// The table of the runs; the number of fault-tolerant runs that did not end ok.
int report(const FaultsOptions& o, const std::vector<Outcome>& runs) {
  Table table({"run", "wall s", "faults", "stops", "cuts", "steps", "replica-steps", "discarded",
               "efficiency", "bound", "job"});
  int bad = 0;
  for (const Outcome& r : runs) {
    Tally t = tally(r);
    const double ideal = double(o.replicas) * double(o.steps);
    const bool ft = r.name != "restart-all";
    const double bound = 1 - t.down_s / (double(o.replicas) * r.wall);
    table.add({r.name, fmt(r.wall, 1), std::to_string(fault_count(r.faults)),
               std::to_string(fault_count(r.faults, 's')),
               std::to_string(fault_count(r.faults, 'c')), std::to_string(t.steps),
               std::to_string(t.committed), std::to_string(t.discarded),
               ft ? fmt(t.committed / ideal, 3) : "", ft && !r.faults.empty() ? fmt(bound, 3) : "",
               status_of(r)});
    if (ft && status_of(r) != "ok") ++bad;
    if (ft && !t.heal_s.empty()) {
      std::sort(t.heal_s.begin(), t.heal_s.end());
      std::printf("%s: %lld heals, median %.3f s, max %.3f s; %lld processes started\n",
                  r.name.c_str(), static_cast<long long>(t.heals), median(t.heal_s),
                  t.heal_s.back(), static_cast<long long>(t.starts));
    }
    if (!ft)
      std::printf("restart-all: %lld processes started (whole-job restarts)\n",
                  static_cast<long long>(t.starts));
  }
  std::printf("%s", table.str().c_str());
  std::printf(
      "steps: the job's steps done (restart-all: the furthest any start reached); replica-steps: "
      "committed by all replicas (restart-all: including steps recomputed after a restart); "
      "efficiency: replica-steps committed / (replicas x steps); bound: 1 - (replica-seconds "
      "the faults took out, each from the kill to the victim's next commit) / (replicas x "
      "wall); job: ok, error (exit status), hung (still running after %.0f s) or unfinished "
      "(restart-all stopped after 3x the fault-tolerant run's time, at least 60 s)\n",
      o.timeout);
  return bad;
}

int driver(const FaultsOptions& o) {
  std::printf(
      "%d replicas (%s), %lld steps of %.0f ms, a fault every %.1f s on average (%.0f%% "
      "SIGSTOP for %.0f s, the rest SIGKILL)\n",
      o.replicas, o.backend.c_str(), static_cast<long long>(o.steps), o.step_ms, o.fault_every,
      100 * o.stops, o.stop_seconds);
  std::fflush(stdout);
  std::vector<Outcome> runs;
  runs.push_back(run(o, "no-faults", true, false, o.timeout));
  runs.push_back(run(o, "fault-tolerant", true, true, o.timeout));
  // Today's path may never finish when faults come faster than a whole-job restart: it
  // gets 3 times the fault-tolerant run's time, then counts as unfinished.
  const double limit = std::min(o.timeout, std::max(60.0, 3 * runs.back().wall));
  if (o.restart_path) runs.push_back(run(o, "restart-all", false, true, limit));
  return report(o, runs) ? 1 : 0;
}

// A fault-tolerant job run elsewhere (bench/multihost_faults.sh, on namespace hosts): its
// workers' logs DIR/log_<id>, its faults DIR/faults ("<time> <replica> <k|s|c>" a line),
// its wall time DIR/wall and its exit code DIR/status.
Outcome recorded(const std::string& dir, const std::string& name, int replicas) {
  Outcome r;
  r.name = name;
  r.logs = read_logs(dir, replicas);
  std::ifstream faults(dir + "/faults");
  for (Fault f{}; faults >> f.t >> f.victim >> f.kind;) r.faults.push_back(f);
  std::ifstream(dir + "/wall") >> r.wall;
  int code = 1;
  std::ifstream(dir + "/status") >> code;
  r.job.status = (code & 0xff) << 8;  // as the shell's wait status
  return r;
}

int analyze(const FaultsOptions& o) {
  std::vector<Outcome> runs;
  if (!o.baseline.empty()) runs.push_back(recorded(o.baseline, "no-faults", o.replicas));
  runs.push_back(recorded(o.analyze, "fault-tolerant", o.replicas));
  return report(o, runs) ? 1 : 0;
}

}  // namespace

Command faults_command(CLI::App& bench) {
  auto o = std::make_shared<FaultsOptions>();
  CLI::App* app = bench.add_subcommand(
      "faults", "soak: a replica killed every few seconds, fault tolerant against restart-all");
  app->add_option("--replicas", o->replicas, "replicas (ranks)")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app->add_option("--steps", o->steps, "steps of the job")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--step-ms", o->step_ms, "a step's emulated compute, ms")->capture_default_str();
  app->add_option("--fault-every", o->fault_every, "mean seconds between faults")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--stops", o->stops, "share of the faults that are SIGSTOP (then SIGCONT)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--stop-seconds", o->stop_seconds, "how long a stopped replica stays stopped")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--ballast", o->ballast, "float32 values reduced with the gradients")
      ->capture_default_str();
  app->add_option("--checkpoint-every", o->checkpoint_every,
                  "restart path: checkpoint every N steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--timeout", o->timeout, "seconds after which a job counts as hung")
      ->capture_default_str();
  app->add_option("--backend", o->backend, "shm or gloo")
      ->check(CLI::IsMember({"shm", "gloo"}))
      ->capture_default_str();
  app->add_option("--seed", o->seed, "the fault schedule's seed")->capture_default_str();
  app->add_flag("!--no-restart-path", o->restart_path, "skip today's path (restart every rank)");
  app->add_option("--analyze", o->analyze,
                  "report a job run elsewhere from its folder (bench/multihost_faults.sh)");
  app->add_option("--baseline", o->baseline, "with --analyze: the fault-free run's folder");
  app->add_flag("--worker", o->worker)->group(kWorkerOnly);
  app->add_option("--mode", o->mode)->group(kWorkerOnly);
  app->add_option("--dir", o->dir)->group(kWorkerOnly);
  return {app, [o] {
            if (!o->analyze.empty()) return analyze(*o);
            if (!o->worker) return driver(*o);
            return o->mode == "ft" ? faults_ft_worker(*o) : faults_restart_worker(*o);
          }};
}

}  // namespace lockstep::bench
