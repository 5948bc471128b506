// lockstep/train/workload.h: what the trainer trains, behind one small interface.
//
// The trainer (trainer.h) owns everything generic: the process group, DDP and its
// communication hook or FSDP, the optimizer, accumulation, clipping, the lr schedule,
// checkpoints and resume, loss logs, TensorBoard, the progress bar, the quality gate and
// the summary. A Workload owns the rest: its configuration sections, its data, its model,
// the loss of a batch, its evaluation metrics and its export. A program registers the
// workloads it knows in a WorkloadRegistry and the config's `run.workload` picks one:
//
//   lockstep::train::WorkloadRegistry registry;
//   registry.add("mine", [] { return std::make_unique<MyWorkload>(); });
//   auto setup = lockstep::train::load_config(path, registry, overrides);
//   return lockstep::train::Trainer(std::move(setup), options).run();
//
// Call order (every rank, the same calls in the same order):
//   declare_config -> (keys parsed) -> validate_config           load_config()
//   prepare_data -> examples_per_rank -> build_model             Trainer::run()
//   train_batches -> { begin_epoch, next, loss }*                 the loop
//   evaluate -> export_model (rank 0, gate passed)
// Thread safety: none needed; the trainer calls from one thread.
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/numerics/activation_checkpoint_policy.h>

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::train {

class ConfigSchema;
struct TrainConfig;

// Where the workload runs. `group` is null for a single process (world 1).
struct RunContext {
  comm::ProcessGroup* group = nullptr;
  int rank = 0;
  int world = 1;
  const TrainConfig* config =
      nullptr;  // the trainer's sections (run.seed, run.out_dir, source, ...)

  // Prints "[lockstep-train] line" on rank 0 (the trainer's log).
  void say(const std::string& line) const;
  // Waits for every rank (no-op for a single process).
  void barrier() const;
  // The activation checkpointing [memory] asks for (docs/trainer.md; off without a config),
  // for a workload's model options.
  numerics::CheckpointPolicy checkpoint_policy() const;
};

// One micro-batch of training data; the workload defines what is in it.
class Batch {
 public:
  virtual ~Batch() = default;
};

// This rank's training batches. The order must be a pure function of (seed, epoch,
// rank) so that a resumed run replays it: begin_epoch(e, skip) starts epoch e and moves
// past the first `skip` examples of it (those consumed before the checkpoint).
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  virtual void begin_epoch(int64_t epoch, int64_t skip_examples) = 0;
  // The next `n` examples of this rank's part (fewer only at the end of the part).
  virtual std::unique_ptr<Batch> next(int64_t n) = 0;
};

// The result of evaluate(), already combined over all ranks (identical on every rank).
struct EvalResult {
  // Named scalars, in order: each is logged as TensorBoard "eval/<name>", and the gate
  // reads `eval.metric` from here (so every name of gate_metrics() must be present).
  std::vector<std::pair<std::string, double>> scalars;
  // The workload's full metrics as a JSON object: eval.json's and summary.json's
  // "metrics", and what export_model() puts in its model card.
  std::string metrics_json = "{}";
  // Lines for the run summary (rank 0 prints them after the training statistics).
  std::string report;

  // The scalar called `name`; throws lockstep::Error if there is none.
  double value(const std::string& name) const;
};

// How the quality gate reads one of the workload's metrics (Workload::gate_rule).
struct GateRule {
  bool lower_is_better = false;  // false: passes when value >= eval.threshold; true: <=
  double min = 0, max = 1;       // the values eval.threshold may take (inclusive)
};

// What the trainer knows of the run, for the exported model's card.
struct ExportInfo {
  std::string dir;  // <run.out_dir>/export
  std::string run_name;
  std::string config_json;   // the effective configuration
  std::string metrics_json;  // EvalResult::metrics_json
  std::string gate_json;     // metric, threshold, value, passed
  int64_t steps = 0;
  int world_size = 1;
};

struct ExportResult {
  std::string model_path;  // the exported weights
  std::string card_path;   // the description next to them
};

class Workload {
 public:
  virtual ~Workload() = default;

  // ---- configuration (load_config)
  // Declares the workload's keys, bound to its own fields: its sections (e.g. [data],
  // [model]) and any keys it adds to shared ones (e.g. eval.k). Called once, before
  // any value is set, on a freshly made workload.
  virtual void declare_config(ConfigSchema& schema) = 0;
  // Checks across keys once all are set; throws ConfigError starting with `source`.
  virtual void validate_config(const std::string& source) { (void)source; }
  // The metrics `eval.metric` may name (the gate); the first is the default.
  virtual std::vector<std::string> gate_metrics() const = 0;
  // How the gate compares `metric` (one of gate_metrics()) with eval.threshold, and the
  // thresholds that make sense for it (others are a config error). The default suits a
  // score in [0, 1] where higher is better (AUC, accuracy); a loss or a perplexity says
  // lower_is_better with its own range.
  virtual GateRule gate_rule(const std::string& metric) const {
    (void)metric;
    return {};
  }

  // ---- data
  // Makes sure the data exists (generating it, if the workload can): collective, called
  // once by every rank before anything below. `--generate-only` stops after it.
  virtual void prepare_data(const RunContext& ctx) = 0;
  // How many training examples each rank's part holds (size ctx.world, index = rank);
  // every rank must compute the same values (they fix the steps per epoch).
  virtual std::vector<int64_t> examples_per_rank(const RunContext& ctx) = 0;

  // ---- model
  // Builds the model (the trainer has seeded torch with run.seed). The workload keeps
  // it for loss() and evaluate(); the trainer trains, checkpoints and wraps (DDP, FSDP) it.
  // Under FSDP the layers the model wraps with lockstep::fsdp::wrap() (fsdp/wrap.h) are
  // units of their own, the rest of it one root unit.
  virtual std::shared_ptr<torch::nn::Module> build_model(const RunContext& ctx) = 0;
  // A short name for the log ("model: NAME 12345 parameters").
  virtual std::string model_name() const = 0;
  // True when build_model() honours memory.activation_checkpointing (RunContext::config):
  // its layers recompute their activations in backward (lockstep::numerics::activation_checkpoint,
  // inside their FSDP units). The trainer refuses the key for a workload that does not.
  virtual bool supports_activation_checkpointing() const { return false; }

  // ---- training
  virtual std::unique_ptr<BatchStream> train_batches(const RunContext& ctx) = 0;
  // The mean loss of one micro-batch, with its graph. The trainer calls it as the model's
  // forward pass (under DDP, after DDP's pre-forward work; under FSDP, inside FSDP's
  // forward), so it must run the model exactly once on the batch; the trainer does
  // backward and the optimizer step.
  virtual torch::Tensor loss(const Batch& batch) = 0;

  // ---- evaluation and export
  // Evaluates the model (the trainer has put it in eval mode, under NoGradGuard) on this
  // rank's part and combines the metrics over ctx.group: collective. The model is the
  // workload's own, called directly: under FSDP the trainer has gathered its full
  // parameters on every rank for evaluate() and export_model().
  virtual EvalResult evaluate(const RunContext& ctx) = 0;
  // Writes the model and its card into info.dir (rank 0 only, when the gate passed).
  virtual ExportResult export_model(const ExportInfo& info) = 0;
};

using WorkloadFactory = std::function<std::unique_ptr<Workload>()>;

// Workload names -> factories. A program fills one explicitly (e.g. ctsm::register_workload)
// and passes it to load_config(); no global registry, no static-initialiser registration.
class WorkloadRegistry {
 public:
  // Throws lockstep::InvalidArgument if `name` is empty or already registered.
  void add(const std::string& name, WorkloadFactory factory);
  bool contains(const std::string& name) const { return factories_.count(name) != 0; }
  // A new workload; throws ConfigError listing the registered names if there is none.
  std::unique_ptr<Workload> create(const std::string& name) const;
  // The registered names, sorted, comma separated ("" when none).
  std::string names() const;
  size_t size() const { return factories_.size(); }
  // The only registered name when there is exactly one, else "".
  std::string only() const { return factories_.size() == 1 ? factories_.begin()->first : ""; }
  // The workload of a config without run.workload when several are registered (a program
  // that added one later keeps its old configs working); InvalidArgument if not registered.
  void set_default(const std::string& name);
  // set_default's name, else only().
  std::string default_name() const { return default_.empty() ? only() : default_; }

 private:
  std::map<std::string, WorkloadFactory> factories_;
  std::string default_;
};

}  // namespace lockstep::train
