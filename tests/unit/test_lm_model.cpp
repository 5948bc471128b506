// The language model: causal (a later byte changes no earlier logit), one tied matrix for
// the input embedding and the output projection, blocks as FSDP units with stable names,
// activation checkpointing bit-identical to the plain model, and deterministic generation.
#include <lm/generate.h>
#include <lm/heldout.h>
#include <lm/model.h>
#include <lm/model_export.h>

#include <lockstep/parallel/fsdp/wrap.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

using namespace lm;

namespace {

LmOptions tiny_options() {
  LmOptions o;
  o.context = 16;
  o.d_model = 32;
  o.heads = 4;
  o.layers = 2;
  o.d_ff = 64;
  return o;
}

Lm tiny(LmOptions o = tiny_options()) {
  torch::manual_seed(0);
  Lm m(o);
  m->eval();
  return m;
}

torch::Tensor some_tokens(int64_t B, int64_t T) {
  torch::manual_seed(42);
  return torch::randint(0, 256, {B, T}, torch::kInt64);
}

}  // namespace

TEST(LmModel, LaterTokensDoNotChangeEarlierLogits) {
  Lm m = tiny();
  torch::NoGradGuard ng;
  const auto x = some_tokens(2, 16);
  const auto base = m->forward(x);
  ASSERT_EQ(base.sizes(), (std::vector<int64_t>{2, 16, 256}));
  for (int64_t t : {0, 5, 15}) {
    auto y = x.clone();
    y[0][t] = (y[0][t] + 1) % 256;
    const auto z = m->forward(y);
    // Exactly equal before t: masked keys get weight exactly 0, so no rounding leaks through.
    EXPECT_TRUE(torch::equal(z[0].slice(0, 0, t), base[0].slice(0, 0, t))) << "t = " << t;
    EXPECT_FALSE(torch::equal(z[0][t], base[0][t])) << "position " << t << " ignores its input";
    EXPECT_TRUE(torch::equal(z[1], base[1])) << "another sequence changed";
  }
  // A prefix gives the same logits as the full sequence's first positions (to rounding:
  // the matmuls differ in shape).
  const auto prefix = m->forward(x.slice(1, 0, 7));
  EXPECT_LT((prefix - base.slice(1, 0, 7)).abs().max().item<double>(), 1e-5);
}

TEST(LmModel, OutputProjectionIsTheEmbedding) {
  Lm m = tiny();
  const LmOptions o = m->options();
  const auto named = m->named_parameters();
  ASSERT_TRUE(named.contains("tok_emb.weight"));
  EXPECT_EQ(named["tok_emb.weight"].data_ptr(), m->embedding_weight().data_ptr());
  // No second [vocab, d_model] matrix anywhere.
  for (const auto& p : named) {
    if (p.key() == "tok_emb.weight") continue;
    EXPECT_NE(p.value().sizes(), (std::vector<int64_t>{o.vocab, o.d_model})) << p.key();
  }
  const int64_t D = o.d_model, F = o.d_ff;
  const int64_t per_block = 4 * D + (3 * D * D + 3 * D) + (D * D + D) + (D * F + F) + (F * D + D);
  EXPECT_EQ(count_parameters(*m), o.vocab * D + o.context * D + o.layers * per_block + 2 * D);
  // The output side trains the matrix too: a byte absent from the input still gets a gradient
  // (through the logits), which an untied embedding row would not.
  m->train();
  const auto x = torch::full({1, 8}, 65, torch::kInt64);
  LmImpl::loss(m->forward(x), torch::full({1, 8}, 66, torch::kInt64)).backward();
  const auto g = m->embedding_weight().grad();
  EXPECT_GT(g[66].abs().sum().item<double>(), 0);   // a target, never an input
  EXPECT_GT(g[200].abs().sum().item<double>(), 0);  // neither: only the softmax reaches it
}

TEST(LmModel, BlocksAreFsdpUnitsWithTheirOwnNames) {
  Lm m = tiny();
  int wrapped = 0;
  for (const auto& c : m->modules(false))
    if (std::dynamic_pointer_cast<lockstep::fsdp::WrapBase>(c)) ++wrapped;
  EXPECT_EQ(wrapped, 2);
  const auto named = m->named_parameters();
  EXPECT_TRUE(named.contains("blocks.0.attn.qkv.weight"));
  EXPECT_TRUE(named.contains("blocks.1.fc2.bias"));
  EXPECT_TRUE(named.contains("pos_emb"));
  EXPECT_TRUE(named.contains("ln_f.weight"));
}

TEST(LmModel, CheckpointedBlocksGiveTheSameGradients) {
  LmOptions o = tiny_options();
  o.dropout = 0.1;  // lockstep's dropout: the recomputation must reuse the forward's masks
  const auto x = some_tokens(3, 16), y = some_tokens(3, 16).roll(1, 1);
  auto grads = [&](lockstep::numerics::CheckpointBlocks blocks, bool on) {
    o.checkpoint.enabled = on;
    o.checkpoint.blocks = blocks;
    Lm m = tiny(o);
    m->train();
    torch::manual_seed(7);  // the same dropout masks in both runs
    auto loss = LmImpl::loss(m->forward(x), y);
    loss.backward();
    std::vector<torch::Tensor> g{loss.detach()};
    for (const auto& p : m->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  using lockstep::numerics::CheckpointBlocks;
  const auto plain = grads(CheckpointBlocks::Layer, false);
  for (auto blocks :
       {CheckpointBlocks::Layer, CheckpointBlocks::Attention, CheckpointBlocks::Mlp}) {
    const auto ck = grads(blocks, true);
    ASSERT_EQ(ck.size(), plain.size());
    for (size_t i = 0; i < ck.size(); ++i)
      EXPECT_TRUE(torch::equal(ck[i], plain[i]))
          << "tensor " << i << " (0: loss), blocks "
          << lockstep::numerics::checkpoint_blocks_name(blocks) << ", max diff "
          << (ck[i] - plain[i]).abs().max().item<double>();
  }
}

TEST(LmModel, UntrainedModelScoresNearUniform) {
  // GPT-2's small init: logits near 0, so cross-entropy near ln 256 (perplexity ~256).
  Lm m = tiny();
  std::string text(1000, 'x');
  for (size_t i = 0; i < text.size(); ++i) text[i] = char(32 + (i * 31) % 90);
  HeldoutOptions ho;
  const HeldoutLoss l = heldout_loss(*m, text, ho);
  EXPECT_EQ(l.tokens, heldout_windows(1000, 16, 0) * 16);
  EXPECT_EQ(heldout_windows(1000, 16, 0), 62);  // (1000 - 1) / 16
  EXPECT_NEAR(l.nats / double(l.tokens), std::log(256.0), 0.1);
  // Two ranks' parts add up to the one-rank total.
  HeldoutOptions r0 = ho, r1 = ho;
  r0.world = r1.world = 2;
  r1.rank = 1;
  const HeldoutLoss a = heldout_loss(*m, text, r0), b = heldout_loss(*m, text, r1);
  EXPECT_EQ(a.tokens + b.tokens, l.tokens);
  EXPECT_NEAR(a.nats + b.nats, l.nats, 1e-6 * l.nats);
  EXPECT_EQ(heldout_windows(1000, 16, 100), 7);  // ceil(100 / 16)
}

TEST(LmModel, GenerationIsSeededAndGreedyIsArgmax) {
  Lm m = tiny();
  SampleOptions so;
  so.tokens = 40;  // longer than the context: the window slides
  const std::string a = generate(*m, "In the", so), b = generate(*m, "In the", so);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(a, b);
  so.seed = 2;
  EXPECT_NE(generate(*m, "In the", so), a);
  so.temperature = 0;
  so.tokens = 1;
  const std::string g = generate(*m, "In the", so);
  torch::NoGradGuard ng;
  const auto logits =
      m->forward(torch::tensor({73, 110, 32, 116, 104, 101}, torch::kInt64).view({1, 6}));
  EXPECT_EQ(int64_t(static_cast<unsigned char>(g[0])), logits[0][5].argmax().item<int64_t>());
  EXPECT_THROW(generate(*m, "", so), lockstep::InvalidArgument);
}

TEST(LmModel, ExportReloadsTheSameModel) {
  Lm m = tiny();
  const auto dir = std::filesystem::temp_directory_path() / "lm-export-test";
  std::filesystem::remove_all(dir);
  ModelCard card;
  card.run_name = "t";
  card.config_json = card.metrics_json = card.data_json = card.gate_json = "{}";
  export_model(m, card, dir.string());
  Lm back = load_exported_model(dir.string());
  torch::NoGradGuard ng;
  const auto x = some_tokens(2, 16);
  EXPECT_TRUE(torch::equal(back->forward(x), m->forward(x)));
  std::filesystem::remove_all(dir);
}
