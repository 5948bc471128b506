// CTSM sees only strictly earlier events: a position's logit must not depend on its own
// outcome, on outcomes at the same timestamp, or on anything later.
#include <ctsm/model.h>

#include <lockstep/parallel/fsdp/wrap.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

using namespace ctsm;

namespace {

ClientHistory model_history() {
  ClientHistory c;
  auto ev = [](int64_t day, uint32_t item, EventType t, uint8_t fb = 0) {
    return Event{day * 86400, item, t, fb, 0.5f};
  };
  using T = EventType;
  c.events = {ev(1, 3, T::Keep),        ev(1, 4, T::Return),  ev(1, 5, T::Keep),
              ev(4, 0, T::Feedback, 4), ev(20, 6, T::Return), ev(20, 7, T::Keep),
              ev(40, 8, T::Keep),       ev(40, 9, T::Return)};
  return c;
}

Ctsm tiny() {
  torch::manual_seed(0);
  CtsmOptions o;
  o.num_items = 20;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 2;
  o.d_ff = 32;
  Ctsm m(o);
  m->eval();
  return m;
}

torch::Tensor logits_of(Ctsm& m, const ClientHistory& c) {
  torch::NoGradGuard ng;
  auto b = collate({make_train_example(c, int64_t{1000} * 86400, 64)});
  return m->forward(b)[0];
}

TEST(Ctsm, OutcomesOnlyReachStrictlyLaterPositions) {
  Ctsm m = tiny();
  const auto base = logits_of(m, model_history());
  // Flip the outcome of event 4 (day 20): positions at day <= 20 must not change, day 40 must.
  auto h = model_history();
  h.events[4].type = EventType::Keep;
  const auto flipped = logits_of(m, h);
  for (int j = 0; j <= 5; ++j)
    EXPECT_EQ(base[j].item<float>(), flipped[j].item<float>()) << "position " << j;
  EXPECT_NE(base[6].item<float>(), flipped[6].item<float>());
  EXPECT_NE(base[7].item<float>(), flipped[7].item<float>());
  // Feedback (day 4) is visible to day 20 but not to the day-1 shipment.
  auto g = model_history();
  g.events[3].feedback = 1;
  const auto fb = logits_of(m, g);
  for (int j = 0; j <= 3; ++j) EXPECT_EQ(base[j].item<float>(), fb[j].item<float>());
  EXPECT_NE(base[4].item<float>(), fb[4].item<float>());
}

TEST(Ctsm, FirstPositionsAreFiniteViaStartToken) {
  Ctsm m = tiny();
  const auto z = logits_of(m, model_history());
  EXPECT_TRUE(torch::isfinite(z).all().item<bool>());
}

TEST(Ctsm, BacktestCandidatesSeeOnlyPreCutoffHistory) {
  Ctsm m = tiny();
  auto ex = make_eval_example(model_history(), int64_t{30} * 86400, int64_t{60} * 86400, 16, 4);
  ASSERT_EQ(ex.positions.size(), 8u);  // 6 history + 2 candidates
  EXPECT_FALSE(ex.positions[6].is_key);
  EXPECT_TRUE(ex.positions[6].is_target);
  torch::NoGradGuard ng;
  auto b = collate({ex});
  const auto z1 = m->forward(b);
  // A candidate's hidden outcome cannot matter: it is not context and its type is hidden.
  ex.positions[6].type = uint8_t(EventType::Return);
  const auto z2 = m->forward(collate({ex}));
  EXPECT_TRUE(torch::equal(z1, z2));
  EXPECT_EQ(b.type[0][6].item<int64_t>(), 0);
}

TEST(Ctsm, LossIsFiniteAndGradientsFlow) {
  Ctsm m = tiny();
  m->train();
  auto b = collate({make_train_example(model_history(), int64_t{1000} * 86400, 64)});
  auto loss = CtsmImpl::loss(m->forward(b), b);
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<float>()));
  int64_t with_grad = 0;
  for (auto& p : m->parameters())
    with_grad += p.grad().defined() && p.grad().abs().sum().item<float>() > 0;
  EXPECT_GT(with_grad, 10);
}

TEST(Ctsm, GapIsMeasuredToThePreviousShipment) {
  // Day 20's items follow the day-1 shipment (19 days), not the day-4 rating (16 days).
  auto ex = make_train_example(model_history(), int64_t{1000} * 86400, 64);
  ASSERT_EQ(ex.positions.size(), 8u);
  EXPECT_FLOAT_EQ(ex.positions[0].gap_days, 0.f);
  EXPECT_FLOAT_EQ(ex.positions[4].gap_days, 19.f);
  EXPECT_FLOAT_EQ(ex.positions[6].gap_days, 20.f);
  // Backtest candidates: day 40 follows the day-20 shipment.
  auto ev = make_eval_example(model_history(), int64_t{30} * 86400, int64_t{60} * 86400, 16, 4);
  EXPECT_FLOAT_EQ(ev.positions[6].gap_days, 20.f);
}

// Each encoder layer is an fsdp::wrap() unit, transparent to names and checkpoints: the
// parameters are named as a plain layer's, and a plain layer's archive loads into the
// wrapped one (and back), so checkpoints and exports from before the wrapper keep working.
TEST(Ctsm, LayersAreFsdpUnitsUnderTheirOwnNames) {
  Ctsm m = tiny();
  const auto names = m->named_parameters().keys();
  CtsmLayer plain(CtsmLayerOptions{16, 2, 32, 0.0, {}});
  for (const auto& n : plain->named_parameters().keys())
    for (const char* layer : {"layers.0.", "layers.1."})
      EXPECT_NE(std::find(names.begin(), names.end(), layer + n), names.end()) << layer + n;
  int wrappers = 0;
  for (const auto& item : m->named_modules())
    if (dynamic_cast<lockstep::fsdp::WrapBase*>(item.value().get())) {
      EXPECT_TRUE(item.key() == "layers.0" || item.key() == "layers.1") << item.key();
      ++wrappers;
    }
  EXPECT_EQ(wrappers, 2);

  auto roundtrip = [](torch::nn::ModuleList from, torch::nn::ModuleList to) {
    std::stringstream bytes;
    torch::save(from, bytes);
    torch::load(to, bytes);
    const auto a = from->parameters(), b = to->parameters();
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i]));
  };
  const CtsmLayerOptions o{16, 2, 32, 0.0, {}};
  torch::manual_seed(1);
  torch::nn::ModuleList unwrapped{CtsmLayer(o)};
  torch::manual_seed(2);
  torch::nn::ModuleList wrapped{lockstep::fsdp::wrap(CtsmLayer(o))};
  roundtrip(unwrapped, wrapped);
  torch::manual_seed(3);
  roundtrip(torch::nn::ModuleList(lockstep::fsdp::wrap(CtsmLayer(o))), unwrapped);
}

}  // namespace
