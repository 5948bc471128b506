// lockstep/numerics/activation_checkpoint_policy.h: which parts of a stack of transformer layers
// run under lockstep::numerics::activation_checkpoint (selective activation checkpointing;
// docs/memory.md).
//
//   using namespace lockstep::numerics;
//   CheckpointPolicy policy;                    // off
//   policy.enabled = true;                      // every layer, whole: the most memory saved
//   policy.every = 2;                           // layers 0, 2, 4, ...
//   policy.blocks = CheckpointBlocks::Attention;  // only their attention sub-block
//   for (int64_t i = 0; i < n; ++i) layers.push_back(Layer(..., policy.for_layer(i)));
//
// A layer asks for_layer(i) once and runs its two residual blocks through
// run_residual_layer (below; workloads/ctsm/src/layer.cpp, bench/memory.cpp):
//   Layer:     y = activation_checkpoint(h -> x + mlp(x), x = h + attention(h))
//   Attention: x = h + activation_checkpoint(attention)(h);  y = x + mlp(x)
//   Mlp:       x = h + attention(h);              y = x + activation_checkpoint(mlp)(x)
//
// Trade-offs (measured in docs/benchmarks.md, `lockstep-bench memory`):
//  - every = k keeps the activations of the layers in between: memory ~ (1 - 1/k) of the
//    plain model's plus the checkpointed layers' inputs, extra time ~ 1/k of a full
//    recompute. k = 1 saves the most.
//  - Attention saves what attention keeps, which grows with the sequence length squared
//    (scores, softmax, dropout over [B, heads, L, L]) and is most of a layer's activations
//    at long sequences; the MLP's, linear in L, stay. Mlp saves the [B, L, d_ff] tensors,
//    a large share only at short sequences or wide d_ff. Each costs one more forward of its
//    sub-block; Layer costs one more forward of the whole layer.
//  - keep_dropout_masks (lockstep::numerics::dropout inside the checkpointed blocks) keeps each
//    dropout's mask at 1 byte per element instead of drawing it again in backward: on the
//    CPU the draw costs more than the rest of a dropout-heavy block, so it is what makes
//    recomputation with dropout slow. Off: only the blocks' inputs are kept.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep::numerics {

enum class CheckpointBlocks {
  Layer,      // the whole layer under one checkpoint (the most memory saved)
  Attention,  // only the attention residual block (norm, attention, dropout)
  Mlp,        // only the feed-forward residual block (norm, MLP, dropout)
};

// What one layer checkpoints: at most one of the three.
struct LayerCheckpointing {
  bool layer = false;
  bool attention = false;
  bool mlp = false;
  bool keep_dropout_masks =
      true;  // ActivationCheckpointOptions::keep_dropout_masks of its checkpoints
  bool any() const { return layer || attention || mlp; }
};

struct CheckpointPolicy {
  bool enabled = false;  // off by default: checkpointing trades time for memory
  int64_t every = 1;     // checkpoint layers 0, every, 2 * every, ... (>= 1)
  CheckpointBlocks blocks = CheckpointBlocks::Layer;
  bool keep_dropout_masks = true;

  // The plan for layer `index` (0-based). Throws InvalidArgument for every < 1 or a
  // negative index.
  LayerCheckpointing for_layer(int64_t index) const;
};

// The two residual branches of a pre-norm transformer layer, y = x + mlp(x) with
// x = h + attention(h, extra), and the parameters each one reads (every tensor that
// requires grad, as lockstep::numerics::activation_checkpoint's contract asks). `extra`: further
// inputs of the attention branch (masks, a second stream), passed through the checkpoints as
// inputs. The functions are copied into the checkpoints and called again in backward.
struct ResidualLayer {
  std::function<torch::Tensor(const torch::Tensor& h, const std::vector<torch::Tensor>& extra)>
      attention;
  std::vector<torch::Tensor> attention_params;
  std::function<torch::Tensor(const torch::Tensor& x)> mlp;
  std::vector<torch::Tensor> mlp_params;
};

// y for input h, with the checkpoints `plan` asks for (none: a plain forward).
torch::Tensor run_residual_layer(const LayerCheckpointing& plan, const ResidualLayer& layer,
                                 const torch::Tensor& h,
                                 const std::vector<torch::Tensor>& extra = {});

// "layer", "attention", "mlp" (the trainer's memory.checkpoint_blocks values).
const char* checkpoint_blocks_name(CheckpointBlocks blocks);
// The inverse; InvalidArgument naming the accepted values for any other string.
CheckpointBlocks parse_checkpoint_blocks(const std::string& name);

}  // namespace lockstep::numerics
