// lockstep/train/trainer.h: the config-driven trainer behind `lockstep-train`.
//
// run(): join the process group (ddp, fsdp) -> the workload prepares its data (e.g. generates
// it, each rank writing its own part) -> train with accumulation, clipping, warmup+cosine,
// periodic atomic checkpoints -> the workload evaluates (metrics combined over all ranks)
// -> quality gate -> the workload exports (rank 0) -> summary. What is trained and how it
// is measured is the workload's (workload.h); everything else is here.
// Outputs under run.out_dir: metrics/loss-rank-R.csv (every rank), tb/ (TensorBoard),
// eval.json, summary.json, loss.png, export/ (the workload's), checkpoints/.
// Library code: errors are exceptions; run() returns the process exit code.
#pragma once

#include <lockstep/train/config.h>

#include <memory>

namespace lockstep::train {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitConfig = 2;
inline constexpr int kExitGateFailed = 3;

struct TrainerOptions {
  bool resume = false;         // continue from <checkpoint.dir>/LATEST if there is one
  bool generate_only = false;  // prepare the workload's data, then stop
};

class Trainer {
 public:
  // `setup` from load_config(): the configuration and the workload it names.
  Trainer(LoadedConfig setup, TrainerOptions options);
  ~Trainer();
  // kExitOk, or kExitGateFailed when the backtest metric misses the threshold.
  int run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::train
