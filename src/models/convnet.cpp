#include <lockstep/models/convnet.h>

#include <lockstep/error.h>

#include <torch/torch.h>

namespace lockstep::models {

namespace {
// Spatial size after a valid 3x3 conv and a 2x2 max-pool (floor), as torch computes it.
int64_t after_block(int64_t s) { return (s - 2) / 2; }
}  // namespace

ConvNetImpl::ConvNetImpl(ConvNetOptions o) : options_(o) {
  const int64_t s = after_block(after_block(o.image_size));
  LOCKSTEP_CHECK(s >= 1, "ConvNet: image_size ", o.image_size, " is too small for two conv blocks");
  // bias=false: a BatchNorm follows each conv and its shift makes a conv bias redundant.
  conv1_ = register_module(
      "conv1",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(o.in_channels, o.channels1, 3).bias(false)));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(o.channels1));
  conv2_ = register_module(
      "conv2",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(o.channels1, o.channels2, 3).bias(false)));
  bn2_ = register_module("bn2", torch::nn::BatchNorm2d(o.channels2));
  fc1_ = register_module("fc1", torch::nn::Linear(o.channels2 * s * s, o.hidden));
  fc2_ = register_module("fc2", torch::nn::Linear(o.hidden, o.num_classes));
  dropout_ = register_module("dropout", torch::nn::Dropout(o.dropout));
}

torch::Tensor ConvNetImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(bn1_->forward(conv1_->forward(x))), 2);
  x = torch::max_pool2d(torch::relu(bn2_->forward(conv2_->forward(x))), 2);
  x = torch::relu(fc1_->forward(x.flatten(1)));
  if (options_.dropout > 0) x = dropout_->forward(x);
  return fc2_->forward(x);
}

}  // namespace lockstep::models
