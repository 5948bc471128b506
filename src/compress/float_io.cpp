// float32 <-> a flat buffer's dtype; see float_io.h.
#include "compress/float_io.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>

namespace lockstep::compress {

void load_float(const at::Tensor& flat, int64_t off, int64_t n, float* out) {
  switch (flat.scalar_type()) {
    case at::kFloat:
      std::memcpy(out, flat.data_ptr<float>() + off, size_t(n) * 4);
      break;
    case at::kBFloat16: {
      const c10::BFloat16* p = flat.data_ptr<c10::BFloat16>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = float(p[i]);
      break;
    }
    default: {
      const c10::Half* p = flat.data_ptr<c10::Half>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = float(p[i]);
    }
  }
}

void store_float(const float* in, int64_t n, at::Tensor& flat, int64_t off) {
  switch (flat.scalar_type()) {
    case at::kFloat:
      std::memcpy(flat.data_ptr<float>() + off, in, size_t(n) * 4);
      break;
    case at::kBFloat16: {
      c10::BFloat16* p = flat.data_ptr<c10::BFloat16>() + off;
      for (int64_t i = 0; i < n; ++i) p[i] = c10::BFloat16(in[i]);
      break;
    }
    default: {
      c10::Half* p = flat.data_ptr<c10::Half>() + off;
      for (int64_t i = 0; i < n; ++i) p[i] = c10::Half(in[i]);
    }
  }
}

}  // namespace lockstep::compress
