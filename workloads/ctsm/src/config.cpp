#include <ctsm/config.h>

namespace ctsm {

void CtsmConfig::declare(lockstep::train::ConfigSchema& s) {
  auto& d = data;
  s.str("data.dir", d.dir);
  s.boolean("data.generate", d.generate);
  s.i64("data.seed", d.seed, 0);
  s.i64("data.clients", d.clients, 1);
  s.i64("data.items", d.items, 1);
  s.i64("data.shards", d.shards, 1);
  s.i64("data.days", d.days, 1);
  s.i64("data.latent_dim", d.latent_dim, 1);
  s.i64("data.styles", d.styles, 1);
  s.f64("data.style_spread", d.style_spread, 0, 1);
  s.i64("data.items_per_shipment", d.items_per_shipment, 1);
  s.f64("data.mean_gap_days", d.mean_gap_days, 10);
  s.f64("data.drift_halflife_days", d.drift_halflife_days, 1e-3);
  s.f64("data.affinity", d.affinity, 0);
  s.f64("data.recency", d.recency, 0);
  s.f64("data.noise", d.noise, 0);
  s.f64("data.base_logit", d.base_logit, -100);
  s.f64("data.stylist_noise", d.stylist_noise, 0);
  s.f64("data.feedback_prob", d.feedback_prob, 0, 1);
  s.i64("data.cutoff_day", d.cutoff_day, 1);
  s.i64("data.horizon_days", d.horizon_days, 1);
  s.i64("data.max_len", d.max_len, 2);
  s.i64("data.max_candidates", d.max_candidates, 1);
  s.i64("data.shuffle_buffer", d.shuffle_buffer, 1);
  s.i64("model.d_model", model.d_model, 1);
  s.i64("model.heads", model.heads, 1);
  s.i64("model.layers", model.layers, 0);
  s.i64("model.d_ff", model.d_ff, 1);
  s.f64("model.dropout", model.dropout, 0, 0.99);
  s.i64("eval.k", eval.k, 1);
  s.i64("eval.bins", eval.bins, 2);
  s.i64("eval.batch_size", eval.batch_size, 1);
}

void CtsmConfig::validate(const std::string& source) const {
  using lockstep::ConfigError;
  if (model.d_model % model.heads != 0)
    throw ConfigError(source + ": model.d_model (" + std::to_string(model.d_model) +
                      ") must be divisible by model.heads (" + std::to_string(model.heads) + ")");
  if (data.cutoff_day >= data.days)
    throw ConfigError(source + ": data.cutoff_day (" + std::to_string(data.cutoff_day) +
                      ") must be before data.days (" + std::to_string(data.days) + ")");
  if (data.max_candidates >= data.max_len)
    throw ConfigError(source + ": data.max_candidates must be smaller than data.max_len");
}

EventGeneratorOptions CtsmConfig::generator_options() const {
  const DataConfig& d = data;
  EventGeneratorOptions g;
  g.seed = uint64_t(d.seed);
  g.num_clients = uint64_t(d.clients);
  g.num_items = uint32_t(d.items);
  g.num_shards = uint32_t(d.shards);
  g.days = int(d.days);
  g.latent_dim = int(d.latent_dim);
  g.num_styles = int(d.styles);
  g.style_spread = d.style_spread;
  g.items_per_shipment = int(d.items_per_shipment);
  g.mean_gap_days = d.mean_gap_days;
  g.drift_halflife_days = d.drift_halflife_days;
  g.affinity = d.affinity;
  g.recency = d.recency;
  g.noise = d.noise;
  g.base_logit = d.base_logit;
  g.stylist_noise = d.stylist_noise;
  g.feedback_prob = d.feedback_prob;
  return g;
}

CtsmOptions CtsmConfig::model_options() const {
  CtsmOptions mo;
  mo.num_items = data.items;
  mo.d_model = model.d_model;
  mo.heads = model.heads;
  mo.layers = model.layers;
  mo.d_ff = model.d_ff;
  mo.dropout = model.dropout;
  return mo;
}

}  // namespace ctsm
