#include <ctsm/model_export.h>

#include <lockstep/train/atomic_file.h>
#include <lockstep/train/provenance.h>

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
  nlohmann::json j;
  j["format"] = "lockstep-ctsm-model-card";
  j["version"] = 1;
  j["run"] = card.run_name;
  j["model"] = {{"type", "ctsm"},       {"num_items", o.num_items},
                {"d_model", o.d_model}, {"heads", o.heads},
                {"layers", o.layers},   {"d_ff", o.d_ff},
                {"dropout", o.dropout}, {"parameters", count_parameters(*model)},
                {"weights", "ctsm.pt"}};
  j["metrics"] = nlohmann::json::parse(card.metrics_json);
  j["gate"] = nlohmann::json::parse(card.gate_json);
  j["data"] = nlohmann::json::parse(card.data_json);
  j["config"] = nlohmann::json::parse(card.config_json);
  j["training"] = {{"steps", card.steps}, {"world_size", card.world_size}};
  const std::string rev = lockstep::train::git_revision();
  j["git_revision"] = rev.empty() ? nlohmann::json(nullptr) : nlohmann::json(rev);
  j["created_at"] = lockstep::train::utc_timestamp();
  const std::string path = dir + "/model_card.json";
  lockstep::train::write_file_atomic(path, j.dump(2) + "\n");
  return path;
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
