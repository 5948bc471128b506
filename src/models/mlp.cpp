#include <lockstep/models/mlp.h>

#include <lockstep/error.h>

#include <torch/torch.h>

namespace lockstep::models {

MlpImpl::MlpImpl(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) {
  LOCKSTEP_CHECK(sizes_.size() >= 2, "Mlp: need at least an input and an output size, got ",
                 sizes_.size(), " sizes");
  for (int64_t s : sizes_) LOCKSTEP_CHECK(s >= 1, "Mlp: layer sizes must be >= 1, got ", s);
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (size_t i = 0; i + 1 < sizes_.size(); ++i)
    layers_->push_back(torch::nn::Linear(sizes_[i], sizes_[i + 1]));
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  x = x.flatten(1);
  const size_t n = layers_->size();
  for (size_t i = 0; i < n; ++i) {
    x = layers_[i]->as<torch::nn::Linear>()->forward(x);
    if (i + 1 < n) x = torch::relu(x);
  }
  return x;
}

}  // namespace lockstep::models
