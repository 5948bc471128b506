// What the trainer records per step: the per-rank loss CSV, TensorBoard scalars (rank 0),
// the progress bar (rank 0), and the time of every epoch that ran whole in this process.
#pragma once

#include "train/loop/batch_plan.h"
#include "train/report/loss_log.h"
#include "train/report/tensorboard_writer.h"

#include <lockstep/train/config.h>
#include <lockstep/train/progress_bar.h>
#include <lockstep/train/workload.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

namespace lockstep::train {

// Seconds on the steady clock: what step times and the loop's wall times are measured with.
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class StepLog {
 public:
  // Opens metrics/loss-rank-R.csv (cut back to `start_step` on resume) and, on rank 0,
  // the TensorBoard writer (log.tensorboard) and the progress bar (log.progress).
  StepLog(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan, int64_t start_step);

  // Step `step` (1-based, just finished) of `epoch` took `step_s` seconds.
  void record(int64_t step, int64_t epoch, double loss, double lr, double step_s);
  // eval.every_steps: the evaluation after step `step` (rank 0 writes it; every rank may
  // call): rows "step,train_s,wall_s,metric,value" of metrics/eval.csv, one per scalar, with
  // the seconds spent in steps so far and `wall_s` (the loop's elapsed time, evaluations
  // included), and TensorBoard's eval/<name>.
  void record_eval(int64_t step, double wall_s, const EvalResult& result);
  void finish() { bar_.finish(); }

  TensorBoardWriter* tensorboard() { return tb_.get(); }  // null unless rank 0 with log.tensorboard
  const std::vector<double>& epoch_times() const { return epoch_times_; }
  double train_time() const { return train_time_; }  // seconds in steps, this process

 private:
  const TrainConfig& cfg_;
  const RunContext& ctx_;
  const BatchPlan& plan_;
  int64_t start_step_;
  LossLog loss_log_;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> eval_csv_{nullptr, &std::fclose};
  ProgressBar bar_;
  std::vector<double> epoch_times_;
  double epoch_time_ = 0, train_time_ = 0;
};

}  // namespace lockstep::train
