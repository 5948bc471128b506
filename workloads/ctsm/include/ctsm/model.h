// ctsm/model.h: the client time series model (CTSM).
//
// Reads one client's events in time order and gives, for every target position (an item
// shipped to the client), the logit of the probability that the client keeps (buys) it,
// using only events strictly earlier in time. Per-event input: item embedding, event
// kind, time features; outcome (kept/returned/feedback type and rating, and a learned map
// of the item embedding signed by the outcome) enters only as context on the key side
// (ctsm_layer.h). Score: MLP(state) + <W state, item embedding> + item bias. A learned start token
// is visible to every position (ctsm_attention.h). Parameter count is dominated by the item table:
// (num_items+1)*d_model; e.g. 200k items x 128 = 25.6M. Under FSDP each encoder layer is a
// unit of its own; the embeddings, time projection and heads form the root unit.
#pragma once

#include <ctsm/batch.h>
#include <ctsm/layer.h>

#include <lockstep/parallel/fsdp/wrap.h>

#include <torch/torch.h>

namespace ctsm {

struct CtsmOptions {
  int64_t num_items = 1000;  // item ids 1..num_items; 0 = none
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t d_ff = 256;
  double dropout = 0.0;
  // Activation checkpointing of the encoder layers (off by default); layer i gets
  // checkpoint.for_layer(i) (lockstep/numerics/activation_checkpoint_policy.h).
  lockstep::numerics::CheckpointPolicy checkpoint;
};

class CtsmImpl : public torch::nn::Module {
 public:
  explicit CtsmImpl(CtsmOptions o);
  const CtsmOptions& options() const { return o_; }

  // Logits [B,L] (meaningful where batch.is_target).
  torch::Tensor forward(const CtsmBatch& batch);
  // Mean binary cross-entropy over the target positions (0 if there are none).
  static torch::Tensor loss(const torch::Tensor& logits, const CtsmBatch& batch);

 private:
  CtsmOptions o_;
  torch::nn::Embedding item_emb_{nullptr}, item_bias_{nullptr}, kind_emb_{nullptr},
      type_emb_{nullptr}, feedback_emb_{nullptr};
  torch::nn::Linear time_proj_{nullptr};
  torch::nn::ModuleList layers_;
  // Each layer is an FSDP unit under strategy.kind = "fsdp" (lockstep/parallel/fsdp/wrap.h).
  // The wrapper is transparent: parameters keep their names ("layers.0.ff1.weight"), so
  // checkpoints and exports of unwrapped models load, and outside FSDP it is the layer.
  std::vector<lockstep::fsdp::Wrapped<CtsmLayerImpl>> layer_ptrs_;
  torch::nn::LayerNorm ln_out_{nullptr};
  torch::nn::Linear head1_{nullptr}, head2_{nullptr}, bilinear_{nullptr}, taste_proj_{nullptr};
};
TORCH_MODULE(Ctsm);

int64_t count_parameters(torch::nn::Module& m);

}  // namespace ctsm
