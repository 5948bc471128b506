// lockstep/numerics/anyprecision_adamw.h: AdamW whose states live in any float dtype, with
// an optional Kahan-compensated parameter update, so that bf16 parameters and bf16
// optimizer states train like fp32 AdamW (the "AnyPrecision AdamW" of torchdistx).
//
//   model->to(torch::kBFloat16);
//   lockstep::numerics::AnyPrecisionAdamW opt(
//       model->parameters(), lockstep::numerics::AnyPrecisionAdamWOptions(1e-3)
//                                .use_kahan_summation(true)
//                                .momentum_dtype(torch::kBFloat16)
//                                .variance_dtype(torch::kBFloat16)
//                                .compensation_buffer_dtype(torch::kBFloat16));
//   loss.backward(); opt.step(); opt.zero_grad();
//   torch::save(opt, "opt.pt");   // and torch::load(opt, "opt.pt"), as any torch optimizer
//
// One step, per parameter p with gradient g, at step t (1-based):
//   p *= 1 - lr * weight_decay                       (decoupled weight decay)
//   m  = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g * g
//   u  = -lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//   without Kahan:  p += u
//   with Kahan:     c += u;  tmp = p;  p += c;  c += tmp - p
// c, the compensation buffer, keeps the part of the update that rounding to p's dtype
// dropped, and feeds it back on the next step: small updates to bf16 weights accumulate
// instead of vanishing.
//
// Contract:
// - m, v and c are held in momentum_dtype, variance_dtype and compensation_buffer_dtype
//   whatever the parameter's dtype (float64 parameters want kDouble states). Each
//   operation computes in the wider of its operands' dtypes and rounds into its result.
// - With float32 states, Kahan off and float32 parameters, a step is the same arithmetic
//   as torch::optim::AdamW (amsgrad off). The default weight decay is AdamW's, 1e-2.
// - A gradient in another float dtype than its parameter is used as it is (the moments
//   round it into their dtypes). Sparse gradients are rejected.
// - float16 states need a CUDA device: libtorch 1.13's CPU kernels (sqrt, addcmul,
//   addcdiv) lack float16. On CPU use bfloat16.
// - Bad options (negative lr, eps or weight decay, betas outside [0, 1), a dtype that is
//   not a floating type) throw lockstep::InvalidArgument naming the option.
// - save()/load() write the same archive layout as torch's own optimizers (options per
//   param group, per-parameter state keyed by the parameter), so torch::save(opt, ...)
//   and the trainer's checkpoints work; FSDP's sharded checkpoints hold the state too.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <c10/core/ScalarType.h>

#include <tuple>
#include <utility>
#include <vector>

namespace lockstep::numerics {

struct AnyPrecisionAdamWOptions
    : public torch::optim::OptimizerCloneableOptions<AnyPrecisionAdamWOptions> {
  AnyPrecisionAdamWOptions(double lr = 1e-3);  // NOLINT: implicit, as torch's options
  TORCH_ARG(double, lr) = 1e-3;
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 1e-2;  // torch::optim::AdamW's default
  TORCH_ARG(bool, use_kahan_summation) = false;
  TORCH_ARG(c10::ScalarType, momentum_dtype) = c10::ScalarType::Float;
  TORCH_ARG(c10::ScalarType, variance_dtype) = c10::ScalarType::Float;
  TORCH_ARG(c10::ScalarType, compensation_buffer_dtype) = c10::ScalarType::Float;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const AnyPrecisionAdamWOptions& lhs, const AnyPrecisionAdamWOptions& rhs);
  ~AnyPrecisionAdamWOptions() override = default;
  double get_lr() const override;
  void set_lr(const double lr) override;
  // Throws InvalidArgument naming the first bad option.
  void validate() const;
};

struct AnyPrecisionAdamWParamState
    : public torch::optim::OptimizerCloneableParamState<AnyPrecisionAdamWParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  TORCH_ARG(torch::Tensor, compensation) = {};  // defined only when Kahan summation is on

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const AnyPrecisionAdamWParamState& lhs,
                         const AnyPrecisionAdamWParamState& rhs);
  ~AnyPrecisionAdamWParamState() override = default;
};

class AnyPrecisionAdamW : public torch::optim::Optimizer {
 public:
  explicit AnyPrecisionAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                             const AnyPrecisionAdamWOptions& defaults = {});
  explicit AnyPrecisionAdamW(std::vector<torch::Tensor> params,
                             const AnyPrecisionAdamWOptions& defaults = {})
      : AnyPrecisionAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void step_param(const torch::Tensor& p, const AnyPrecisionAdamWOptions& o);
  AnyPrecisionAdamWParamState& state_for(const torch::Tensor& p, const AnyPrecisionAdamWOptions& o);
};

}  // namespace lockstep::numerics
