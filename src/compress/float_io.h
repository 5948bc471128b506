// Conversions between a flat buffer's float32 / bfloat16 / float16 values and float32, for
// the compressed collectives' accumulators and plain (unquantized) segments.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace lockstep::compress {

// out[0, n) <- flat[off, off + n) as float32.
void load_float(const at::Tensor& flat, int64_t off, int64_t n, float* out);
// flat[off, off + n) <- in[0, n) (round to nearest even for the 16-bit types).
void store_float(const float* in, int64_t n, at::Tensor& flat, int64_t off);

}  // namespace lockstep::compress
