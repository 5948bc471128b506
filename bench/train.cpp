// lockstep-bench train: time per epoch of the CTSM demo config at 1 and 2 ranks.
//
// Runs the real trainer (lockstep-run + lockstep-train) on configs/ctsm-demo.toml with
// keep_global_batch (1 rank accumulates 2 micro-batches, 2 ranks take 1 each: the same
// global batch, the same optimizer steps), reads each run's summary.json, and reports
// the mean epoch time normalized to 1 rank (bar: 2 ranks <= 0.55x) and the exposed
// communication share per epoch. Epoch times exclude data generation, eval and export.
//   lockstep-bench train [--config FILE] [--epochs N] [--ranks 1,2] [--train PATH] [--repeat R]
#include "bench_util.h"
#include "commands.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::bench {
namespace {

struct Options {
  std::string config = "configs/ctsm-demo.toml";
  std::string train_path =
#ifdef LOCKSTEP_TRAIN_PATH
      LOCKSTEP_TRAIN_PATH;
#else
      "";
#endif
  std::string out = "out/bench-train";
  int epochs = 2, repeat = 1;
  std::vector<int> ranks = {1, 2};
};

struct Row {
  int ranks;
  double epoch_s, comm_share, samples_per_s, auc;
};

// One training run at `p` ranks; its summary.json, or nothing if it failed.
std::optional<nlohmann::json> run_trainer(const Options& o, int p) {
  const std::string dir = o.out + "/ranks-" + std::to_string(p);
  std::filesystem::remove_all(dir + "/checkpoints");
  const std::string cmd = std::string("'") + LOCKSTEP_RUN_PATH + "' --nproc-per-node " +
                          std::to_string(p) + " --master-port 0 '" + o.train_path + "' '" +
                          o.config + "' --set run.out_dir=" + dir +
                          " --set train.epochs=" + std::to_string(o.epochs) +
                          " --set log.progress=false --set log.plot=false --set eval.threshold=0" +
                          " --set checkpoint.every_steps=0 > " + dir + ".log 2>&1";
  std::filesystem::create_directories(o.out);
  if (std::system(cmd.c_str()) != 0) {
    std::cerr << "lockstep-bench train: run failed, see " << dir << ".log\n";
    return std::nullopt;
  }
  std::ifstream in(dir + "/summary.json");
  return nlohmann::json::parse(in);
}

// `repeat` runs at `p` ranks, their medians; nothing if a run failed.
std::optional<Row> measure(const Options& o, int p) {
  std::vector<double> epoch_s, comm, sps;
  double auc = 0;
  for (int rep = 0; rep < o.repeat; ++rep) {
    const double t0 = now_s();
    const auto s = run_trainer(o, p);
    if (!s) return std::nullopt;
    for (double t : s->at("epoch_times_s")) epoch_s.push_back(t);
    comm.push_back(s->at("comm_share"));
    sps.push_back(s->at("samples_per_s"));
    auc = s->at("metrics").at("auc");
    std::fprintf(stderr, "ranks %d run %d: %.1f s wall, epochs %s\n", p, rep, now_s() - t0,
                 s->at("epoch_times_s").dump().c_str());
  }
  return Row{p, median(epoch_s), median(comm), median(sps), auc};
}

void print_rows(const Options& o, const std::vector<Row>& rows) {
  const double base = rows.front().epoch_s;
  Table t({"ranks", "s/epoch (median)", "x of 1 rank", "samples/s", "exposed comm share",
           "backtest AUC"});
  for (const auto& r : rows)
    t.add({std::to_string(r.ranks), fmt(r.epoch_s, 2), fmt(r.epoch_s / base, 3),
           fmt(r.samples_per_s, 0), fmt(100 * r.comm_share, 1) + "%", fmt(r.auc, 4)});
  std::cout << "CTSM demo (" << o.config << "), " << o.epochs
            << " epochs per run, same global batch\n"
            << t.str();
  for (const auto& r : rows)
    if (r.ranks == 2)
      std::cout << "2 ranks: " << fmt(r.epoch_s / base, 3) << "x the time of 1 (bar <= 0.55x): "
                << (r.epoch_s / base <= 0.55 ? "met" : "NOT met") << "\n";
}

int run(const Options& o) {
  if (o.train_path.empty()) {
    std::cerr << "lockstep-bench train: pass --train PATH/TO/lockstep-train\n";
    return 2;
  }
  std::vector<Row> rows;
  for (int p : o.ranks) {
    auto row = measure(o, p);
    if (!row) return 1;
    rows.push_back(*row);
  }
  print_rows(o, rows);
  return 0;
}

}  // namespace

Command train_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app = bench.add_subcommand(
      "train", "time per epoch of the CTSM demo config (the real trainer) at 1 and 2 ranks");
  app->add_option("--config", o->config, "trainer config")->capture_default_str();
  app->add_option("--epochs", o->epochs, "epochs per run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--ranks", o->ranks, "rank counts, comma-separated; the first is the base")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--repeat", o->repeat, "runs per rank count (medians)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--train", o->train_path, "the lockstep-train program")->capture_default_str();
  app->add_option("--out", o->out, "folder of the runs' output")->capture_default_str();
  return {app, [o] { return run(*o); }};
}

}  // namespace lockstep::bench
