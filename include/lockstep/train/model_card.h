// lockstep/train/model_card.h: the model card a workload's export writes beside its weights
// (model_card.json: what was trained, on what, how well, from which revision).
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::train {

// What every workload's card holds besides its model's own description.
struct ModelCard {
  std::string run_name;
  std::string config_json;   // the effective configuration
  std::string metrics_json;  // the workload's evaluation metrics
  std::string data_json;     // the data it was trained on (fingerprint, split, ranges)
  std::string gate_json;     // metric, threshold, value, passed
  int64_t steps = 0;
  int world_size = 1;
};

// Writes `dir`/model_card.json atomically: {"format", "version": 1, "run", "model" (the
// workload's JSON object `model_json`), `extra_json`'s members (a JSON object, "{}" for
// none), "metrics", "gate", "data", "config", "training", "git_revision" (null when
// unknown), "created_at"}. Returns its path.
std::string write_model_card(const std::string& dir, const std::string& format,
                             const std::string& model_json, const ModelCard& card,
                             const std::string& extra_json = "{}");

// `git rev-parse HEAD` in the current directory (40 hex digits), or "" when unavailable.
std::string git_revision();
// The current time in UTC as "YYYY-MM-DDTHH:MM:SSZ".
std::string utc_timestamp();

}  // namespace lockstep::train
