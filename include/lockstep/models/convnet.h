// lockstep/models/convnet.h: a small convnet for 28x28 grayscale images (Fashion-MNIST).
//
//   conv 1->32 3x3 + BatchNorm + ReLU + maxpool 2   28 -> 26 -> 13
//   conv 32->64 3x3 + BatchNorm + ReLU + maxpool 2  13 -> 11 -> 5
//   flatten 64*5*5 -> fc 128 + ReLU + dropout -> fc 10 (logits)
// ~225k parameters; reaches ~90% test accuracy on Fashion-MNIST in a few epochs.
//
// Note for data parallelism: BatchNorm's running statistics are buffers, not
// parameters; each rank's copy tracks its own shard unless DDP broadcasts buffers.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace lockstep::models {

struct ConvNetOptions {
  int64_t in_channels = 1;
  int64_t image_size = 28;  // square inputs; sets the size of the first fc layer
  int64_t channels1 = 32;
  int64_t channels2 = 64;
  int64_t hidden = 128;
  int64_t num_classes = 10;
  double dropout = 0.25;  // before the last layer; 0 disables it
};

class ConvNetImpl : public torch::nn::Module {
 public:
  explicit ConvNetImpl(ConvNetOptions options = {});
  // x: [B, in_channels, image_size, image_size] float -> logits [B, num_classes].
  torch::Tensor forward(torch::Tensor x);

 private:
  ConvNetOptions options_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(ConvNet);  // ConvNet: a shared_ptr-like holder of ConvNetImpl

}  // namespace lockstep::models
