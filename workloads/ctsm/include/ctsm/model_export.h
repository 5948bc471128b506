// ctsm/model_export.h: the published artifact of a run that passed its gate.
//
// <dir>/ctsm.pt is torch::save of the CTSM module (load it with torch::load into a Ctsm
// built from the card's "model" options); <dir>/model_card.json records what it is and
// how good: metrics on the backtest period, the threshold it cleared, the configuration,
// the data's time ranges, the git revision, the parameter count. Both written atomically.
#pragma once

#include <lockstep/train/model_card.h>

#include <ctsm/model.h>

#include <string>

namespace ctsm {

using ModelCard = lockstep::train::ModelCard;  // lockstep/train/model_card.h

// Writes ctsm.pt and model_card.json into `dir`; returns the card's path.
std::string export_model(Ctsm& model, const ModelCard& card, const std::string& dir);
// Loads an exported model: reads the card's model options, builds a Ctsm, loads weights.
Ctsm load_exported_model(const std::string& dir);

}  // namespace ctsm
