// ctsm/events_generator.h: a synthetic, realistic client event log with known
// achievable quality (workloads/ctsm/event-format.md, "The generator").
//
// The world: items have latent style vectors clustered around a few style centroids plus
// a popularity bias; each client has a latent style preference that drifts over time (an
// Ornstein-Uhlenbeck process around its style centroid with a configurable half-life) and a
// keep propensity. Every
// few weeks a stylist, who knows the client's taste only noisily, picks a shipment of
// several items; the client keeps each with probability
//   sigmoid(affinity * <u_client(t), v_item>/sqrt(d) + bias_item + propensity_client
//           - recency * exp(-days_since_previous_shipment / 14) + base + noise),
// and often rates the shipment a few days later (1..5, driven by the fraction kept).
// The kept/returned outcome is therefore learnable from the client's earlier outcomes, and
// the true probability is stored with each event, so the best achievable AUC is known.
//
// Deterministic from the seed: each client draws from its own counter-based stream
// (seed, client id), so any shard can be generated alone, by any rank, in any order,
// with identical bytes. Memory: the item catalog plus one client at a time.
#pragma once

#include <ctsm/events_format.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ctsm {

struct EventGeneratorOptions {
  uint64_t seed = 1;
  uint64_t num_clients = 4000;
  uint32_t num_items = 1000;
  uint32_t num_shards = 4;
  int latent_dim = 8;
  int num_styles = 12;  // style centroids items and clients cluster around
  // Spread around the centroid: latent = sqrt(1 - s^2) centroid + s N(0,I). Small s: tight
  // styles (taste is mostly "which style", easy to learn); 1: no style structure at all.
  double style_spread = 0.6;
  int days = 365;  // time span: events lie in [0, days) days
  int items_per_shipment = 5;
  double mean_gap_days = 24;         // mean time between shipments (10 days minimum)
  double drift_halflife_days = 150;  // how fast a client's taste forgets its past
  double affinity = 2.5;             // weight of the client-item style match in the keep logit
  double recency = 0.8;              // penalty for a shipment soon after the previous one
  double noise = 0.6;                // std of the per-item unobservable logit noise
  double base_logit = -0.3;          // shifts the overall keep rate
  double stylist_noise =
      1.5;  // how poorly the stylist knows the client (higher: more random picks)
  double feedback_prob = 0.7;  // chance a shipment gets a rating

  // One line that identifies the generated data (to reuse existing shards safely).
  std::string fingerprint() const;
};

class EventGenerator {
 public:
  explicit EventGenerator(EventGeneratorOptions options);

  const EventGeneratorOptions& options() const { return opt_; }
  int64_t t_end_s() const { return int64_t(opt_.days) * 86400; }

  // The full history of one client (ids 0..num_clients-1). Pure: same id, same bytes.
  ClientHistory client(uint64_t client_id) const;

  // Clients of shard s: [s*N/S, (s+1)*N/S).
  uint64_t shard_begin(uint32_t shard) const;
  // Writes shard files s with s % stride == offset into `dir` (created if missing),
  // atomically each. (offset, stride) = (rank, world size) splits the work across ranks.
  void write_shards(const std::string& dir, uint32_t offset = 0, uint32_t stride = 1) const;

 private:
  EventGeneratorOptions opt_;
  std::vector<float> item_latent_;  // num_items x latent_dim (index 0 = item id 1)
  std::vector<float> item_bias_;
  std::vector<float> centroids_;  // num_styles x latent_dim
};

}  // namespace ctsm
