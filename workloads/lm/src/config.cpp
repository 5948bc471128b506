#include <lm/config.h>

#include <lockstep/error.h>

namespace lm {

void LmConfig::declare(lockstep::train::ConfigSchema& s) {
  s.str("data.corpus", data.corpus);
  s.i64("data.block_lines", data.block_lines, 1);
  s.f64("data.heldout_fraction", data.heldout_fraction, 1e-6, 0.5);
  s.i64("data.seed", data.seed, 0);
  s.i64("model.context", model.context, 2, 65536);
  s.i64("model.d_model", model.d_model, 1);
  s.i64("model.heads", model.heads, 1);
  s.i64("model.layers", model.layers, 0);
  s.i64("model.d_ff", model.d_ff, 1);
  s.f64("model.dropout", model.dropout, 0, 0.99);
  s.i64("eval.batch_size", eval.batch_size, 1);
  s.i64("eval.max_tokens", eval.max_tokens, 0);
  s.str("eval.sample_prompt", eval.sample_prompt);
  s.i64("eval.sample_tokens", eval.sample_tokens, 0, 100000);
  s.f64("eval.sample_temperature", eval.sample_temperature, 0, 100);
  s.i64("eval.sample_seed", eval.sample_seed, 0);
}

void LmConfig::validate(const std::string& source) const {
  using lockstep::ConfigError;
  if (model.d_model % model.heads != 0)
    throw ConfigError(source + ": model.d_model (" + std::to_string(model.d_model) +
                      ") must be divisible by model.heads (" + std::to_string(model.heads) + ")");
  if (eval.sample_tokens > 0 && eval.sample_prompt.empty())
    throw ConfigError(source +
                      ": eval.sample_prompt is empty; the sample needs at least one byte to "
                      "start from (or set eval.sample_tokens = 0)");
}

SplitOptions LmConfig::split_options() const {
  SplitOptions o;
  o.block_lines = data.block_lines;
  o.heldout_fraction = data.heldout_fraction;
  o.seed = uint64_t(data.seed);
  return o;
}

LmOptions LmConfig::model_options() const {
  LmOptions o;
  o.context = model.context;
  o.d_model = model.d_model;
  o.heads = model.heads;
  o.layers = model.layers;
  o.d_ff = model.d_ff;
  o.dropout = model.dropout;
  return o;
}

SampleOptions LmConfig::sample_options() const {
  SampleOptions o;
  o.tokens = eval.sample_tokens;
  o.temperature = eval.sample_temperature;
  o.seed = uint64_t(eval.sample_seed);
  return o;
}

}  // namespace lm
