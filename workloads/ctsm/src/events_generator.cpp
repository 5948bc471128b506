#include <ctsm/events_generator.h>

#include <ctsm/events_shard_writer.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <sstream>

namespace ctsm {
namespace {

// Our own generator and distributions (not std::normal_distribution, whose output is
// implementation-defined) so the data is byte-identical across standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {  // Box-Muller; one value per call keeps the stream simple to reason about
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double exponential(double mean) { return -mean * std::log(std::max(1.0 - uniform(), 1e-300)); }
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t s_;
};

uint64_t mix(uint64_t a, uint64_t b) {
  return Rng(a * 0x2545F4914F6CDD1Dull ^ (b + 0x632BE59BD9B4E019ull)).next();
}
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

std::string EventGeneratorOptions::fingerprint() const {
  std::ostringstream os;
  os.precision(17);
  os << "v2 seed=" << seed << " clients=" << num_clients << " items=" << num_items
     << " shards=" << num_shards << " dim=" << latent_dim << " styles=" << num_styles
     << " spread=" << style_spread << " days=" << days << " per_ship=" << items_per_shipment
     << " gap=" << mean_gap_days << " halflife=" << drift_halflife_days << " affinity=" << affinity
     << " recency=" << recency << " noise=" << noise << " base=" << base_logit
     << " stylist=" << stylist_noise << " feedback=" << feedback_prob;
  return os.str();
}

EventGenerator::EventGenerator(EventGeneratorOptions options) : opt_(options) {
  LOCKSTEP_CHECK(opt_.num_items >= uint32_t(opt_.items_per_shipment),
                 "need at least items_per_shipment items");
  LOCKSTEP_CHECK(opt_.num_shards >= 1 && opt_.latent_dim >= 1 && opt_.num_styles >= 1 &&
                 opt_.days >= 1);
  const int d = opt_.latent_dim;
  Rng rng(mix(opt_.seed, 0xCA7A106ull));
  centroids_.resize(size_t(opt_.num_styles) * d);
  for (auto& x : centroids_) x = float(rng.normal());
  item_latent_.resize(size_t(opt_.num_items) * d);
  item_bias_.resize(opt_.num_items);
  const double s = opt_.style_spread, c = std::sqrt(std::max(0.0, 1 - s * s));
  for (uint32_t i = 0; i < opt_.num_items; ++i) {
    const uint64_t style = rng.below(opt_.num_styles);
    for (int k = 0; k < d; ++k)
      item_latent_[size_t(i) * d + k] = float(c * centroids_[style * d + k] + s * rng.normal());
    item_bias_[i] = float(0.5 * rng.normal());
  }
}

uint64_t EventGenerator::shard_begin(uint32_t shard) const {
  return uint64_t((unsigned __int128)opt_.num_clients * shard / opt_.num_shards);
}

ClientHistory EventGenerator::client(uint64_t client_id) const {
  const int d = opt_.latent_dim;
  const double sqrt_d = std::sqrt(double(d));
  Rng rng(mix(opt_.seed, client_id + 1));
  ClientHistory c;
  c.client_id = client_id;

  // Taste: near one style centroid, partly idiosyncratic; it drifts as an OU process.
  std::vector<double> u(d), seen(d);
  const uint64_t style = rng.below(opt_.num_styles);
  const double spread = opt_.style_spread, center = std::sqrt(std::max(0.0, 1 - spread * spread));
  for (int k = 0; k < d; ++k) u[k] = center * centroids_[style * d + k] + spread * rng.normal();
  const double propensity = 0.5 * rng.normal();

  const double t_end_days = opt_.days;
  double t = rng.uniform() * 45.0;  // first shipment in the first six weeks
  double prev = -1e9;
  std::vector<uint32_t> pool;
  std::vector<std::pair<double, uint32_t>> ranked;
  while (t < t_end_days) {
    const int64_t ship_s = int64_t(std::floor(t)) * 86400 + int64_t(8 + rng.below(10)) * 3600;
    if (ship_s >= int64_t(t_end_days * 86400)) break;
    // Stylist: ranks a random pool by a noisy view of the client's taste.
    for (int k = 0; k < d; ++k) seen[k] = u[k] + opt_.stylist_noise * rng.normal();
    ranked.clear();
    for (int j = 0; j < 6 * opt_.items_per_shipment; ++j) {
      const uint32_t item = uint32_t(rng.below(opt_.num_items));
      double s = 0;
      for (int k = 0; k < d; ++k) s += seen[k] * item_latent_[size_t(item) * d + k];
      ranked.push_back({s, item});
    }
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](auto& a, auto& b) { return a.first > b.first; });
    pool.clear();
    for (auto& [s, item] : ranked) {
      if (std::find(pool.begin(), pool.end(), item) == pool.end()) pool.push_back(item);
      if (int(pool.size()) == opt_.items_per_shipment) break;
    }
    const double gap = t - prev;
    int kept = 0;
    for (uint32_t item : pool) {
      double aff = 0;
      for (int k = 0; k < d; ++k) aff += u[k] * item_latent_[size_t(item) * d + k];
      const double logit = opt_.affinity * aff / sqrt_d + item_bias_[item] + propensity -
                           opt_.recency * std::exp(-gap / 14.0) + opt_.base_logit +
                           opt_.noise * rng.normal();
      const double p = sigmoid(logit);
      const bool keep = rng.uniform() < p;
      kept += keep;
      c.events.push_back(
          {ship_s, item + 1, keep ? EventType::Keep : EventType::Return, 0, float(p)});
    }
    if (rng.uniform() < opt_.feedback_prob) {
      const double frac = double(kept) / double(pool.size());
      const int rating = int(std::clamp(std::lround(1 + 4 * frac + 0.8 * rng.normal()), 1L, 5L));
      const int64_t fb_s = ship_s + int64_t(2 + rng.below(4)) * 86400;
      if (fb_s < int64_t(t_end_days * 86400))
        c.events.push_back({fb_s, 0, EventType::Feedback, uint8_t(rating), 0.f});
    }
    prev = t;
    const double step = 10.0 + rng.exponential(std::max(opt_.mean_gap_days - 10.0, 0.1));
    // Taste drift over `step` days: OU that reverts to the client's style (center x
    // centroid) with stationary spread `spread`, so the stationary distribution is the
    // initial one and the style stays learnable. (v1 reverted to 0 with unit variance:
    // within a half-life every client drifted to a random, style-free taste that ~60
    // noisy outcomes cannot pin down; the oracle knew it exactly.)
    const double rho = std::pow(0.5, step / opt_.drift_halflife_days);
    const double s = spread * std::sqrt(1 - rho * rho);
    for (int k = 0; k < d; ++k) {
      const double mean = center * centroids_[style * d + k];
      u[k] = mean + rho * (u[k] - mean) + s * rng.normal();
    }
    t += step;
  }
  // Feedback arrives days after its shipment and may pass the next one: keep time order.
  std::stable_sort(c.events.begin(), c.events.end(),
                   [](const Event& a, const Event& b) { return a.time_s < b.time_s; });
  return c;
}

void EventGenerator::write_shards(const std::string& dir, uint32_t offset, uint32_t stride) const {
  std::filesystem::create_directories(dir);
  for (uint32_t s = offset; s < opt_.num_shards; s += stride) {
    ShardHeader h;
    h.shard_index = s;
    h.num_shards = opt_.num_shards;
    h.num_items = opt_.num_items;
    h.t_begin_s = 0;
    h.t_end_s = t_end_s();
    EventShardWriter w(dir + "/" + shard_file_name(s, opt_.num_shards), h);
    for (uint64_t id = shard_begin(s); id < shard_begin(s + 1); ++id) w.append(client(id));
    w.finish();
  }
}

}  // namespace ctsm
