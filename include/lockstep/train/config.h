// lockstep/train/config.h: the trainer's TOML configuration (docs/trainer.md).
//
// The trainer's generic sections are here; a workload's sections (e.g. CTSM's [data] and
// [model]) are declared and validated by the workload (workload.h, config_schema.h).
//
// The schema is strict: an unknown key, a value of the wrong type or out of range is a
// ConfigError whose message starts with "FILE:LINE:COLUMN:" and names the key, so a typo
// never silently falls back to a default. `--set key=value` overrides are parsed as
// TOML values (bare words become strings) and checked by the same schema; their errors
// name the override instead of a file line.
#pragma once

#include <lockstep/error.h>
#include <lockstep/train/workload.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::train {

struct RunConfig {
  std::string workload;  // a name in the WorkloadRegistry; default: the only one registered
  std::string name;      // default: the workload's name
  std::string out_dir;   // default: "out/<workload>"
  int64_t seed = 1;
  bool assume_yes = false;  // not a TOML key: lockstep-train --yes (e.g. generate large data)
};

struct OptimConfig {
  std::string name = "adamw";  // "sgd" | "adamw" | "anyprecision_adamw"
  double lr = 1e-3;
  double weight_decay = 0.01;
  double momentum = 0.9;  // sgd
  double beta1 = 0.9;     // adamw
  double beta2 = 0.999;
  double grad_clip = 1.0;  // max global L2 norm; 0 = off
  // How lr follows the global batch when it differs from the reference one
  // (train.keep_global_batch = false and a different world size): "linear", "sqrt", "none".
  std::string lr_scaling = "linear";
  // anyprecision_adamw (lockstep::numerics::AnyPrecisionAdamW): Kahan-compensated updates and
  // the dtypes of its states ("float32" | "bfloat16" | "float64").
  bool kahan_summation = false;
  std::string momentum_dtype = "float32";
  std::string variance_dtype = "float32";
  std::string compensation_dtype = "float32";
};

// Mixed precision (docs/precision.md).
struct PrecisionConfig {
  std::string param_dtype =
      "float32";                  // the model's parameters: "float32" | "bfloat16" | "float64"
  std::string autocast = "none";  // the forward's compute dtype: "none" | "bfloat16" | "float16"
  std::string loss_scaling = "none";  // "none" | "dynamic" (lockstep::numerics::GradScaler)
  double init_scale = 65536.0;
  int64_t growth_interval = 2000;
};

// Memory savers (docs/memory.md).
struct MemoryConfig {
  bool activation_checkpointing = false;  // recompute the workload's layers in backward
  // Which of them and which part (lockstep::numerics::CheckpointPolicy): layers 0, k, 2k, ...; the
  // whole layer or its "attention" / "mlp" block; dropout masks kept or drawn again.
  int64_t checkpoint_every = 1;
  std::string checkpoint_blocks = "layer";
  bool keep_dropout_masks = true;
};

struct ScheduleConfig {
  int64_t warmup_steps = 50;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio at the last step
};

struct TrainLoopConfig {
  int64_t epochs = 3;
  int64_t batch_size = 64;           // per rank, per micro-step
  int64_t grad_accum = 1;            // micro-steps per optimizer step
  int64_t reference_world_size = 1;  // world size the batch/lr settings were tuned for
  bool keep_global_batch = false;    // recompute grad_accum so the global batch stays fixed
  int64_t max_steps = 0;             // 0 = epochs * steps_per_epoch
  int64_t stop_after_steps = 0;      // stop (as if interrupted) after this step; 0 = never
  int64_t threads = 1;               // intra-op threads per rank
  // A step whose loss or gradients are not finite on some rank: "stop" the job naming the
  // step and the ranks, or "skip" the step on every rank.
  std::string non_finite = "stop";
};

struct StrategyConfig {
  std::string kind = "ddp";        // "single" | "ddp" | "fsdp" | "diloco"
  std::string comm_hook = "none";  // "none" | "bf16" | "qsgd" | "powersgd" (DDP only)
  int64_t qsgd_bits = 4;
  int64_t qsgd_bucket_size = 128;
  // comm_hook = "powersgd": lockstep::ddp::hooks::PowerSgdOptions (PyTorch's defaults).
  int64_t powersgd_rank = 1;
  int64_t powersgd_start_iter = 1000;  // steps of plain allreduce first
  double powersgd_min_compression_rate = 2.0;
  bool powersgd_error_feedback = true;
  bool powersgd_warm_start = true;
  std::string backend = "auto";  // process group backend

  // kind = "diloco": lockstep::diloco::DiLoCoOptions (docs/thin-links.md). Local SGD is
  // outer_lr 1, outer_momentum 0, nesterov false. compression "qsgd" uses qsgd_bits and
  // qsgd_bucket_size.
  int64_t diloco_inner_steps = 50;
  double diloco_outer_lr = 0.7;
  double diloco_outer_momentum = 0.9;
  bool diloco_nesterov = true;
  int64_t diloco_fragments = 1;
  int64_t diloco_overlap_steps = 0;
  double diloco_mixing = 0.0;
  std::string diloco_compression = "none";  // "none" | "qsgd"

  // FSDP (kind = "fsdp"; ignored otherwise): lockstep::fsdp::FSDPOptions, docs/trainer.md.
  std::string sharding = "full_shard";  // fsdp::parse_strategy's names
  std::string wrap = "all";             // "all": every fsdp::wrap()ed layer is a unit; "size"
  int64_t wrap_min_params = 100000;     // wrap = "size": units of at least this many elements
  std::string param_dtype;              // "" (the model's) | "float32" | "bfloat16"
  std::string reduce_dtype;             // "" (= param_dtype) | "float32" | "bfloat16"
  bool backward_prefetch = true;
  bool forward_prefetch = false;
  // FSDPOptions::compression (ZeRO++): 0 = off; gather_bits quantizes the parameters'
  // all-gathers (8 or 4), reduce_bits the gradients' reduce-scatter (4: QSGD), with
  // qsgd_bucket_size values per bucket.
  int64_t gather_bits = 0;
  int64_t reduce_bits = 0;
  // FSDPOptions::secondary_group (ZeRO++'s hpZ, full_shard): the node's ranks keep a
  // secondary shard from forward to backward, so the backward gather stays in the node.
  bool secondary_shards = false;
};

// The quality gate. The workload names the metrics it can gate on
// (Workload::gate_metrics) and may add its own keys to [eval] (e.g. eval.k).
struct EvalConfig {
  std::string metric;      // default: the workload's first gate metric
  double threshold = 0.7;  // export only if metric >= threshold (<= when lower_is_better)
  // Not a TOML key: the workload's Workload::gate_rule(metric).lower_is_better.
  bool lower_is_better = false;
  // > 0: evaluate every this many steps too (metrics/eval.csv: quality against time).
  int64_t every_steps = 0;
};

struct CheckpointConfig {
  int64_t every_steps = 100;  // 0 = only at the end
  int64_t keep = 2;
  std::string dir;  // default: <run.out_dir>/checkpoints
  // "async": the step copies the state to host memory and a background thread writes it
  // (the step is blocked for the copy only); "sync": the step writes and commits it.
  // The same files either way (docs/checkpoints.md, "Asynchronous saves").
  std::string mode = "async";
};

// Training that survives lost replicas (docs/fault-tolerance.md): each rank of
// `lockstep-run --fault-tolerant` is a replica; a lost one is dropped at the next step and
// restarted alone, and joins again healed by a live one.
struct FaultToleranceConfig {
  bool enable = false;
  int64_t min_replicas = 1;       // fewer left: the job stops cleanly, saying so
  double heartbeat_s = 0.25;      // to the quorum service
  double timeout_s = 60;          // each cross-replica op: the bound on a stuck peer
  double quorum_timeout_s = 300;  // how long a replica waits for a quorum
};

struct LogConfig {
  int64_t every_steps = 10;
  bool progress = true;
  bool tensorboard = true;
  bool plot = true;
};

struct TrainConfig {
  RunConfig run;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainLoopConfig train;
  StrategyConfig strategy;
  PrecisionConfig precision;
  MemoryConfig memory;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  FaultToleranceConfig fault_tolerance;
  LogConfig log;

  std::string source;  // the config file path
  std::string json;    // the effective configuration (file + overrides) as JSON
};

// A parsed configuration and the workload it names, its own sections already set.
struct LoadedConfig {
  TrainConfig config;
  std::unique_ptr<Workload> workload;
};

// Reads `path`, applies `overrides` ("section.key=value"), makes the workload named by
// run.workload from `registry`, and checks every key against the trainer's schema plus
// the workload's (Workload::declare_config, then validate_config).
LoadedConfig load_config(const std::string& path, const WorkloadRegistry& registry,
                         const std::vector<std::string>& overrides = {});
// Same, from TOML text (tests); `source_name` stands in for the file name in errors.
LoadedConfig parse_config(const std::string& toml_text, const std::string& source_name,
                          const WorkloadRegistry& registry,
                          const std::vector<std::string>& overrides = {});

}  // namespace lockstep::train
