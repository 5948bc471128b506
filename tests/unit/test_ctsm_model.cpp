// CTSM sees only strictly earlier events: a position's logit must not depend on its own
// outcome, on outcomes at the same timestamp, or on anything later.
#include <ctsm/model.h>

#include <gtest/gtest.h>

using namespace ctsm;

namespace {

ClientHistory history() {
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
  auto b = collate({make_train_example(c, 1000 * 86400, 64)});
  return m->forward(b)[0];
}

}  // namespace

TEST(Ctsm, OutcomesOnlyReachStrictlyLaterPositions) {
  Ctsm m = tiny();
  const auto base = logits_of(m, history());
  // Flip the outcome of event 4 (day 20): positions at day <= 20 must not change, day 40 must.
  auto h = history();
  h.events[4].type = EventType::Keep;
  const auto flipped = logits_of(m, h);
  for (int j = 0; j <= 5; ++j)
    EXPECT_EQ(base[j].item<float>(), flipped[j].item<float>()) << "position " << j;
  EXPECT_NE(base[6].item<float>(), flipped[6].item<float>());
  EXPECT_NE(base[7].item<float>(), flipped[7].item<float>());
  // Feedback (day 4) is visible to day 20 but not to the day-1 shipment.
  auto g = history();
  g.events[3].feedback = 1;
  const auto fb = logits_of(m, g);
  for (int j = 0; j <= 3; ++j) EXPECT_EQ(base[j].item<float>(), fb[j].item<float>());
  EXPECT_NE(base[4].item<float>(), fb[4].item<float>());
}

TEST(Ctsm, FirstPositionsAreFiniteViaStartToken) {
  Ctsm m = tiny();
  const auto z = logits_of(m, history());
  EXPECT_TRUE(torch::isfinite(z).all().item<bool>());
}

TEST(Ctsm, BacktestCandidatesSeeOnlyPreCutoffHistory) {
  Ctsm m = tiny();
  auto ex = make_eval_example(history(), 30 * 86400, 60 * 86400, 16, 4);
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
  auto b = collate({make_train_example(history(), 1000 * 86400, 64)});
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
  auto ex = make_train_example(history(), 1000 * 86400, 64);
  ASSERT_EQ(ex.positions.size(), 8u);
  EXPECT_FLOAT_EQ(ex.positions[0].gap_days, 0.f);
  EXPECT_FLOAT_EQ(ex.positions[4].gap_days, 19.f);
  EXPECT_FLOAT_EQ(ex.positions[6].gap_days, 20.f);
  // Backtest candidates: day 40 follows the day-20 shipment.
  auto ev = make_eval_example(history(), 30 * 86400, 60 * 86400, 16, 4);
  EXPECT_FLOAT_EQ(ev.positions[6].gap_days, 20.f);
}
