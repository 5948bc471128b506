// The QSGD wire format (docs/wire-format.md, qsgd_codec.h) written the plainest way: one
// value at a time, one bit at a time, c10's dtype conversions. The SIMD paths of the codec
// must reproduce these bytes exactly (test_compress_codec_isa.cpp).
#pragma once

#include <lockstep/compress/qsgd_codec.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace lockstep::compress::reference {

template <typename T>
float to_f32(T v) {
  return static_cast<float>(v);
}

// Encodes x[0, n) (float, c10::BFloat16 or c10::Half) into the returned bytes.
template <typename T>
std::vector<uint8_t> encode(const T* x, int64_t n, const CodecOptions& o, const StreamKey& key,
                            uint64_t first_bucket) {
  const int top = (1 << o.bits) - 1;
  const int64_t nb = num_buckets(n, o);
  std::vector<uint8_t> out(size_t(encoded_bytes(n, o)), 0);
  int64_t bit = nb * 64;  // the codes follow the metadata, a little-endian bit stream per bucket
  for (int64_t j = 0; j < nb; ++j) {
    const int64_t len = std::min(o.bucket_size, n - j * o.bucket_size);
    const T* xb = x + j * o.bucket_size;
    float lo = INFINITY, hi = -INFINITY;
    bool finite = true;
    for (int64_t i = 0; i < len; ++i) {
      const float v = to_f32(xb[i]);
      finite = finite && std::isfinite(v);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    lo += 0.0f;  // -0 -> +0 (which zero min/max picks depends on the order)
    hi += 0.0f;
    float unit = NAN, inv = 0.0f;
    if (finite) {
      unit = std::min((hi - lo) / float(top), FLT_MAX);
      inv = unit > 0.0f ? std::min(1.0f / unit, FLT_MAX) : 0.0f;
    } else {
      lo = NAN;
    }
    std::memcpy(&out[size_t(j * 8)], &lo, 4);
    std::memcpy(&out[size_t(j * 8 + 4)], &unit, 4);
    const uint64_t bkey = rng::bucket_key(key, first_bucket + uint64_t(j));
    for (int64_t i = 0; i < len; ++i) {
      int code = 0;
      if (finite) {
        float t = (to_f32(xb[i]) - lo) * inv;
        t += o.stochastic ? rng::uniform(bkey, uint32_t(i)) : 0.5f;
        code = int(std::min(t, float(top)));
      }
      for (int b = 0; b < o.bits; ++b, ++bit)
        if ((code >> b) & 1) out[size_t(bit / 8)] |= uint8_t(1u << (bit % 8));
    }
    if (len % 8) bit += (8 - len % 8) * o.bits;  // a bucket's codes fill whole groups of 8
  }
  return out;
}

// Decodes into float (out[i] = v, or out[i] = out[i] + v when `add`).
inline void decode(const uint8_t* in, int64_t n, const CodecOptions& o, float* out, bool add) {
  const int64_t nb = num_buckets(n, o);
  int64_t bit = nb * 64;
  for (int64_t j = 0; j < nb; ++j) {
    const int64_t len = std::min(o.bucket_size, n - j * o.bucket_size);
    float lo, unit;
    std::memcpy(&lo, in + j * 8, 4);
    std::memcpy(&unit, in + j * 8 + 4, 4);
    for (int64_t i = 0; i < len; ++i) {
      int code = 0;
      for (int b = 0; b < o.bits; ++b, ++bit) code |= ((in[bit / 8] >> (bit % 8)) & 1) << b;
      const float v = lo + float(code) * unit;
      float& dst = out[j * o.bucket_size + i];
      dst = add ? dst + v : v;
    }
    if (len % 8) bit += (8 - len % 8) * o.bits;  // a bucket's codes end on a byte of 8 codes
  }
}

}  // namespace lockstep::compress::reference
