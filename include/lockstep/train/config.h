// lockstep/train/config.h: the trainer's TOML configuration (docs/trainer.md).
//
// The schema is strict: an unknown key, a value of the wrong type or out of range is a
// ConfigError whose message starts with "FILE:LINE:COLUMN:" and names the key, so a typo
// never silently falls back to a default. `--set key=value` overrides are parsed as
// TOML values (bare words become strings) and checked by the same schema; their errors
// name the override instead of a file line.
#pragma once

#include <lockstep/error.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::train {

struct RunConfig {
  std::string name = "ctsm";
  std::string out_dir = "out/ctsm";
  int64_t seed = 1;
};

struct DataConfig {
  std::string dir = "out/data/ctsm";  // shard directory; generated when missing or stale
  bool generate = true;
  int64_t seed = 7;
  int64_t clients = 4000;
  int64_t items = 1000;
  int64_t shards = 4;
  int64_t days = 365;
  int64_t latent_dim = 8;
  int64_t styles = 12;
  double style_spread = 0.6;
  int64_t items_per_shipment = 5;
  double mean_gap_days = 24;
  double drift_halflife_days = 150;
  double affinity = 2.5;
  double recency = 0.8;
  double noise = 0.6;
  double base_logit = -0.3;
  double stylist_noise = 1.5;
  double feedback_prob = 0.7;
  int64_t cutoff_day = 300;     // train on events before, evaluate on [cutoff, cutoff + horizon)
  int64_t horizon_days = 65;
  int64_t max_len = 64;         // events per training sequence (the most recent)
  int64_t max_candidates = 16;  // backtest items scored per client
  int64_t shuffle_buffer = 2048;
};

struct ModelConfig {
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t d_ff = 256;
  double dropout = 0.0;
};

struct OptimConfig {
  std::string name = "adamw";  // "sgd" | "adamw"
  double lr = 1e-3;
  double weight_decay = 0.01;
  double momentum = 0.9;       // sgd
  double beta1 = 0.9;          // adamw
  double beta2 = 0.999;
  double grad_clip = 1.0;      // max global L2 norm; 0 = off
  // How lr follows the global batch when it differs from the reference one
  // (train.keep_global_batch = false and a different world size): "linear", "sqrt", "none".
  std::string lr_scaling = "linear";
};

struct ScheduleConfig {
  int64_t warmup_steps = 50;
  double min_lr_ratio = 0.1;   // cosine decays to lr * min_lr_ratio at the last step
};

struct TrainLoopConfig {
  int64_t epochs = 3;
  int64_t batch_size = 64;     // per rank, per micro-step
  int64_t grad_accum = 1;      // micro-steps per optimizer step
  int64_t reference_world_size = 1;  // world size the batch/lr settings were tuned for
  bool keep_global_batch = false;    // recompute grad_accum so the global batch stays fixed
  int64_t max_steps = 0;       // 0 = epochs * steps_per_epoch
  int64_t stop_after_steps = 0;  // stop (as if interrupted) after this step; 0 = never
  int64_t threads = 1;         // intra-op threads per rank
};

struct StrategyConfig {
  std::string kind = "ddp";       // "single" | "ddp"
  std::string comm_hook = "none";  // "none" | "bf16" | "qsgd"
  int64_t qsgd_bits = 4;
  int64_t qsgd_bucket_size = 128;
  std::string backend = "auto";    // process group backend
};

struct EvalConfig {
  std::string metric = "auc";  // the gated metric: "auc" | "recall_at_k"
  double threshold = 0.7;
  int64_t k = 5;
  int64_t bins = 4096;         // histogram AUC resolution
  int64_t batch_size = 256;
};

struct CheckpointConfig {
  int64_t every_steps = 100;  // 0 = only at the end
  int64_t keep = 2;
  std::string dir;            // default: <run.out_dir>/checkpoints
};

struct LogConfig {
  int64_t every_steps = 10;
  bool progress = true;
  bool tensorboard = true;
  bool plot = true;
};

struct TrainConfig {
  RunConfig run;
  DataConfig data;
  ModelConfig model;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainLoopConfig train;
  StrategyConfig strategy;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  LogConfig log;

  std::string source;  // the config file path
  std::string json;    // the effective configuration (file + overrides) as JSON
};

// Parses and validates `path`, then applies `overrides` ("section.key=value").
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from TOML text (tests); `source_name` stands in for the file name in errors.
TrainConfig parse_config(const std::string& toml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides = {});

}  // namespace lockstep::train
