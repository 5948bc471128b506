// lm/model.h: a decoder-only transformer language model over bytes.
//
//   h = tok_emb(x) + pos_emb[0..T)          learned positions, T <= context
//   h = block_i(h), i = 0..layers-1           pre-norm blocks (lm/block.h), causal
//   logits = ln_f(h) tok_emb^T               the output projection is the embedding (tied)
//
// Tied embeddings: one [vocab, d_model] matrix both embeds the input bytes and scores the
// next byte, so the model has no separate output weight (GPT-2's choice; fewer parameters
// and a better start for a small model). Initialisation follows GPT-2: weights N(0, 0.02),
// biases 0, and the projections that write into the residual stream (attention's proj and
// the MLP's fc2) N(0, 0.02 / sqrt(2 layers)), so the stream's variance does not grow with
// depth. Parameters: 12 layers d^2 + (vocab + context) d plus biases and norms, about 0.84M
// for d = 128, 4 layers, context 128.
//
// Under FSDP each block is a unit of its own (lockstep::fsdp::wrap); the embeddings, the
// position table and the final norm form the root unit, which holds the tied matrix for
// both of its uses.
#pragma once

#include <lm/block.h>

#include <lockstep/numerics/activation_checkpoint_policy.h>
#include <lockstep/parallel/fsdp/wrap.h>

#include <torch/torch.h>

#include <vector>

namespace lm {

struct LmOptions {
  int64_t vocab = 256;
  int64_t context = 128;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t layers = 4;
  int64_t d_ff = 512;
  double dropout = 0.0;  // after the embeddings, on attention weights, on both residual branches
  // Activation checkpointing of the blocks (off by default); block i gets
  // checkpoint.for_layer(i) (lockstep/numerics/activation_checkpoint_policy.h).
  lockstep::numerics::CheckpointPolicy checkpoint;
};

class LmImpl : public torch::nn::Module {
 public:
  explicit LmImpl(LmOptions o);
  const LmOptions& options() const { return o_; }

  // tokens: [B, T] int64, 1 <= T <= context -> logits [B, T, vocab] in the parameters' dtype.
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean next-token cross-entropy (nats) of logits [B, T, V] against targets [B, T],
  // computed in float32.
  static torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets);

  // The tied matrix: the input embedding's weight, also the output projection.
  const torch::Tensor& embedding_weight() const { return tok_emb_->weight; }

 private:
  void init_weights();
  LmOptions o_;
  torch::nn::Embedding tok_emb_{nullptr};
  torch::Tensor pos_emb_;  // [context, d_model]
  lockstep::numerics::Dropout drop_{nullptr};
  torch::nn::ModuleList blocks_;
  // Each block is an FSDP unit under strategy.kind = "fsdp" (lockstep/parallel/fsdp/wrap.h).
  // The wrapper is transparent: parameters keep their names ("blocks.0.fc1.weight"), so
  // checkpoints and exports of unwrapped models load, and outside FSDP it is the block.
  std::vector<lockstep::fsdp::Wrapped<BlockImpl>> block_ptrs_;
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Lm);

int64_t count_parameters(torch::nn::Module& m);

}  // namespace lm
