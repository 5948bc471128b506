// lockstep/train/trainer.h: the config-driven CTSM trainer behind `lockstep-train`.
//
// run(): join the process group (ddp) -> make sure the event log exists (generate it,
// each rank writing its own shards) -> train with accumulation, clipping, warmup+cosine,
// periodic atomic checkpoints -> backtest on the period after the cutoff (metrics
// combined over all ranks) -> quality gate -> export (rank 0) -> summary.
// Outputs under run.out_dir: metrics/loss-rank-R.csv (every rank), tb/ (TensorBoard),
// eval.json, summary.json, loss.png, export/{ctsm.pt,model_card.json}, checkpoints/.
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
  bool generate_only = false;  // make the data set, then stop
};

class Trainer {
 public:
  Trainer(TrainConfig config, TrainerOptions options);
  ~Trainer();
  // kExitOk, or kExitGateFailed when the backtest metric misses the threshold.
  int run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::train
