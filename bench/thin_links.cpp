// lockstep-bench thin-links: time to quality across thin links (docs/thin-links.md).
//
// Runs bench/thin_links.sh (2 network-namespace hosts, one rank each, links shaped to each
// rate; the CTSM job of bench/thin-links.toml once per method, evaluated every few steps),
// then reads its runs and reports, per rate and method: the bytes each host's link carried,
// the training seconds until the backtest AUC first reached the target, the final AUC, and
// the ratios to DDP fp32 at the same rate (same run); one PNG per rate (AUC against training
// seconds, one line per method). Training seconds exclude the evaluations (eval.csv's
// train_s). --report-only re-reads runs made before.
//   lockstep-bench thin-links [--rates 1gbit,100mbit,10mbit] [--methods A,B] [--epochs N]
//                             [--target-auc X] [--out DIR]
#include "bench_util.h"
#include "commands.h"

#include "train/report/loss_plot.h"

#include <lockstep/train/atomic_file.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace lockstep::bench {
namespace {

using nlohmann::json;

struct Options {
  std::vector<std::string> rates = {"1gbit", "100mbit", "10mbit"};
  std::vector<std::string> methods;  // labels of bench/thin_links.sh's catalog; empty: its six
  int epochs = 0;                    // > 0: train.epochs of every run (bench/thin-links.toml: 4)
  std::string out = "out/bench-thin-links";
  double target_auc = -1;  // < 0: DDP fp32's best final AUC - 0.01
  bool report_only = false;
};

struct Run {
  std::string rate, method;
  bool ok = false;
  double mb_sent = 0;  // per host, mean of the two
  double final_auc = NAN, train_s = NAN;
  train::LossSeries curve;  // (train_s, auc)
};

std::optional<Run> load_run(const std::string& dir, const std::string& rate,
                            const std::string& method) {
  std::ifstream w(dir + "/wire.json"), s(dir + "/summary.json");
  if (!w) return std::nullopt;
  Run r;
  r.rate = rate, r.method = method;
  const json wire = json::parse(w);
  r.ok = wire.at("ok") && s;
  r.mb_sent = (wire.at("host_sent")[0].get<double>() + wire.at("host_sent")[1].get<double>()) / 2e6;
  if (!r.ok) return r;
  const json sum = json::parse(s);
  r.final_auc = sum.at("metrics").at("auc");
  r.train_s = sum.at("train_time_s");
  std::ifstream csv(dir + "/metrics/eval.csv");
  std::string line;
  std::getline(csv, line);  // step,train_s,wall_s,metric,value
  while (std::getline(csv, line)) {
    std::istringstream in(line);
    std::string step, train_s, wall_s, metric, value;
    std::getline(in, step, ','), std::getline(in, train_s, ','), std::getline(in, wall_s, ',');
    std::getline(in, metric, ','), std::getline(in, value, ',');
    if (metric == "auc") r.curve.emplace_back(std::stod(train_s), std::stod(value));
  }
  return r;
}

// Training seconds at the first evaluation that reached `target`; NaN when none did.
double time_to(const Run& r, double target) {
  for (const auto& [t, auc] : r.curve)
    if (auc >= target) return t;
  return NAN;
}

std::vector<std::string> methods_of(const Options& o) {
  std::vector<std::string> m;
  std::ifstream in(o.out + "/methods.txt");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) m.push_back(line);
  return m;
}

const Run* find(const std::vector<Run>& runs, const std::string& rate, const std::string& m) {
  for (const auto& r : runs)
    if (r.rate == rate && r.method == m) return &r;
  return nullptr;
}

std::string ratio(double ours, double base) {
  return std::isfinite(ours) && std::isfinite(base) && ours > 0 ? fmt(base / ours, 2) + "x" : "-";
}

void report_rate(const Options& o, const std::vector<Run>& runs, const std::string& rate,
                 const std::vector<std::string>& methods, double target) {
  const Run* base = find(runs, rate, "ddp-fp32");
  Table t({"method", "MB sent/host", "x fewer bytes", "s to AUC " + fmt(target, 3), "x faster",
           "final AUC", "AUC - ddp-fp32", "train s"});
  std::vector<train::LossSeries> curves;
  train::ChartLabels labels;
  labels.x = "training seconds at " + rate;
  labels.y = "auc";
  labels.legend_at_bottom = true;
  for (const auto& m : methods) {
    const Run* r = find(runs, rate, m);
    if (!r) continue;
    if (!r->ok) {
      t.add({m, fmt(r->mb_sent, 1), "-", "failed", "-", "-", "-", "-"});
      continue;
    }
    const double tt = time_to(*r, target), bt = base && base->ok ? time_to(*base, target) : NAN;
    t.add({m, fmt(r->mb_sent, 1), base ? ratio(r->mb_sent, base->mb_sent) : "-",
           std::isfinite(tt) ? fmt(tt, 1) : "not reached", ratio(tt, bt), fmt(r->final_auc, 4),
           base && base->ok ? fmt(r->final_auc - base->final_auc, 4) : "-", fmt(r->train_s, 1)});
    curves.push_back(r->curve);
    labels.names.push_back(m);
  }
  std::cout << "\n"
            << rate << " per host link (2 hosts x 1 rank), target AUC " << fmt(target, 4) << ":\n"
            << t.str();
  const std::string png = o.out + "/thin-links-" + rate + ".png";
  train::write_file_atomic(png, train::encode_png(train::render_line_chart(curves, labels)));
  std::cout << "plot: " << png << "\n";
}

int run(const Options& o) {
  if (!o.report_only) {
    const std::filesystem::path run_path(LOCKSTEP_RUN_PATH);  // BUILD/apps/lockstep-run
    auto words = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& w : v) s += (s.empty() ? "" : " ") + w;
      return s;
    };
    std::string env = "RATES='" + words(o.rates) + "'";
    if (!o.methods.empty()) env += " ONLY='" + words(o.methods) + "'";
    if (o.epochs > 0) env += " EXTRA='--set train.epochs=" + std::to_string(o.epochs) + "'";
    const std::string cmd = env + " bash '" + LOCKSTEP_SOURCE_DIR + "/bench/thin_links.sh' '" +
                            run_path.parent_path().parent_path().string() + "' '" + o.out + "'";
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::cerr << "lockstep-bench thin-links: bench/thin_links.sh failed (status " << rc << ")\n";
      return WIFEXITED(rc) && WEXITSTATUS(rc) == 77 ? 77 : 1;
    }
  }
  const auto methods = methods_of(o);
  std::vector<Run> runs;
  double best_ddp = NAN;
  for (const auto& rate : o.rates)
    for (const auto& m : methods)
      if (auto r = load_run((std::filesystem::path(o.out) / rate / m).string(), rate, m)) {
        if (m == "ddp-fp32" && r->ok && !(r->final_auc <= best_ddp)) best_ddp = r->final_auc;
        runs.push_back(*r);
      }
  if (runs.empty()) {
    std::cerr << "lockstep-bench thin-links: no runs in " << o.out << "\n";
    return 1;
  }
  const double target = o.target_auc >= 0 ? o.target_auc : best_ddp - 0.01;
  for (const auto& rate : o.rates) report_rate(o, runs, rate, methods, target);
  return 0;
}

}  // namespace

Command thin_links_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app = bench.add_subcommand(
      "thin-links",
      "time to quality of DDP, its compression hooks and DiLoCo on 2 hosts over shaped links "
      "(network namespaces: needs root)");
  app->add_option("--rates", o->rates, "link rates (tc syntax), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app->add_option("--methods", o->methods,
                  "methods of bench/thin_links.sh's catalog, comma-separated (default: its six)")
      ->delimiter(',');
  app->add_option("--epochs", o->epochs, "train.epochs of every run (default: the config's 4)")
      ->check(CLI::PositiveNumber);
  app->add_option("--target-auc", o->target_auc,
                  "the AUC to time (default: DDP fp32's best final AUC - 0.01)");
  app->add_option("--out", o->out, "folder of the runs")->capture_default_str();
  app->add_flag("--report-only", o->report_only, "report the runs already in --out");
  return {app, [o] { return run(*o); }};
}

}  // namespace lockstep::bench
