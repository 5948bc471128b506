// ctsm/model_export.h: the published artifact of a run that passed its gate.
//
// <dir>/ctsm.pt is torch::save of the CTSM module (load it with torch::load into a Ctsm
// built from the card's "model" options); <dir>/model_card.json records what it is and
// how good: metrics on the backtest period, the threshold it cleared, the configuration,
// the data's time ranges, the git revision, the parameter count. Both written atomically.
#pragma once

#include <ctsm/model.h>

#include <string>

namespace ctsm {

struct ModelCard {
  std::string run_name;
  std::string config_json;   // the effective configuration
  std::string metrics_json;  // backtest metrics
  std::string data_json;     // data set fingerprint and time ranges
  std::string gate_json;     // metric, threshold, value
  int64_t steps = 0;
  int world_size = 1;
};

// Writes ctsm.pt and model_card.json into `dir`; returns the card's path.
std::string export_model(Ctsm& model, const ModelCard& card, const std::string& dir);
// Loads an exported model: reads the card's model options, builds a Ctsm, loads weights.
Ctsm load_exported_model(const std::string& dir);

}  // namespace ctsm
