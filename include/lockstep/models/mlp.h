// lockstep/models/mlp.h: a plain multi-layer perceptron, Linear + ReLU between layers.
//
// Mlp({1024, 4096, 4096, 10}) is the benchmarks' model: 1024->4096->4096->10, ~21M
// parameters (84 MB of float32 gradients), large enough that gradient communication
// matters next to the compute.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <vector>

namespace lockstep::models {

class MlpImpl : public torch::nn::Module {
 public:
  // sizes: input width, hidden widths..., output width; at least two entries.
  // No activation after the last layer (it returns logits / raw outputs).
  explicit MlpImpl(std::vector<int64_t> sizes);
  // x: [B, sizes.front()] (extra dims are flattened) -> [B, sizes.back()].
  torch::Tensor forward(torch::Tensor x);
  const std::vector<int64_t>& sizes() const { return sizes_; }

 private:
  std::vector<int64_t> sizes_;
  torch::nn::ModuleList layers_{nullptr};
};
TORCH_MODULE(Mlp);

}  // namespace lockstep::models
