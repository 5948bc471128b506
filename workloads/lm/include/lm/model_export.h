// lm/model_export.h: the published artifact of a run that passed its gate.
//
// <dir>/lm.pt is torch::save of the Lm module (load it with load_exported_model, or with
// torch::load into an Lm built from the card's "model" options); <dir>/model_card.json
// records what it is and how good: held-out perplexity and the threshold it cleared, the
// corpus and its split, the configuration, a generated sample, the git revision, the
// parameter count. Both written atomically.
#pragma once

#include <lockstep/train/model_card.h>

#include <lm/model.h>

#include <string>

namespace lm {

using ModelCard = lockstep::train::ModelCard;  // lockstep/train/model_card.h

// Writes lm.pt and model_card.json into `dir`; returns the card's path.
std::string export_model(Lm& model, const ModelCard& card, const std::string& dir);
// Loads an exported model: reads the card's model options, builds an Lm, loads the weights;
// the model comes back in eval mode.
Lm load_exported_model(const std::string& dir);

}  // namespace lm
