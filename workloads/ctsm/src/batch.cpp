#include <ctsm/batch.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace ctsm {
namespace {

CtsmPosition position_of(const Event& e, int64_t last_key_before_s, bool is_key, bool is_target) {
  CtsmPosition p;
  p.time_s = e.time_s;
  p.item = e.item_id;
  p.type = is_key ? uint8_t(e.type) : 0;
  p.feedback = is_key ? e.feedback : 0;
  p.is_key = is_key;
  p.is_target = is_target;
  p.gap_days = last_key_before_s < 0 ? 0.f : float(double(e.time_s - last_key_before_s) / 86400.0);
  p.p_true = e.p_true;
  return p;
}

bool is_item(const Event& e) { return e.type == EventType::Keep || e.type == EventType::Return; }

}  // namespace

CtsmExample make_train_example(const ClientHistory& c, int64_t cutoff_s, int max_len) {
  CtsmExample ex;
  ex.client_id = c.client_id;
  // Gap features use the full history, then keep the last max_len. The gap is measured
  // to the previous *shipment* (item events at an earlier time): that is the generator's
  // recency driver. Measuring it to any earlier event made a rating that arrived 2-5 days
  // after the previous shipment look like a shipment, scrambling the recency signal.
  int64_t last_ship = -1, prev_ship = -1;
  for (const Event& e : c.events) {
    if (e.time_s >= cutoff_s) break;
    if (is_item(e) && e.time_s != last_ship) {
      prev_ship = last_ship;
      last_ship = e.time_s;
    }
    ex.positions.push_back(position_of(e, is_item(e) ? prev_ship : last_ship, true, is_item(e)));
  }
  if (int(ex.positions.size()) > max_len)
    ex.positions.erase(ex.positions.begin(), ex.positions.end() - max_len);
  return ex;
}

CtsmExample make_eval_example(const ClientHistory& c, int64_t cutoff_s, int64_t horizon_end_s,
                              int max_len, int max_candidates) {
  CtsmExample ex = make_train_example(c, cutoff_s, std::max(max_len - max_candidates, 1));
  for (auto& p : ex.positions) p.is_target = false;  // history only: its outcomes are known
  // Candidates' gap: to the previous shipment, which may itself be a candidate (when a
  // shipment goes out is known without its outcome), as in training.
  int64_t last_ship = -1, prev_ship = -1;
  int n = 0;
  for (const Event& e : c.events) {
    if (!is_item(e)) continue;
    if (e.time_s != last_ship) {
      prev_ship = last_ship;
      last_ship = e.time_s;
    }
    if (e.time_s < cutoff_s) continue;
    if (e.time_s >= horizon_end_s || n == max_candidates) break;
    CtsmPosition p = position_of(e, prev_ship, false, true);
    p.type = uint8_t(e.type);  // kept only for the label; collate hides non-key types
    ex.positions.push_back(p);
    ++n;
  }
  return ex;
}

CtsmBatch collate(const std::vector<CtsmExample>& examples) {
  const int64_t B = int64_t(examples.size());
  int64_t L = 1;
  for (const auto& e : examples) L = std::max<int64_t>(L, int64_t(e.positions.size()));
  auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  CtsmBatch b;
  b.item = torch::zeros({B, L}, i64);
  b.type = torch::zeros({B, L}, i64);
  b.feedback = torch::zeros({B, L}, i64);
  b.time_feat = torch::zeros({B, L, kCtsmTimeFeatures}, f32);
  b.time_s = torch::full({B, L}, kCtsmPadTime, i64);
  b.is_key = torch::zeros({B, L}, torch::kBool);
  b.is_target = torch::zeros({B, L}, torch::kBool);
  b.label = torch::zeros({B, L}, f32);
  b.p_true = torch::zeros({B, L}, f32);
  auto item = b.item.accessor<int64_t, 2>();
  auto type = b.type.accessor<int64_t, 2>();
  auto fb = b.feedback.accessor<int64_t, 2>();
  auto tf = b.time_feat.accessor<float, 3>();
  auto td = b.time_s.accessor<int64_t, 2>();
  auto key = b.is_key.accessor<bool, 2>();
  auto tgt = b.is_target.accessor<bool, 2>();
  auto lab = b.label.accessor<float, 2>();
  auto pt = b.p_true.accessor<float, 2>();
  for (int64_t i = 0; i < B; ++i) {
    const auto& ps = examples[i].positions;
    for (int64_t j = 0; j < int64_t(ps.size()); ++j) {
      const CtsmPosition& p = ps[j];
      item[i][j] = p.item;
      type[i][j] = p.is_key ? p.type : 0;
      fb[i][j] = p.is_key ? p.feedback : 0;
      tf[i][j][0] = std::log1p(std::min(p.gap_days, 365.f));
      tf[i][j][1] = p.item == 0 ? 1.f : 0.f;  // feedback events carry no item
      td[i][j] = p.time_s;
      key[i][j] = p.is_key;
      tgt[i][j] = p.is_target;
      lab[i][j] = p.type == uint8_t(EventType::Keep) ? 1.f : 0.f;
      pt[i][j] = p.p_true;
    }
  }
  return b;
}

}  // namespace ctsm
