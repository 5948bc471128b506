// Selective activation checkpointing: which layers and sub-blocks; see
// include/lockstep/numerics/activation_checkpoint_policy.h.
#include <lockstep/error.h>
#include <lockstep/numerics/activation_checkpoint.h>
#include <lockstep/numerics/activation_checkpoint_policy.h>

namespace lockstep::numerics {

LayerCheckpointing CheckpointPolicy::for_layer(int64_t index) const {
  LOCKSTEP_CHECK(every >= 1, "lockstep::numerics::CheckpointPolicy: every = ", every,
                 " must be >= 1 (1 checkpoints every layer)");
  LOCKSTEP_CHECK(index >= 0, "lockstep::numerics::CheckpointPolicy: layer index ", index,
                 " is negative");
  LayerCheckpointing plan;
  plan.keep_dropout_masks = keep_dropout_masks;
  if (!enabled || index % every != 0) return plan;
  plan.layer = blocks == CheckpointBlocks::Layer;
  plan.attention = blocks == CheckpointBlocks::Attention;
  plan.mlp = blocks == CheckpointBlocks::Mlp;
  return plan;
}

namespace {

using TensorVec = std::vector<torch::Tensor>;

// The attention residual block, h + attention(h, extra), checkpointed when asked.
torch::Tensor attention_block(const ResidualLayer& layer, bool ckpt,
                              const ActivationCheckpointOptions& o, const torch::Tensor& h,
                              const TensorVec& extra) {
  if (!ckpt) return h + layer.attention(h, extra);
  TensorVec in{h};
  in.insert(in.end(), extra.begin(), extra.end());
  auto attention = layer.attention;  // the checkpoint keeps a copy until backward
  auto branch = activation_checkpoint(
      [attention](const TensorVec& v) {
        return TensorVec{attention(v[0], TensorVec(v.begin() + 1, v.end()))};
      },
      in, layer.attention_params, o);
  return h + branch[0];
}

torch::Tensor mlp_block(const ResidualLayer& layer, bool ckpt, const ActivationCheckpointOptions& o,
                        const torch::Tensor& x) {
  if (!ckpt) return x + layer.mlp(x);
  return x + activation_checkpoint(layer.mlp, x, layer.mlp_params, o);
}

}  // namespace

torch::Tensor run_residual_layer(const LayerCheckpointing& plan, const ResidualLayer& layer,
                                 const torch::Tensor& h, const std::vector<torch::Tensor>& extra) {
  LOCKSTEP_CHECK(
      layer.attention && layer.mlp,
      "lockstep::numerics::run_residual_layer: the attention and mlp functions must be set");
  const ActivationCheckpointOptions o{plan.keep_dropout_masks};
  if (!plan.layer)
    return mlp_block(layer, plan.mlp, o, attention_block(layer, plan.attention, o, h, extra));
  TensorVec in{h};
  in.insert(in.end(), extra.begin(), extra.end());
  TensorVec params = layer.attention_params;
  params.insert(params.end(), layer.mlp_params.begin(), layer.mlp_params.end());
  auto whole = [layer, o](const TensorVec& v) {
    const TensorVec rest(v.begin() + 1, v.end());
    return TensorVec{mlp_block(layer, false, o, attention_block(layer, false, o, v[0], rest))};
  };
  return activation_checkpoint(whole, in, params, o)[0];
}

const char* checkpoint_blocks_name(CheckpointBlocks blocks) {
  switch (blocks) {
    case CheckpointBlocks::Layer:
      return "layer";
    case CheckpointBlocks::Attention:
      return "attention";
    case CheckpointBlocks::Mlp:
      return "mlp";
  }
  return "?";
}

CheckpointBlocks parse_checkpoint_blocks(const std::string& name) {
  for (auto b : {CheckpointBlocks::Layer, CheckpointBlocks::Attention, CheckpointBlocks::Mlp})
    if (name == checkpoint_blocks_name(b)) return b;
  throw InvalidArgument("lockstep::numerics::parse_checkpoint_blocks: '" + name +
                        "' is not one of: layer, attention, mlp");
}

}  // namespace lockstep::numerics
