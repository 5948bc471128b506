#include "train/report/step_log.h"

#include <cstdio>
#include <filesystem>

namespace lockstep::train {
namespace {

std::string loss_csv(const TrainConfig& cfg, int rank) {
  std::filesystem::create_directories(cfg.run.out_dir + "/metrics");
  return cfg.run.out_dir + "/metrics/loss-rank-" + std::to_string(rank) + ".csv";
}

}  // namespace

StepLog::StepLog(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan,
                 int64_t start_step)
    : cfg_(cfg),
      ctx_(ctx),
      plan_(plan),
      start_step_(start_step),
      loss_log_(loss_csv(cfg, ctx.rank), start_step),
      bar_(plan.total_steps, start_step, ctx.rank == 0 && cfg.log.progress) {
  if (ctx.rank == 0 && cfg.log.tensorboard)
    tb_ = std::make_unique<TensorBoardWriter>(cfg.run.out_dir + "/tb", "rank0");
  if (ctx.rank == 0 && cfg.eval.every_steps > 0)
    eval_csv_.reset(open_csv(cfg.run.out_dir + "/metrics/eval.csv",
                             "step,train_s,wall_s,metric,value", start_step));
}

void StepLog::record_eval(int64_t step, double wall_s, const EvalResult& result) {
  for (const auto& [name, value] : result.scalars) {
    if (eval_csv_)
      std::fprintf(eval_csv_.get(), "%lld,%.6f,%.6f,%s,%.9g\n", (long long)step, train_time_,
                   wall_s, name.c_str(), value);
    if (tb_) tb_->add_scalar("eval/" + name, value, step);
  }
  if (eval_csv_) std::fflush(eval_csv_.get());
}

void StepLog::record(int64_t step, int64_t epoch, double loss, double lr, double step_s) {
  epoch_time_ += step_s;
  train_time_ += step_s;
  if (step % plan_.steps_per_epoch == 0) {  // an epoch ended; report it only if it ran whole here
    if (step - plan_.steps_per_epoch >= start_step_) epoch_times_.push_back(epoch_time_);
    epoch_time_ = 0;
  }
  loss_log_.append(step, epoch, loss, lr, step_s);
  if (tb_ && (step % cfg_.log.every_steps == 0 || step == plan_.total_steps)) {
    tb_->add_scalar("train/loss", loss, step);
    tb_->add_scalar("train/lr", lr, step);
    tb_->add_scalar("train/samples_per_s", double(plan_.per_step * ctx_.world) / step_s, step);
  }
  char note[64];
  std::snprintf(note, sizeof note, "loss %.4f", loss);
  bar_.update(step, note);
}

}  // namespace lockstep::train
