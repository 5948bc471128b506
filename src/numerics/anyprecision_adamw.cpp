// AnyPrecision AdamW: the step, the option checks and the archive format (the same layout
// as torch's optimizers, through torch::optim::serialize). See the header for the algorithm.
#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/numerics/anyprecision_adamw.h>

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <cmath>

namespace lockstep::numerics {
namespace {

using torch::Tensor;

bool is_float_dtype(c10::ScalarType t) {
  return t == c10::kFloat || t == c10::kDouble || t == c10::kBFloat16 || t == c10::kHalf;
}

template <typename... Args>
void require_adamw(bool ok, const Args&... message) {
  if (!ok) throw InvalidArgument(lockstep::detail::concat("AnyPrecisionAdamW: ", message...));
}

void require_dtype(const char* option, c10::ScalarType t) {
  require_adamw(is_float_dtype(t), "option ", option,
                " must be a floating dtype (float32, float64, ", "bfloat16, float16), not ",
                c10::toString(t));
}

// dst += value * a * b, dst += value * a / b: the fused kernels when all dtypes agree (the
// arithmetic of torch::optim::AdamW); otherwise the product in the operands' promoted dtype,
// rounded into dst (libtorch 1.13's CPU addcmul_/addcdiv_ assert on mixed dtypes).
void add_product(Tensor& dst, const Tensor& a, const Tensor& b, double value) {
  if (a.scalar_type() == dst.scalar_type() && b.scalar_type() == dst.scalar_type())
    dst.addcmul_(a, b, value);
  else
    dst.add_(a * b, value);
}

void add_quotient(Tensor& dst, const Tensor& a, const Tensor& b, double value) {
  if (a.scalar_type() == dst.scalar_type() && b.scalar_type() == dst.scalar_type())
    dst.addcdiv_(a, b, value);
  else
    dst.add_(a / b, value);
}

// A state tensor in `dtype`, converting one that was loaded in another dtype.
void ensure_dtype(Tensor& t, const Tensor& p, c10::ScalarType dtype) {
  if (!t.defined())
    t = at::zeros_like(p, p.options().dtype(dtype), at::MemoryFormat::Preserve);
  else if (t.scalar_type() != dtype)
    t = t.to(dtype);
}

void write_double(torch::serialize::OutputArchive& ar, const char* key, double v) {
  ar.write(key, c10::IValue(v));
}
c10::IValue read_value(torch::serialize::InputArchive& ar, const char* key) {
  c10::IValue v;
  ar.read(key, v);
  return v;
}

}  // namespace

// --- options ------------------------------------------------------------------------------

AnyPrecisionAdamWOptions::AnyPrecisionAdamWOptions(double lr) : lr_(lr) {}

double AnyPrecisionAdamWOptions::get_lr() const { return lr(); }
void AnyPrecisionAdamWOptions::set_lr(const double lr) { this->lr(lr); }

void AnyPrecisionAdamWOptions::validate() const {
  require_adamw(lr() >= 0, "option lr must be >= 0, not ", lr());
  require_adamw(eps() >= 0, "option eps must be >= 0, not ", eps());
  require_adamw(weight_decay() >= 0, "option weight_decay must be >= 0, not ", weight_decay());
  const auto [b1, b2] = betas();
  require_adamw(b1 >= 0 && b1 < 1, "option betas[0] must be in [0, 1), not ", b1);
  require_adamw(b2 >= 0 && b2 < 1, "option betas[1] must be in [0, 1), not ", b2);
  require_dtype("momentum_dtype", momentum_dtype());
  require_dtype("variance_dtype", variance_dtype());
  require_dtype("compensation_buffer_dtype", compensation_buffer_dtype());
}

bool operator==(const AnyPrecisionAdamWOptions& l, const AnyPrecisionAdamWOptions& r) {
  return l.lr() == r.lr() && l.betas() == r.betas() && l.eps() == r.eps() &&
         l.weight_decay() == r.weight_decay() &&
         l.use_kahan_summation() == r.use_kahan_summation() &&
         l.momentum_dtype() == r.momentum_dtype() && l.variance_dtype() == r.variance_dtype() &&
         l.compensation_buffer_dtype() == r.compensation_buffer_dtype();
}

// Dtypes as their c10::ScalarType numbers, the numbering TorchScript archives use too.
void AnyPrecisionAdamWOptions::serialize(torch::serialize::OutputArchive& ar) const {
  write_double(ar, "lr", lr());
  ar.write("betas", c10::IValue(betas()));
  write_double(ar, "eps", eps());
  write_double(ar, "weight_decay", weight_decay());
  ar.write("use_kahan_summation", c10::IValue(use_kahan_summation()));
  ar.write("momentum_dtype", c10::IValue(static_cast<int64_t>(momentum_dtype())));
  ar.write("variance_dtype", c10::IValue(static_cast<int64_t>(variance_dtype())));
  ar.write("compensation_buffer_dtype",
           c10::IValue(static_cast<int64_t>(compensation_buffer_dtype())));
}

void AnyPrecisionAdamWOptions::serialize(torch::serialize::InputArchive& ar) {
  lr(read_value(ar, "lr").toDouble());
  betas(read_value(ar, "betas").to<betas_t>());
  eps(read_value(ar, "eps").toDouble());
  weight_decay(read_value(ar, "weight_decay").toDouble());
  use_kahan_summation(read_value(ar, "use_kahan_summation").toBool());
  auto dtype = [&ar](const char* key) {
    return static_cast<c10::ScalarType>(read_value(ar, key).toInt());
  };
  momentum_dtype(dtype("momentum_dtype"));
  variance_dtype(dtype("variance_dtype"));
  compensation_buffer_dtype(dtype("compensation_buffer_dtype"));
}

// --- per-parameter state ------------------------------------------------------------------

bool operator==(const AnyPrecisionAdamWParamState& l, const AnyPrecisionAdamWParamState& r) {
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.defined() == b.defined() && (!a.defined() || at::equal(a, b));
  };
  return l.step() == r.step() && same(l.exp_avg(), r.exp_avg()) &&
         same(l.exp_avg_sq(), r.exp_avg_sq()) && same(l.compensation(), r.compensation());
}

// Undefined tensors are left out, as torch's states do (compensation without Kahan).
void AnyPrecisionAdamWParamState::serialize(torch::serialize::OutputArchive& ar) const {
  ar.write("step", c10::IValue(step()));
  for (const auto& [key, t] : {std::pair<const char*, const Tensor&>{"exp_avg", exp_avg()},
                               {"exp_avg_sq", exp_avg_sq()},
                               {"compensation", compensation()}})
    if (t.defined()) ar.write(key, t);
}

void AnyPrecisionAdamWParamState::serialize(torch::serialize::InputArchive& ar) {
  step(read_value(ar, "step").toInt());
  Tensor t;
  if (ar.try_read("exp_avg", t)) exp_avg(t);
  Tensor sq;
  if (ar.try_read("exp_avg_sq", sq)) exp_avg_sq(sq);
  Tensor c;
  if (ar.try_read("compensation", c)) compensation(c);
}

// --- the optimizer ------------------------------------------------------------------------

AnyPrecisionAdamW::AnyPrecisionAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                     const AnyPrecisionAdamWOptions& defaults)
    : Optimizer(param_groups, std::make_unique<AnyPrecisionAdamWOptions>(defaults)) {
  // libtorch 2.x's add_param_group merges a group's own options with the defaults only for
  // torch's optimizer types and keeps the bare defaults for any other: a custom optimizer's
  // per-group lr, betas, weight decay... would be lost. Put the groups' own options back
  // (a no-op with 1.13, which keeps them). Groups added later through add_param_group get
  // the same treatment from libtorch: pass every group to the constructor.
  for (size_t i = 0; i < param_groups.size(); ++i)
    if (param_groups[i].has_options())
      param_groups_[i].set_options(param_groups[i].options().clone());
  for (auto& group : param_groups_)
    static_cast<const AnyPrecisionAdamWOptions&>(group.options()).validate();
}

AnyPrecisionAdamWParamState& AnyPrecisionAdamW::state_for(const Tensor& p,
                                                          const AnyPrecisionAdamWOptions& o) {
  auto& slot = state_[compat::optimizer_state_key(state_, p)];
  if (!slot) slot = std::make_unique<AnyPrecisionAdamWParamState>();
  auto& s = static_cast<AnyPrecisionAdamWParamState&>(*slot);
  ensure_dtype(s.exp_avg(), p, o.momentum_dtype());
  ensure_dtype(s.exp_avg_sq(), p, o.variance_dtype());
  if (o.use_kahan_summation()) ensure_dtype(s.compensation(), p, o.compensation_buffer_dtype());
  return s;
}

void AnyPrecisionAdamW::step_param(const Tensor& param, const AnyPrecisionAdamWOptions& o) {
  const Tensor& grad = param.grad();
  require_adamw(!grad.is_sparse(), "sparse gradients are not supported");
  const bool half = o.momentum_dtype() == c10::kHalf || o.variance_dtype() == c10::kHalf ||
                    param.scalar_type() == c10::kHalf ||
                    (o.use_kahan_summation() && o.compensation_buffer_dtype() == c10::kHalf);
  require_adamw(!half || !param.device().is_cpu(),
                "float16 parameters or states need a CUDA device (libtorch's CPU kernels lack "
                "float16); use bfloat16 on CPU");
  Tensor p = param;  // shares storage: the in-place updates below write the parameter
  if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());

  auto& s = state_for(p, o);
  s.step(s.step() + 1);
  const auto [beta1, beta2] = o.betas();
  const double bias_correction1 = 1 - std::pow(beta1, s.step());
  const double bias_correction2 = 1 - std::pow(beta2, s.step());

  s.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
  s.exp_avg_sq().mul_(beta2);
  add_product(s.exp_avg_sq(), grad, grad, 1 - beta2);

  const Tensor denom = (s.exp_avg_sq().sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
  const double step_size = o.lr() / bias_correction1;
  if (!o.use_kahan_summation()) {
    add_quotient(p, s.exp_avg(), denom, -step_size);
    return;
  }
  Tensor& c = s.compensation();
  add_quotient(c, s.exp_avg(), denom, -step_size);
  Tensor before = p.clone();
  p.add_(c);
  c.add_(before.sub_(p));  // what rounding p + c into p's dtype dropped
}

Tensor AnyPrecisionAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const AnyPrecisionAdamWOptions&>(group.options());
    o.validate();  // groups added after construction, options changed since
    for (auto& p : group.params())
      if (p.grad().defined()) step_param(p, o);
  }
  return loss;
}

void AnyPrecisionAdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AnyPrecisionAdamWParamState, AnyPrecisionAdamWOptions>(archive, *this);
}

void AnyPrecisionAdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<AnyPrecisionAdamWParamState, AnyPrecisionAdamWOptions>(archive, *this);
}

}  // namespace lockstep::numerics
