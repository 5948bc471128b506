// lockstep-bench train: time per epoch of the CTSM demo config at 1 and 2 ranks.
//
// Runs the real trainer (lockstep-run + lockstep-train) on configs/ctsm-demo.toml with
// keep_global_batch (1 rank accumulates 2 micro-batches, 2 ranks take 1 each: the same
// global batch, the same optimizer steps), reads each run's summary.json, and reports
// the mean epoch time normalized to 1 rank (bar: 2 ranks <= 0.55x) and the exposed
// communication share per epoch. Epoch times exclude data generation, eval and export.
//   lockstep-bench train [--config FILE] [--epochs N] [--ranks 1,2] [--train PATH] [--repeat R]
#include "bench_util.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace lockstep::bench {

int train_main(int argc, char** argv) {
  std::string config = "configs/ctsm-demo.toml", train_path, out = "out/bench-train";
#ifdef LOCKSTEP_TRAIN_PATH
  train_path = LOCKSTEP_TRAIN_PATH;
#endif
  std::string run_path = LOCKSTEP_RUN_PATH;
  int epochs = 2, repeat = 1;
  std::vector<int> ranks = {1, 2};
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--config") config = val();
    else if (a == "--epochs") epochs = std::stoi(val());
    else if (a == "--repeat") repeat = std::stoi(val());
    else if (a == "--train") train_path = val();
    else if (a == "--out") out = val();
    else if (a == "--ranks") {
      ranks.clear();
      std::stringstream ss(val());
      for (std::string t; std::getline(ss, t, ',');) ranks.push_back(std::stoi(t));
    } else if (a == "--help") {
      std::cout << "lockstep-bench train [--config FILE] [--epochs N] [--ranks 1,2] [--repeat R] [--train PATH]\n";
      return 0;
    } else {
      std::cerr << "lockstep-bench train: unknown option " << a << "\n";
      return 2;
    }
  }
  if (train_path.empty()) {
    std::cerr << "lockstep-bench train: pass --train PATH/TO/lockstep-train\n";
    return 2;
  }
  struct Row {
    int ranks;
    double epoch_s, comm_share, samples_per_s, auc;
  };
  std::vector<Row> rows;
  for (int p : ranks) {
    std::vector<double> epoch_s, comm, sps;
    double auc = 0;
    for (int rep = 0; rep < repeat; ++rep) {
      const std::string dir = out + "/ranks-" + std::to_string(p);
      std::filesystem::remove_all(dir + "/checkpoints");
      const std::string cmd = "'" + run_path + "' --nproc-per-node " + std::to_string(p) + " --master-port 0 '" +
                              train_path + "' '" + config + "' --set run.out_dir=" + dir +
                              " --set train.epochs=" + std::to_string(epochs) +
                              " --set log.progress=false --set log.plot=false --set eval.threshold=0" +
                              " --set checkpoint.every_steps=0 > " + dir + ".log 2>&1";
      std::filesystem::create_directories(out);
      const double t0 = now_s();
      if (std::system(cmd.c_str()) != 0) {
        std::cerr << "lockstep-bench train: run failed, see " << dir << ".log\n";
        return 1;
      }
      std::ifstream in(dir + "/summary.json");
      const auto s = nlohmann::json::parse(in);
      for (double t : s.at("epoch_times_s")) epoch_s.push_back(t);
      comm.push_back(s.at("comm_share"));
      sps.push_back(s.at("samples_per_s"));
      auc = s.at("metrics").at("auc");
      std::fprintf(stderr, "ranks %d run %d: %.1f s wall, epochs %s\n", p, rep, now_s() - t0,
                   s.at("epoch_times_s").dump().c_str());
    }
    rows.push_back({p, median(epoch_s), median(comm), median(sps), auc});
  }
  const double base = rows.front().epoch_s;
  Table t({"ranks", "s/epoch (median)", "x of 1 rank", "samples/s", "exposed comm share", "backtest AUC"});
  for (const auto& r : rows)
    t.add({std::to_string(r.ranks), fmt(r.epoch_s, 2), fmt(r.epoch_s / base, 3), fmt(r.samples_per_s, 0),
           fmt(100 * r.comm_share, 1) + "%", fmt(r.auc, 4)});
  std::cout << "CTSM demo (" << config << "), " << epochs << " epochs per run, same global batch\n" << t.str();
  for (const auto& r : rows)
    if (r.ranks == 2)
      std::cout << "2 ranks: " << fmt(r.epoch_s / base, 3) << "x the time of 1 (bar <= 0.55x): "
                << (r.epoch_s / base <= 0.55 ? "met" : "NOT met") << "\n";
  return 0;
}

}  // namespace lockstep::bench
