#include "train/report/run_report.h"

#include "train/report/loss_plot.h"

#include <lockstep/train/atomic_file.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <iostream>
#include <sstream>

using json = nlohmann::json;

namespace lockstep::train {
namespace {

void say(const std::string& s) { std::cout << "[lockstep-train] " << s << std::endl; }

json gate_json(const GateDecision& g) {
  return {{"metric", g.metric},
          {"threshold", g.threshold},
          {"value", g.value},
          {"better", g.lower_is_better ? "lower" : "higher"},
          {"passed", g.passed}};
}

ExportResult export_if_passed(const TrainConfig& cfg, Workload& workload, const EvalResult& r,
                              const GateDecision& g, const RunStats& s) {
  if (!g.passed) return {};
  ExportInfo info;
  info.dir = cfg.run.out_dir + "/export";
  info.run_name = cfg.run.name;
  info.config_json = cfg.json;
  info.metrics_json = r.metrics_json;
  info.gate_json = gate_json(g).dump();
  info.steps = s.step;
  info.world_size = s.world;
  return workload.export_model(info);
}

double mean_of(const std::vector<double>& v) {
  double m = 0;
  for (double t : v) m += t / double(v.size());
  return m;
}

json replica_json(const std::optional<ReplicaRecord>& r) {
  if (!r) return nullptr;
  return {{"replica_id", r->replica_id},
          {"replicas_at_end", r->replicas_at_end},
          {"joined_at_step", r->joined_at},
          {"committed_steps", r->stats.committed},
          {"discarded_steps", r->stats.discarded},
          {"heals_received", r->stats.heals},
          {"heals_given", r->stats.healed_others},
          {"group_rebuilds", r->stats.rebuilds},
          {"time_lost_s", r->time_lost_s()},
          {"discarded_s", r->stats.discarded_s},
          {"heal_s", r->stats.heal_s},
          {"rebuild_s", r->stats.rebuild_s}};
}

json summary_json(const TrainConfig& cfg, const EvalResult& r, const GateDecision& g,
                  const RunStats& s, const ExportResult& exported, const std::string& tb_path,
                  const std::string& png) {
  return {{"run", cfg.run.name},
          {"world_size", s.world},
          {"backend", s.backend},
          {"strategy", cfg.strategy.kind},
          {"comm_hook", cfg.strategy.comm_hook},
          {"steps", s.step},
          {"steps_this_run", s.steps_run},
          {"steps_per_epoch", s.steps_per_epoch},
          {"global_batch", s.global_batch},
          {"epoch_times_s", s.epoch_times},
          {"mean_epoch_time_s", mean_of(s.epoch_times)},
          {"train_time_s", s.train_time},
          {"eval_time_s", s.eval_time},
          {"wall_time_s", s.wall_time},
          {"samples_per_s", s.samples_per_s},
          {"comm_share", s.comm_measured ? json(s.comm_share) : json(nullptr)},
          {"bytes_per_step", s.bytes_measured ? json(s.bytes_per_step) : json(nullptr)},
          {"final_loss", s.final_loss},
          {"param_crc32", s.param_crc32},
          {"skipped_steps", s.skipped_steps},
          {"loss_scale", s.loss_scale > 0 ? json(s.loss_scale) : json(nullptr)},
          {"fault_tolerance", replica_json(s.replica)},
          {"metrics", json::parse(r.metrics_json)},
          {"gate", gate_json(g)},
          {"paths",
           {{"model", exported.model_path},
            {"model_card", exported.card_path},
            {"loss_csv", cfg.run.out_dir + "/metrics"},
            {"tensorboard", tb_path},
            {"loss_png", png}}}};
}

// Indents every line of the workload's report under the summary.
std::string indented(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out += "  " + line + "\n";
  return out;
}

void print_summary(const TrainConfig& cfg, const EvalResult& r, const RunStats& s,
                   const std::string& tb_path, const std::string& png) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(4);
  os << "summary: " << s.step << " steps, " << s.epoch_times.size() << " full epochs, mean "
     << mean_of(s.epoch_times) << " s/epoch, " << s.samples_per_s << " samples/s, ";
  if (s.comm_measured)
    os << "exposed comm " << 100 * s.comm_share << "% of step time\n";
  else
    os << "exposed comm not measured (" << cfg.strategy.kind << ")\n";
  if (s.replica)
    os << "  fault tolerance (replica " << s.replica->replica_id
       << "): " << s.replica->stats.committed << " steps committed, " << s.replica->stats.discarded
       << " discarded, " << s.replica->stats.heals + s.replica->stats.healed_others << " heals, "
       << s.replica->time_lost_s() << " s lost; " << s.replica->replicas_at_end
       << " replicas at the end\n";
  os << indented(r.report) << "  metrics: " << cfg.run.out_dir
     << "/summary.json, eval.json, metrics/loss-rank-*.csv"
     << (tb_path.empty() ? "" : ", " + tb_path) << (png.empty() ? "" : "\n  loss curve: " + png);
  say(os.str());
}

void print_gate(const GateDecision& g, const ExportResult& exported) {
  if (g.passed) {
    say("quality gate passed: " + g.metric + " " + std::to_string(g.value) +
        (g.lower_is_better ? " <= " : " >= ") + std::to_string(g.threshold) +
        "\n  model: " + exported.model_path + "\n  card:  " + exported.card_path);
  } else {
    std::cerr << "[lockstep-train] quality gate FAILED: " << g.metric << " " << g.value
              << (g.lower_is_better ? " > threshold " : " < threshold ") << g.threshold
              << " (missed by " << std::abs(g.threshold - g.value) << "); model not exported"
              << std::endl;
  }
}

}  // namespace

GateDecision decide_gate(const TrainConfig& cfg, const EvalResult& result) {
  GateDecision g;
  g.metric = cfg.eval.metric;
  g.threshold = cfg.eval.threshold;
  g.value = result.value(cfg.eval.metric);
  g.lower_is_better = cfg.eval.lower_is_better;
  g.passed = g.lower_is_better ? g.value <= g.threshold : g.value >= g.threshold;
  return g;
}

void report_run(const TrainConfig& cfg, Workload& workload, const EvalResult& r,
                const GateDecision& g, const RunStats& s, TensorBoardWriter* tb) {
  const json eval = {{"metrics", json::parse(r.metrics_json)}, {"gate", gate_json(g)}};
  write_file_atomic(cfg.run.out_dir + "/eval.json", eval.dump(2) + "\n");
  if (tb)
    for (const auto& [name, value] : r.scalars) tb->add_scalar("eval/" + name, value, s.step);
  const ExportResult exported = export_if_passed(cfg, workload, r, g, s);
  const std::string png = cfg.run.out_dir + "/loss.png";
  const bool plotted = cfg.log.plot && plot_loss_curves(cfg.run.out_dir + "/metrics", s.world, png);
  const std::string tb_path = tb ? tb->path() : "";
  const json summary = summary_json(cfg, r, g, s, exported, tb_path, plotted ? png : "");
  write_file_atomic(cfg.run.out_dir + "/summary.json", summary.dump(2) + "\n");
  print_summary(cfg, r, s, tb_path, plotted ? png : "");
  print_gate(g, exported);
}

}  // namespace lockstep::train
