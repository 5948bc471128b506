// QSGD-style bucketed stochastic quantization: the contract (qsgd_codec.h), sizes and
// argument checks. The kernels are in codec_kernels.inc, compiled once per SIMD path
// (codec_{generic,avx2,avx512}.cpp) and chosen at run time (codec_dispatch.cpp).
#include <lockstep/compress/qsgd_codec.h>

#include "compress/codec_kernels.h"

#include <cstring>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is little-endian; a big-endian port must byte-swap metadata and codes"
#endif

namespace lockstep::compress {
namespace {

constexpr int kLanes = 8;  // all_finite: two 4-lane accumulators

// all_finite uses GCC/Clang vector extensions (not intrinsics), 16-byte vectors: one
// register on every SIMD ISA, and the baseline x86-64 build vectorizes it.
typedef float v4f __attribute__((vector_size(16)));

inline v4f load4(const float* p) {
  v4f v;
  std::memcpy(&v, p, sizeof v);  // unaligned load
  return v;
}

inline int64_t code_bytes(int64_t len, int bits) { return (len + 7) / 8 * bits; }

void check_dtype(c10::ScalarType t) {
  LOCKSTEP_CHECK(t == c10::kFloat || t == c10::kBFloat16 || t == c10::kHalf,
                 "compression takes float32, bfloat16 or float16, not ", c10::toString(t));
}

detail::InType in_type(c10::ScalarType t) {
  check_dtype(t);
  return t == c10::kFloat      ? detail::InType::kF32
         : t == c10::kBFloat16 ? detail::InType::kBF16
                               : detail::InType::kF16;
}

}  // namespace

void validate(const CodecOptions& o) {
  LOCKSTEP_CHECK(o.bits >= 1 && o.bits <= 8, "bits must be 1..8, got ", o.bits);
  LOCKSTEP_CHECK(o.bucket_size >= 1 && o.bucket_size <= (int64_t(1) << 24),
                 "bucket_size must be 1..2^24, got ", o.bucket_size);
}

int64_t num_buckets(int64_t n, const CodecOptions& o) {
  return (n + o.bucket_size - 1) / o.bucket_size;
}

int64_t encoded_bytes(int64_t n, const CodecOptions& o) {
  const int64_t full = n / o.bucket_size, tail = n % o.bucket_size;
  const int64_t bytes =
      num_buckets(n, o) * 8 + full * code_bytes(o.bucket_size, o.bits) + code_bytes(tail, o.bits);
  return (bytes + 3) & ~int64_t(3);
}

int64_t encode(const float* x, int64_t n, const CodecOptions& o, const StreamKey& key,
               uint64_t first_bucket, uint8_t* out) {
  validate(o);
  return detail::active().encode(x, detail::InType::kF32, n, o, key, first_bucket, out);
}

int64_t encode(const void* x, c10::ScalarType dtype, int64_t n, const CodecOptions& o,
               const StreamKey& key, uint64_t first_bucket, uint8_t* out) {
  const detail::InType in = in_type(dtype);
  validate(o);
  return detail::active().encode(x, in, n, o, key, first_bucket, out);
}

int64_t decode(const uint8_t* in, int64_t n, const CodecOptions& o, float* out) {
  validate(o);
  return detail::active().decode(in, n, o, out, detail::OutMode::kStoreF32);
}

int64_t decode(const uint8_t* in, int64_t n, const CodecOptions& o, void* out,
               c10::ScalarType dtype) {
  const detail::InType t = in_type(dtype);
  validate(o);
  const detail::OutMode m = t == detail::InType::kF32    ? detail::OutMode::kStoreF32
                            : t == detail::InType::kBF16 ? detail::OutMode::kStoreBF16
                                                         : detail::OutMode::kStoreF16;
  return detail::active().decode(in, n, o, out, m);
}

int64_t decode_add(const uint8_t* in, int64_t n, const CodecOptions& o, float* acc) {
  validate(o);
  return detail::active().decode(in, n, o, acc, detail::OutMode::kAddF32);
}

bool all_finite(const float* x, int64_t n) {
  v4f z0 = {}, z1 = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const v4f a = load4(x + i), b = load4(x + i + 4);
    z0 += a - a;
    z1 += b - b;
  }
  z0 += z1;
  bool ok = true;
  for (; i < n; ++i) ok = ok && x[i] - x[i] == 0.0f;
  for (int j = 0; j < 4; ++j) ok = ok && z0[j] == 0.0f;
  return ok;
}

bool all_finite(const void* x, c10::ScalarType dtype, int64_t n) {
  check_dtype(dtype);
  if (dtype == c10::kFloat) return all_finite(static_cast<const float*>(x), n);
  // A 16-bit float is non-finite iff its exponent bits are all ones.
  const uint16_t* h = static_cast<const uint16_t*>(x);
  const uint16_t mask = dtype == c10::kBFloat16 ? 0x7F80 : 0x7C00;
  uint16_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= uint16_t((h[i] & mask) == mask);
  return bad == 0;
}

}  // namespace lockstep::compress
