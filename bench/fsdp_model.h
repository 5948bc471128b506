// lockstep-bench fsdp: the benchmark's transformer, its deterministic initialization and its
// synthetic batches. bench/peers/pytorch_fsdp.py builds the same model with the same names,
// values and batches (integer hashes, no random generator), so both sides start from the
// same parameters and see the same tokens: their first losses agree.
//
// A decoder-only language model: token and position embeddings, `layers` pre-norm blocks
// (causal self-attention with heads of 64, GELU MLP of 4 x d_model), a final LayerNorm and
// a linear head without bias. Each block is wrapped with fsdp::wrap (an FSDP unit under
// FullyShardedDataParallel, transparent under DDP); the embeddings, the final norm and the
// head stay in the root unit.
#pragma once

#include "fsdp_bench.h"

#include <lockstep/parallel/fsdp/wrap.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace lockstep::bench {

// Called at the end of each block's forward and when its input's gradient is ready: the
// worker samples memory there. Empty: nothing is called.
using Probe = std::function<void()>;

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d_model, int64_t heads, std::shared_ptr<Probe> probe);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};

 private:
  at::Tensor attention(const at::Tensor& x);
  int64_t heads_;
  std::shared_ptr<Probe> probe_;
};

struct TransformerLM : torch::nn::Module {
  TransformerLM(const ModelShape& shape, const std::shared_ptr<Probe>& probe);
  // tokens [B, T] (int64) -> logits [B * T, vocab].
  at::Tensor forward(const at::Tensor& tokens);

  torch::nn::Embedding tok{nullptr};
  at::Tensor pos;  // [seq, d_model]
  std::vector<fsdp::Wrapped<BlockImpl>> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};

// Sets every parameter from an integer hash of its name and index: Linear weights uniform
// in +-1/sqrt(fan_in), embeddings in +-0.05, LayerNorm weights 1, biases 0.
void init_deterministic(torch::nn::Module& model);

// Batch `k` of rank `rank`: tokens [batch, seq] and next-token targets [batch * seq].
std::pair<at::Tensor, at::Tensor> make_batch(const ModelShape& s, int rank, int k);

}  // namespace lockstep::bench
