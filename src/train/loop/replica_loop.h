// The trainer's loop under fault_tolerance.enable (docs/fault-tolerance.md, "The trainer"):
// each rank of `lockstep-run --fault-tolerant` is a replica (strategy.kind = "ddp"), or
// each group of --replica-size S ranks, sharding the model with FSDP (kind = "fsdp": HSDP),
// and lockstep::ft::Manager makes every step a transaction over the replicas alive at its
// start. Under HSDP a slot is S data parts, one per rank of the replica.
//
// The global batch stays the launch's: R slots per step (R = the replicas launched), slot s
// being the data part a rank s of R would train on in a fault-free run. The step's n
// members share the R slots (member k trains on slots k, k+n, ...), weight their losses
// by n/R and average the gradients over the members, so the step's gradient is the mean
// over all R slots whatever n is: a lost replica's share is taken over by the others, each
// sample is used once per epoch, and the run follows the fault-free one (up to the order
// of floating-point sums). A discarded step is made again from the same data (the data
// position is the step number). Dropout draws are seeded per (step, slot), so they do not
// depend on which replica trains a slot.
//
// A replica that (re)starts is healed by a live one at its first quorum: the model's
// parameters and buffers (HSDP: each rank's shards, and the buffers), the optimizer state
// and the loss scaler travel; the data position, the lr and the dropout seeds follow from
// the step. With --resume replica 0 alone reads the newest checkpoint and heals the others.
//
// Checkpoints are written by the first member of a due step, synchronously (the files are
// committed before that replica asks for the next quorum, so no two replicas ever write at
// once), as the replica alone would: one model.pt and optimizer.pt, or under HSDP the
// sharded checkpoint of its S ranks. eval.every_steps evaluations run on replica 0, alone,
// while it is a member; the last step's first member reports the run (evaluation, gate,
// summary.json).
#pragma once

#include "train/checkpoint/checkpointer.h"
#include "train/loop/batch_plan.h"
#include "train/loop/step_runner.h"
#include "train/report/run_report.h"
#include "train/report/step_log.h"

#include <lockstep/parallel/ft/manager.h>
#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <functional>
#include <map>
#include <memory>

namespace lockstep::train {

struct LoopResult {
  int64_t step = 0;
  double last_loss = 0;
  bool stopped = false;  // by train.stop_after_steps, before the last step
};

class ReplicaLoop {
 public:
  // `ctx`: the launch's view, no group: rank = this rank's in the launch (replica id x S +
  // its rank in the replica), world = R x S (R replicas of S ranks). `replica`: the
  // replica's own ranks (S = 1: this process alone; else their group, which the runner's
  // FSDP shards over). The model and the runner are the trainer's.
  ReplicaLoop(const TrainConfig& cfg, Workload& workload, const BatchPlan& plan,
              const RunContext& ctx, const RunContext& replica,
              std::shared_ptr<torch::nn::Module> model, StepRunner& runner);
  ~ReplicaLoop();

  // Trains until the job's last step (or train.stop_after_steps), then leaves the quorum.
  // `resume`: replica 0 starts from the newest checkpoint. `evaluate`: the workload's
  // evaluation on this process alone (eval.every_steps, on replica 0).
  LoopResult run(bool resume, const std::function<EvalResult()>& evaluate);

  // Whether this replica reports the run: it made the last step as its first member.
  bool reports() const { return reports_; }
  // The per-step log; null when this replica never took part in a step.
  StepLog* log() { return log_.get(); }
  ReplicaRecord record() const { return record_; }
  int replica_id() const { return replica_id_; }

 private:
  struct Slot {
    std::unique_ptr<BatchStream> stream;
    int64_t epoch = -1;
    int64_t position = 0;  // examples of the epoch consumed
  };
  void test_point(const char* point, int64_t step) const;
  void save_state(torch::serialize::OutputArchive& ar);
  void load_state(torch::serialize::InputArchive& ar);
  BatchStream& slot_at(int slot, int64_t step);
  double backward(int64_t step);
  bool make_step(int64_t step, double lr, double* loss);
  void after_commit(int64_t step, double loss, const std::function<EvalResult()>& evaluate);
  Checkpointer& checkpointer();

  const TrainConfig& cfg_;
  TrainConfig ckpt_cfg_;  // cfg_ with checkpoint.mode = "sync"
  Workload& workload_;
  const BatchPlan& plan_;
  const RunContext& ctx_;
  const RunContext& replica_ctx_;      // the replica's ranks: what the checkpointer sees
  int shards_ = 1, shard_ = 0;         // the replica's ranks, this one's index
  int replicas_ = 1, replica_id_ = 0;  // R launched, this one's
  std::shared_ptr<torch::nn::Module> model_;
  StepRunner& runner_;
  std::map<int, Slot> slots_;
  std::unique_ptr<StepLog> log_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<ft::Manager> ft_;
  bool reports_ = false;
  ReplicaRecord record_;
  double t_loop_ = 0;
};

}  // namespace lockstep::train
