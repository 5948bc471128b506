// The end of a run on rank 0: the quality gate, eval.json, the export (gate passed), the
// loss-curve PNG, summary.json and the printed summary (docs/trainer.md, "Outputs").
#pragma once

#include "train/report/tensorboard_writer.h"

#include <lockstep/parallel/ft/manager.h>
#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::train {

// A fault-tolerant run (fault_tolerance.enable), as the replica that reports it saw it.
struct ReplicaRecord {
  int replica_id = 0;
  int replicas_at_end = 0;  // members of the last committed step
  int64_t joined_at = 0;    // the step this process started training at (healed to it)
  ft::ManagerStats stats;   // this process's
  double time_lost_s() const { return stats.discarded_s + stats.heal_s + stats.rebuild_s; }
};

// Run statistics the summary reports (each already combined over ranks where it says so).
struct RunStats {
  int world = 1;
  std::string backend = "none";
  int64_t step = 0;       // the last step (global)
  int64_t steps_run = 0;  // steps this process ran (after a resume: fewer)
  int64_t steps_per_epoch = 0;
  int64_t global_batch = 0;  // examples per optimizer step over all ranks
  std::vector<double> epoch_times;
  double train_time = 0, eval_time = 0, wall_time = 0;
  double samples_per_s = 0;
  double comm_share = 0;  // exposed communication / step time, mean over ranks
  int64_t bytes_per_step = 0;
  bool comm_measured = true;   // false under FSDP, which reports no communication statistics
  bool bytes_measured = true;  // bytes_per_step: DDP's and FSDP's (gathers and reductions)
  double final_loss = 0;
  int64_t param_crc32 = 0;
  int64_t skipped_steps = 0;  // steps skipped as non-finite (train.non_finite, loss scaling)
  double loss_scale = 0;      // the loss scaler's final scale (0: no loss scaling)
  // fault_tolerance.enable: the reporting replica's record (its view of the job).
  std::optional<ReplicaRecord> replica;
};

struct GateDecision {
  std::string metric;
  double threshold = 0, value = 0;
  bool lower_is_better = false;  // passed: value <= threshold (else value >= threshold)
  bool passed = false;
};

GateDecision decide_gate(const TrainConfig& cfg, const EvalResult& result);

// Rank 0 only: writes eval.json, exports through the workload when the gate passed,
// draws loss.png (log.plot), writes summary.json, prints the summary and the gate's
// verdict, and logs the eval scalars to `tb` (may be null).
void report_run(const TrainConfig& cfg, Workload& workload, const EvalResult& result,
                const GateDecision& gate, const RunStats& stats, TensorBoardWriter* tb);

}  // namespace lockstep::train
