// ctsm/config.h: the CTSM workload's configuration sections (workloads/ctsm/README.md).
//
// [data] (the event log: where, how it is generated, the train/backtest split), [model]
// (the CTSM's size) and the workload's keys of [eval] (k, bins, batch_size). Declared to
// the trainer's schema (lockstep/train/config_schema.h), so they are checked as strictly
// as the trainer's own sections and `--set data.items=500` works like any override.
#pragma once

#include <ctsm/events_generator.h>
#include <ctsm/model.h>

#include <lockstep/train/config_schema.h>

#include <cstdint>
#include <string>

namespace ctsm {

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
  int64_t cutoff_day = 300;  // train on events before, evaluate on [cutoff, cutoff + horizon)
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

// The backtest's keys in [eval] (the gate's eval.metric and eval.threshold are the trainer's).
struct BacktestConfig {
  int64_t k = 5;        // recall@k
  int64_t bins = 4096;  // histogram AUC resolution
  int64_t batch_size = 256;
};

struct CtsmConfig {
  DataConfig data;
  ModelConfig model;
  BacktestConfig eval;

  // Binds every key to its field.
  void declare(lockstep::train::ConfigSchema& schema);
  // Checks across keys; throws lockstep::ConfigError starting with `source`.
  void validate(const std::string& source) const;

  EventGeneratorOptions generator_options() const;
  CtsmOptions model_options() const;
};

}  // namespace ctsm
