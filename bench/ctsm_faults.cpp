// lockstep-bench ctsm-faults: the reference workload under faults. The CTSM job
// (lockstep-train, configs/ctsm-demo.toml) runs three times in one run: fault tolerant
// (fault_tolerance.enable, lockstep-run --fault-tolerant) without faults; the same with a
// random replica SIGKILLed every --kill-every seconds; and today's path (lockstep-run
// --max-restarts: every rank restarts and resumes from the newest checkpoint) under the
// same schedule. It reports each run's wall time, kills and AUC, the AUC's difference from
// the fault-free run (the bar: within 0.005), and the fault-tolerant run's record from
// summary.json: steps committed and discarded, heals, time lost (docs/fault-tolerance.md).
#include "bench_util.h"
#include "commands.h"
#include "jobs.h"

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

namespace lockstep::bench {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::string config = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/ctsm-demo.toml";
  std::string out = "out/bench-ctsm-faults";
  int replicas = 2;
  double kill_every = 60;
  int64_t epochs = 0;  // 0: the config's
  double timeout = 3600;
  bool restart_path = true;
  uint64_t seed = 1;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The pids of the trainer processes of the run writing to `out_dir` (their command lines
// name it), found in /proc: the launcher restarts them under new pids.
std::vector<pid_t> trainers_of(const std::string& out_dir) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string comm = slurp(e.path().string() + "/comm");
    if (comm.rfind("lockstep-train", 0) != 0) continue;
    std::string cmd = slurp(e.path().string() + "/cmdline");
    for (auto& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.find("run.out_dir=" + out_dir + " ") != std::string::npos)
      out.push_back(pid_t(std::stol(name)));
  }
  return out;
}

struct Outcome {
  std::string name;
  int status = 0;
  double wall = 0;
  int kills = 0;
  int restarts = 0;  // processes lockstep-run started again (its log's lines)
  std::optional<nlohmann::json> summary;
};

// One job. With `kills`, every [0.5, 1.5] x --kill-every seconds SIGKILLs one trainer,
// chosen at random, while at least two run (a lone survivor holds the job's state).
Outcome run(const Options& o, const std::string& name, bool ft, bool kills) {
  std::printf("running %s ...\n", name.c_str());
  std::fflush(stdout);
  Outcome out;
  out.name = name;
  const std::string dir = fs::absolute(o.out + "/" + name).string();
  fs::remove_all(dir);
  fs::create_directories(o.out);
  std::ostringstream c;
  c << "timeout " << o.timeout << " env " << rank_environment() << LOCKSTEP_RUN_PATH
    << " --nproc-per-node " << o.replicas << (ft ? " --fault-tolerant" : "")
    << " --max-restarts 1000 --master-port 0 " << LOCKSTEP_TRAIN_PATH << " '" << o.config
    << "' --set run.out_dir=" << dir << " --set log.progress=false --set log.plot=false"
    << " --set eval.threshold=0" << (ft ? " --set fault_tolerance.enable=true" : "");
  if (o.epochs > 0) c << " --set train.epochs=" << o.epochs;
  c << " > " << dir << ".log 2>&1";
  std::atomic<bool> running{true};
  const double t0 = now_s();
  std::thread job([&] {
    out.status = std::system(c.str().c_str());
    running = false;
  });
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> gap(0.5 * o.kill_every, 1.5 * o.kill_every);
  double next = now_s() + gap(rng);
  while (kills && running) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (now_s() < next) continue;
    const auto pids = trainers_of(dir);
    if (pids.size() < 2) continue;
    if (::kill(pids[rng() % pids.size()], SIGKILL) == 0) ++out.kills;
    next = now_s() + gap(rng);
  }
  job.join();
  out.wall = now_s() - t0;
  if (fs::exists(dir + "/summary.json"))
    out.summary = nlohmann::json::parse(slurp(dir + "/summary.json"));
  std::istringstream log(slurp(dir + ".log"));
  for (std::string line; std::getline(log, line);) {
    if (line.rfind("lockstep-run: ", 0) != 0) continue;
    if (line.find("restarting it alone") != std::string::npos) ++out.restarts;
    const auto all = line.find("restarting all ");
    if (all != std::string::npos) out.restarts += std::atoi(line.c_str() + all + 15);
  }
  return out;
}

int driver(const Options& o) {
  std::printf("CTSM (%s), %d replicas, a replica SIGKILLed every %.0f s on average\n",
              o.config.c_str(), o.replicas, o.kill_every);
  std::vector<Outcome> runs;
  runs.push_back(run(o, "no-faults", true, false));
  runs.push_back(run(o, "fault-tolerant", true, true));
  if (o.restart_path) runs.push_back(run(o, "restart-all", false, true));
  const auto& clean = runs.front().summary;
  const double auc0 = clean ? clean->at("metrics").at("auc").get<double>() : NAN;
  Table table({"run", "wall s", "x no-faults", "kills", "restarts", "auc", "auc diff", "discarded",
               "heals", "job"});
  int bad = 0;
  for (const Outcome& r : runs) {
    const bool ok = r.status == 0 && r.summary;
    const double auc = ok ? r.summary->at("metrics").at("auc").get<double>() : NAN;
    const auto* f = ok && !r.summary->at("fault_tolerance").is_null()
                        ? &r.summary->at("fault_tolerance")
                        : nullptr;
    auto count = [&](const char* k) { return f ? f->at(k).get<int64_t>() : int64_t(0); };
    table.add({r.name, fmt(r.wall, 1), fmt(r.wall / runs.front().wall, 2), std::to_string(r.kills),
               std::to_string(r.restarts), ok ? fmt(auc, 4) : "", ok ? fmt(auc - auc0, 4) : "",
               f ? std::to_string(count("discarded_steps")) : "",
               f ? std::to_string(count("heals_received") + count("heals_given")) : "",
               ok ? "ok" : "error " + std::to_string(r.status)});
    if (!ok || std::abs(auc - auc0) > 0.005) ++bad;
  }
  std::printf("%s", table.str().c_str());
  std::printf(
      "auc diff: against no-faults (bar: within 0.005); restarts: processes lockstep-run "
      "started again; discarded, heals: the reporting replica's record in summary.json (steps "
      "it threw away; heals it received or gave); restart-all: lockstep-run --max-restarts, "
      "every rank restarts and resumes from the newest checkpoint; logs in %s/\n",
      o.out.c_str());
  return bad ? 1 : 0;
}

}  // namespace

Command ctsm_faults_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app = bench.add_subcommand(
      "ctsm-faults", "the CTSM job with a replica killed every minute: AUC against fault-free");
  app->add_option("--config", o->config, "the trainer's config")->capture_default_str();
  app->add_option("--out", o->out, "where the runs write")->capture_default_str();
  app->add_option("--replicas", o->replicas, "replicas (ranks)")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app->add_option("--kill-every", o->kill_every, "mean seconds between kills")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--epochs", o->epochs, "train.epochs (0: the config's)")->capture_default_str();
  app->add_option("--timeout", o->timeout, "seconds after which a run counts as hung")
      ->capture_default_str();
  app->add_option("--seed", o->seed, "the kill schedule's seed")->capture_default_str();
  app->add_flag("!--no-restart-path", o->restart_path, "skip today's path (restart every rank)");
  return {app, [o] { return driver(*o); }};
}

}  // namespace lockstep::bench
