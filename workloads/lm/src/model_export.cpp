#include <lm/model_export.h>

#include <lockstep/train/atomic_file.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

namespace lm {

std::string export_model(Lm& model, const ModelCard& card, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ostringstream weights;
  torch::save(model, weights);
  lockstep::train::write_file_atomic(dir + "/lm.pt", weights.str());
  const LmOptions& o = model->options();
  const nlohmann::json m = {{"type", "decoder-only transformer, byte-level, tied embeddings"},
                            {"vocab", o.vocab},
                            {"context", o.context},
                            {"d_model", o.d_model},
                            {"heads", o.heads},
                            {"layers", o.layers},
                            {"d_ff", o.d_ff},
                            {"dropout", o.dropout},
                            {"parameters", count_parameters(*model)},
                            {"weights", "lm.pt"}};
  const nlohmann::json tokenizer = {{"tokenizer", {{"type", "bytes"}, {"vocab", 256}}}};
  return lockstep::train::write_model_card(dir, "lockstep-lm-model-card", m.dump(), card,
                                           tokenizer.dump());
}

Lm load_exported_model(const std::string& dir) {
  const auto j = nlohmann::json::parse(lockstep::train::read_file(dir + "/model_card.json"));
  const auto& m = j.at("model");
  LmOptions o;
  o.vocab = m.at("vocab");
  o.context = m.at("context");
  o.d_model = m.at("d_model");
  o.heads = m.at("heads");
  o.layers = m.at("layers");
  o.d_ff = m.at("d_ff");
  o.dropout = m.at("dropout");
  Lm model(o);
  torch::load(model, dir + "/" + m.at("weights").get<std::string>());
  model->eval();
  return model;
}

}  // namespace lm
