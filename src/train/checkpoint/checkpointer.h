// The trainer's checkpoints: what goes into one (model, optimizer, every rank's RNG, the
// position in the data) and how a run resumes from the newest (docs/checkpoint-format.md).
// Under FSDP the model and optimizer are sharded: every rank writes its own
// FSDPCore::sharded_file_name(rank) instead of rank 0's model.pt and optimizer.pt (the
// loader reshards them). A run may resume on another world size under either strategy.
// Files are written atomically and verified on load by CheckpointStore.
//
// checkpoint.mode = "async" (the default): a save copies the state into host staging
// buffers reused by every save (in save(), or beside the next step with
// set_copy_beside_step) and returns; one background thread (CheckpointWriter)
// serializes, checksums, writes and fsyncs the files; a later step, once every rank's
// files are durable, commits the checkpoint (rank 0's rename and LATEST, in the
// background too). At most one save is in flight: the next one waits for it. Every
// collective a save needs runs in the step, on every rank in the same order
// (docs/checkpoints.md, "Asynchronous saves"). "sync" runs the same work in the step.
#pragma once

#include "train/checkpoint/checkpoint_staging.h"
#include "train/checkpoint/checkpoint_writer.h"
#include "train/loop/batch_plan.h"

#include <lockstep/numerics/grad_scaler.h>
#include <lockstep/parallel/diloco/diloco.h>
#include <lockstep/parallel/fsdp/core.h>

#include <lockstep/train/atomic_file.h>
#include <lockstep/train/checkpoint_store.h>
#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <torch/torch.h>
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::train {

// The restart count the launcher exported (LOCKSTEP_RESTART_COUNT, else torchrun's
// TORCHELASTIC_RESTART_COUNT; lockstep/env_contract.h): 0 on a first start or when unset.
// Throws ConfigError naming the variable when it is not a non-negative integer.
int64_t restart_count_from_env();

class Checkpointer {
 public:
  // Collective (a barrier after rank 0 removed crash leftovers, step-N.tmp/).
  // `fsdp`: the model's FSDP core when strategy.kind = "fsdp" (sharded files), else null.
  Checkpointer(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan,
               std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
               fsdp::FSDPCore* fsdp);
  // Not collective (an error path may have lost the group): waits for this rank's running
  // background job and stops the writer. A save whose files were not committed stays in
  // step-N.tmp/ (resume ignores it; the next save of that step clears it).
  ~Checkpointer();

  // Collective. Loads the newest intact checkpoint into the model, optimizer and this
  // rank's RNG; returns the step to start at (0 when there is none). A damaged checkpoint
  // (a CheckpointError on any rank: checksum, size, missing file, unparsable archive) is
  // skipped with a warning and the previous one tried; when none is intact it throws
  // CheckpointError. Throws ConfigError when it was written for another number of steps or
  // by another strategy (sharded vs not); another world size is fine (the same total steps,
  // e.g. with train.keep_global_batch, map the data position);
  // Error when an intact file does not fit this model (no fallback: older ones won't).
  int64_t resume();
  // Whether `step` gets a checkpoint: every checkpoint.every_steps, the last step, or
  // when the run stops there (train.stop_after_steps).
  bool due(int64_t step) const;
  // Collective, once after every optimizer step (the same steps on every rank): commits
  // the in-flight save once every rank's files are durable (one allreduce of 3 integers
  // per step while a save is in flight, none otherwise), then save()s when due(step).
  // Throws Error on every rank when a rank's background write failed.
  void after_step(int64_t step, double last_loss);
  // Collective. Waits for the in-flight save, if any (the previous one: at most one is in
  // flight), then writes this one: async, stages the state and returns once the
  // background writer has it; sync, returns once the checkpoint is committed.
  void save(int64_t step, double last_loss);
  // Collective: waits for the in-flight save and commits it (the end of training, or a
  // stop); throws Error on every rank when a rank's write or rank 0's commit failed.
  void finish();
  bool async() const { return writer_->background(); }
  // Whether a save is in flight (written or committing; until the next save or finish()).
  // Under async, rank 0's commit runs in the background: this rank's view, not collective.
  bool in_flight() const {
    return in_flight_ &&
           (!in_flight_->committing || writer_->state() == CheckpointWriter::State::kBusy);
  }
  // The staging buffers (tests check that saves reuse them; the benchmark reports bytes).
  const HostStaging& staging() const { return staging_; }
  // The owner calls before_update() before every optimizer update: an async save's staging
  // copy then runs on a thread of its own beside the next forward and backward (which read
  // the parameters and the optimizer's state but do not change them), instead of in save().
  // Not under DiLoCo (its outer step changes the parameters outside the update).
  void set_copy_beside_step(bool on) { copy_beside_step_ = on; }
  // Before the optimizer update that follows a save (set_copy_beside_step): waits for the
  // save's staging copy if it still runs. Not collective.
  void before_update();
  // Seconds the last save() spent taking its snapshot (async: the staging copy, unless it
  // runs beside the step) and the last before_update() waited for the copy: the
  // benchmark's breakdown of the time the step is blocked.
  double last_snapshot_s() const { return last_snapshot_s_; }
  double last_copy_wait_s() const { return last_copy_wait_s_; }
  // The loss scaler whose scale and growth tracker go into meta.json and come back on
  // resume (precision.loss_scaling = "dynamic"); null: none.
  void set_scaler(numerics::GradScaler* scaler) { scaler_ = scaler; }
  // The outer loop (strategy.kind = "diloco"), else null: its replicas differ inside a round,
  // so every rank writes its own model, optimizer and DiLoCo state, and a resume needs the
  // same world size.
  void set_diloco(diloco::DiLoCo* outer) { diloco_ = outer; }

 private:
  // One file of a save: its name and what writes its bytes.
  struct PendingFile {
    std::string name;
    std::function<void(AtomicFileWriter&)> write;
  };
  // The save in flight: written (files being written, then durable) or committing.
  struct InFlight {
    int64_t step = 0;
    std::string meta;  // rank 0's meta.json, without the files table
    bool committing = false;
  };
  std::string meta_json(int64_t step, double last_loss) const;
  std::vector<PendingFile> live_files();
  bool writes_fsdp_shard() const;
  std::string fsdp_shard_file() const;
  std::vector<PendingFile> staged_files();
  std::string ddp_file(const std::string& name, int writer) const;
  // An async save's staging copy runs beside the next step (not under DiLoCo).
  bool copies_beside_step() const { return async() && copy_beside_step_ && !diloco_; }
  std::vector<PendingFile> full_files(const std::string& model, const std::string& optimizer,
                                      bool staged);
  std::vector<PendingFile> replica_files(bool staged);
  void write_files(int64_t step, const std::vector<PendingFile>& files);
  void poll();
  void settle();
  void commit_in_flight();
  void agree_ok(bool done_everywhere);

  std::vector<std::string> shared_candidates() const;
  int64_t load(const std::string& dir);
  void check_compatible(const std::string& dir, const nlohmann::json& meta) const;
  void load_state(const CheckpointReader& ck);
  void load_replica(const CheckpointReader& ck);
  void restore_rng(const CheckpointReader& ck, int64_t step, int saved_world) const;

  const TrainConfig& cfg_;
  const RunContext& ctx_;
  const BatchPlan& plan_;
  std::shared_ptr<torch::nn::Module> model_;
  torch::optim::Optimizer& optimizer_;
  fsdp::FSDPCore* fsdp_;
  numerics::GradScaler* scaler_ = nullptr;
  diloco::DiLoCo* diloco_ = nullptr;
  CheckpointStore store_;
  std::string resumed_note_;           // load()'s line for the log, said once every rank succeeded
  std::optional<InFlight> in_flight_;  // the same on every rank
  std::string manifest_;               // this rank's lines, set by the write job
  HostStaging staging_;
  bool copy_beside_step_ = false;
  std::shared_future<void> copy_;  // the staging copy running beside the step, if any
  double last_snapshot_s_ = 0, last_copy_wait_s_ = 0;
  std::unique_ptr<FsdpShardLayout> fsdp_layout_;  // async FSDP: read once
  std::unique_ptr<CheckpointWriter> writer_;      // last: stopped first, before what it uses
};

}  // namespace lockstep::train
