#include <ctsm/model_export.h>

#include <lockstep/train/atomic_file.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

namespace ctsm {

std::string export_model(Ctsm& model, const ModelCard& card, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ostringstream weights;
  torch::save(model, weights);
  lockstep::train::write_file_atomic(dir + "/ctsm.pt", weights.str());
  const auto& o = model->options();
  const nlohmann::json m = {{"type", "ctsm"},       {"num_items", o.num_items},
                            {"d_model", o.d_model}, {"heads", o.heads},
                            {"layers", o.layers},   {"d_ff", o.d_ff},
                            {"dropout", o.dropout}, {"parameters", count_parameters(*model)},
                            {"weights", "ctsm.pt"}};
  return lockstep::train::write_model_card(dir, "lockstep-ctsm-model-card", m.dump(), card);
}

Ctsm load_exported_model(const std::string& dir) {
  const auto j = nlohmann::json::parse(lockstep::train::read_file(dir + "/model_card.json"));
  const auto& m = j.at("model");
  CtsmOptions o;
  o.num_items = m.at("num_items");
  o.d_model = m.at("d_model");
  o.heads = m.at("heads");
  o.layers = m.at("layers");
  o.d_ff = m.at("d_ff");
  o.dropout = m.at("dropout");
  Ctsm model(o);
  torch::load(model, dir + "/" + m.at("weights").get<std::string>());
  model->eval();
  return model;
}

}  // namespace ctsm
