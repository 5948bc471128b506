// The numerics PowerSGD shares with PyTorch's hook: its orthogonalisation and its
// initial-Q seeds (include/lockstep/parallel/ddp/hooks/powersgd_hook.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>

namespace lockstep::ddp::hooks::powersgd {

// numpy.random.RandomState's legacy randint(10^9) on its MT19937: 32-bit draws masked to
// 30 bits, rejected above 10^9 - 1. `mt` seeded with s is RandomState(s)'s generator.
uint32_t draw_seed(std::mt19937& mt);

// In place, the columns of `m` (rows x r, r <= rows, a contiguous view) made orthonormal
// as PyTorch's _orthogonalize does: Gram-Schmidt for r <= 2 or 16-bit dtypes (each column
// divided by its norm, or by norm + epsilon; a zero column with epsilon 0 becomes zeros),
// else Householder QR.
void orthogonalize(at::Tensor m, double epsilon);

}  // namespace lockstep::ddp::hooks::powersgd
