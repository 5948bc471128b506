// PowerSGD's orthogonalisation and seeds; see powersgd_linalg.h.
#include "powersgd_linalg.h"

#include <ATen/ATen.h>

#include <tuple>

namespace lockstep::ddp::hooks::powersgd {

uint32_t draw_seed(std::mt19937& mt) {
  constexpr uint32_t kMax = 999999999u;    // randint's high - 1
  constexpr uint32_t kMask = 0x3FFFFFFFu;  // the smallest all-ones mask >= kMax
  uint32_t v = 0;
  do {
    v = uint32_t(mt()) & kMask;
  } while (v > kMax);
  return v;
}

namespace {

void gram_schmidt(at::Tensor& m, double epsilon) {
  const int64_t r = m.size(1);
  for (int64_t i = 0; i < r; ++i) {
    at::Tensor col = m.narrow(1, i, 1);
    at::Tensor norm = at::linalg_vector_norm(col, 2, at::IntArrayRef{0}, /*keepdim=*/true);
    if (epsilon != 0)
      col.div_(norm + epsilon);
    else if (norm.item<double>() == 0)
      col.zero_();  // PyTorch's intent ("recover the values from NaNs to 0s")
    else
      col.div_(norm);
    if (i + 1 < r) {
      at::Tensor rest = m.narrow(1, i + 1, r - i - 1);
      rest.sub_(at::sum(col * rest, at::IntArrayRef{0}, /*keepdim=*/true) * col);
    }
  }
}

}  // namespace

void orthogonalize(at::Tensor m, double epsilon) {
  const auto dt = m.scalar_type();
  if (m.size(1) <= 2 || dt == at::kHalf || dt == at::kBFloat16) {
    gram_schmidt(m, epsilon);
    return;
  }
  at::Tensor q = std::get<0>(at::linalg_qr(m, "reduced"));
  m.copy_(q);
}

}  // namespace lockstep::ddp::hooks::powersgd
