// lm/config.h: the language-model workload's configuration (workloads/lm/README.md).
//
// [data] (the corpus and its held-out split), [model] (the transformer's size) and the
// workload's keys of [eval] (batch_size, max_tokens and the generated sample). Declared to
// the trainer's schema (lockstep/train/config_schema.h), so they are checked as strictly as
// the trainer's own sections and `--set model.layers=2` works like any override.
#pragma once

#include <lm/corpus.h>
#include <lm/generate.h>
#include <lm/model.h>

#include <lockstep/train/config_schema.h>

#include <cstdint>
#include <string>

namespace lm {

struct DataConfig {
  // A text file to train on; "" (the default): the King James Bible of Debian's
  // bible-kjv-text, printed by its reader (`bible`, package bible-kjv) one verse a line.
  std::string corpus;
  int64_t block_lines = 50;        // the split's unit: blocks of this many lines
  double heldout_fraction = 0.05;  // share of the blocks held out for evaluation
  int64_t seed = 11;  // which blocks: fixed apart from run.seed, so every run scores the same text
};

struct ModelConfig {
  int64_t context = 128;  // tokens (bytes) a position sees, itself included
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t layers = 4;
  int64_t d_ff = 512;
  double dropout = 0.0;
};

// The evaluation's keys in [eval] (the gate's eval.metric and eval.threshold are the trainer's).
struct LmEvalConfig {
  int64_t batch_size = 32;  // held-out windows per forward
  int64_t max_tokens = 0;   // score at most this many held-out tokens (0: all of them)
  std::string sample_prompt = "And God said";
  int64_t sample_tokens = 200;      // bytes generated after the prompt for the report (0: none)
  double sample_temperature = 0.8;  // 0: greedy
  int64_t sample_seed = 1;
};

struct LmConfig {
  DataConfig data;
  ModelConfig model;
  LmEvalConfig eval;

  // Binds every key to its field.
  void declare(lockstep::train::ConfigSchema& schema);
  // Checks across keys; throws lockstep::ConfigError starting with `source`.
  void validate(const std::string& source) const;

  SplitOptions split_options() const;
  LmOptions model_options() const;
  SampleOptions sample_options() const;
};

}  // namespace lm
