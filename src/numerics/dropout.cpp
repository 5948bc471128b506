// lockstep::numerics::dropout: torch::dropout whose mask a checkpoint can keep; see
// include/lockstep/numerics/dropout.h and activation_checkpoint_draws.h.
#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/numerics/dropout.h>

#include "activation_checkpoint_draws.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace lockstep::numerics {
namespace {

// The layout of ATen's noise, and so which element each draw lands on for a non-contiguous
// input: contiguous up to libtorch 2.4, the input's own strides since (pytorch/pytorch
// PR 129467; measured: 1.13 contiguous, 2.15 preserved).
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 5)
constexpr auto kNoiseFormat = at::MemoryFormat::Preserve;
#else
constexpr auto kNoiseFormat = at::MemoryFormat::Contiguous;
#endif

}  // namespace

torch::Tensor dropout(const torch::Tensor& x, double p, bool train) {
  if (!train || !(p > 0 && p < 1) || x.numel() == 0 || !x.device().is_cpu() ||
      !draws::draw_frames_active())
    return torch::dropout(x, p, train);
  // libtorch's CPU dropout, step by step (ATen's _dropout_impl): noise (kNoiseFormat) drawn
  // with bernoulli_(1 - p), scaled by 1 / (1 - p), multiplied in. Same ops on the same
  // values, so the same bits; the draw is the part a checkpoint keeps.
  at::Tensor noise;
  const at::Tensor mask = draws::kept_draw(x.sizes(), [&] {
    noise = at::empty_like(x, kNoiseFormat);
    // The default CPU generator named (what bernoulli_ uses when given none): the
    // defaulted optional trips GCC's -Wmaybe-uninitialized under the sanitizer build.
    noise.bernoulli_(1 - p, at::detail::getDefaultCPUGenerator());
    return noise.to(at::kBool);
  });
  if (!noise.defined()) noise = mask.to(x.scalar_type());  // replayed: 0 and 1 exactly
  noise.div_(1 - p);
  return x * noise;
}

DropoutImpl::DropoutImpl(double p) : p_(p) {
  LOCKSTEP_CHECK(p >= 0 && p <= 1, "lockstep::numerics::Dropout: p = ", p, " is not in [0, 1]");
}

torch::Tensor DropoutImpl::forward(const torch::Tensor& x) {
  return lockstep::numerics::dropout(x, p_, is_training());
}

void DropoutImpl::pretty_print(std::ostream& stream) const {
  stream << "lockstep::numerics::Dropout(p=" << p_ << ")";
}

}  // namespace lockstep::numerics
