// QSGD-style bucketed stochastic quantization (see qsgd_codec.h for the contract and
// docs/wire-format.md for the bytes).
//
// Speed comes from three habits: (1) a bucket at a time, so the bucket stays in L1
// between the min/max pass and the quantize pass; (2) every loop is a plain counted loop
// over lanes with no calls and no data-dependent branches, so -O3 vectorizes it with the
// baseline ISA (min/max into 8 independent lane accumulators, the counter-based RNG,
// float->int conversion, the uint8 code scratch); (3) the bit width is a template
// parameter, so packing 8 codes into `bits` bytes uses constant shifts and a
// constant-size store.
#include <lockstep/compress/qsgd_codec.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is little-endian; a big-endian port must byte-swap metadata and codes"
#endif

namespace lockstep::compress {
namespace {

constexpr int kLanes = 8;  // independent accumulators: one SSE pair / one AVX register

struct Range {
  float lo, hi;
  bool finite;
};

// One pass: min, max and a NaN/Inf probe. (v - v) is 0 for finite v and NaN for NaN or
// +-Inf, and a NaN sticks in the sum; the compare-select min/max alone would skip NaNs.
// GCC/Clang vector extensions (not intrinsics) keep it portable: an 8-lane vector is one
// AVX register or two SSE/NEON registers. The scalar-array form of this loop does not
// vectorize, because without -ffinite-math-only `v < m ? v : m` is not a MIN_EXPR.
// Two 4-lane vectors per quantity (8 independent lanes hide the compare latency); 16-byte
// vectors map to one register on every SIMD ISA, wider ones spill on baseline x86-64.
typedef float v4f __attribute__((vector_size(16)));

inline v4f load4(const float* p) {
  v4f v;
  std::memcpy(&v, p, sizeof v);  // unaligned load
  return v;
}

inline Range bucket_range(const float* x, int64_t n) {
  const v4f inf = {INFINITY, INFINITY, INFINITY, INFINITY};
  v4f mn0 = inf, mn1 = inf, mx0 = -inf, mx1 = -inf, z0 = {}, z1 = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const v4f a = load4(x + i), b = load4(x + i + 4);
    mn0 = a < mn0 ? a : mn0;
    mn1 = b < mn1 ? b : mn1;
    mx0 = a > mx0 ? a : mx0;
    mx1 = b > mx1 ? b : mx1;
    z0 += a - a;
    z1 += b - b;
  }
  mn0 = mn1 < mn0 ? mn1 : mn0;
  mx0 = mx1 > mx0 ? mx1 : mx0;
  z0 += z1;
  Range r{INFINITY, -INFINITY, true};
  for (int j = 0; j < 4; ++j) {
    r.lo = mn0[j] < r.lo ? mn0[j] : r.lo;
    r.hi = mx0[j] > r.hi ? mx0[j] : r.hi;
    r.finite = r.finite && z0[j] == 0.0f;
  }
  for (; i < n; ++i) {
    const float v = x[i];
    r.lo = v < r.lo ? v : r.lo;
    r.hi = v > r.hi ? v : r.hi;
    r.finite = r.finite && v - v == 0.0f;
  }
  return r;
}

inline int64_t code_bytes(int64_t len, int bits) { return (len + 7) / 8 * bits; }

template <int BITS>
inline void pack(const uint8_t* c, int64_t n8, uint8_t* out) {
  for (int64_t g = 0; g < n8 / 8; ++g) {
    uint64_t w = 0;
    for (int k = 0; k < 8; ++k) w |= uint64_t(c[g * 8 + k]) << (k * BITS);
    std::memcpy(out + g * BITS, &w, BITS);  // little-endian: the low BITS bytes
  }
}

template <int BITS>
inline void unpack(const uint8_t* in, int64_t n8, uint8_t* c) {
  constexpr uint64_t kMask = (1u << BITS) - 1;
  for (int64_t g = 0; g < n8 / 8; ++g) {
    uint64_t w = 0;
    std::memcpy(&w, in + g * BITS, BITS);
    for (int k = 0; k < 8; ++k) c[g * 8 + k] = uint8_t((w >> (k * BITS)) & kMask);
  }
}

// Quantizes one bucket into `codes` (n rounded up to 8 entries, the extra ones 0).
template <int BITS>
inline void quantize(const float* x, int64_t n, float lo, float inv, bool stochastic, uint64_t key,
                     uint8_t* codes) {
  constexpr int kTop = (1 << BITS) - 1;
  if (stochastic) {
    for (int64_t i = 0; i < n; ++i) {
      // t >= 0 since x >= lo; + u in [0,1) then truncation rounds up with prob. frac(t).
      const float t = (x[i] - lo) * inv + rng::uniform(key, uint32_t(i));
      const int c = int(t);
      codes[i] = uint8_t(c < kTop ? c : kTop);  // t may exceed kTop by float rounding
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      // t >= 0, so truncating t + 0.5f rounds half up: the wire format's rule (lround would
      // change the codes where t + 0.5f rounds in float, and does not vectorize).
      const int c = int((x[i] - lo) * inv + 0.5f);  // NOLINT(bugprone-incorrect-roundings): t >= 0
      codes[i] = uint8_t(c < kTop ? c : kTop);
    }
  }
  for (int64_t i = n; i < ((n + 7) & ~int64_t(7)); ++i) codes[i] = 0;
}

inline void put_meta(uint8_t* meta, int64_t j, float lo, float unit) {
  const float m[2] = {lo, unit};
  std::memcpy(meta + j * 8, m, 8);
}
inline void get_meta(const uint8_t* meta, int64_t j, float& lo, float& unit) {
  float m[2];
  std::memcpy(m, meta + j * 8, 8);
  lo = m[0];
  unit = m[1];
}

template <int BITS>
int64_t encode_t(const float* x, int64_t n, const CodecOptions& o, const StreamKey& key,
                 uint64_t first_bucket, uint8_t* out) {
  constexpr int kTop = (1 << BITS) - 1;
  const int64_t B = o.bucket_size, nb = num_buckets(n, o);
  std::vector<uint8_t> codes(size_t((B + 7) & ~int64_t(7)));
  uint8_t* meta = out;
  uint8_t* dst = out + nb * 8;
  int64_t first_bad = -1;
  for (int64_t j = 0; j < nb; ++j) {
    const float* xb = x + j * B;
    const int64_t len = std::min<int64_t>(B, n - j * B);
    const Range r = bucket_range(xb, len);
    const int64_t cb = code_bytes(len, BITS);
    if (!r.finite) {  // mark it: decodes to NaN on every rank, the caller names the layer
      if (first_bad < 0) first_bad = j;
      put_meta(meta, j, NAN, NAN);
      std::memset(dst, 0, size_t(cb));
      dst += cb;
      continue;
    }
    float unit = (r.hi - r.lo) / float(kTop);
    if (!(unit <= FLT_MAX)) unit = FLT_MAX;  // hi - lo overflowed float: clamp, stay finite
    const float inv = unit > 0.0f ? 1.0f / unit : 0.0f;  // constant bucket: every code 0
    put_meta(meta, j, r.lo, unit);
    quantize<BITS>(xb, len, r.lo, inv, o.stochastic, rng::bucket_key(key, first_bucket + j),
                   codes.data());
    pack<BITS>(codes.data(), (len + 7) & ~int64_t(7), dst);
    dst += cb;
  }
  // padding to 4 bytes (none for n = 0, where `out` may be null: memset(nullptr) is UB)
  const size_t pad = size_t(out + encoded_bytes(n, o) - dst);
  if (pad > 0) std::memset(dst, 0, pad);
  return first_bad;
}

// Decodes bucket by bucket, handing each bucket's floats to `sink(offset, values, len)`.
template <int BITS, typename Sink>
int64_t decode_t(const uint8_t* in, int64_t n, const CodecOptions& o, float* scratch, Sink&& sink) {
  const int64_t B = o.bucket_size, nb = num_buckets(n, o);
  std::vector<uint8_t> codes(size_t((B + 7) & ~int64_t(7)));
  const uint8_t* src = in + nb * 8;
  int64_t first_bad = -1;
  for (int64_t j = 0; j < nb; ++j) {
    const int64_t len = std::min<int64_t>(B, n - j * B);
    float lo, unit;
    get_meta(in, j, lo, unit);
    if (lo != lo && first_bad < 0) first_bad = j;
    unpack<BITS>(src, (len + 7) & ~int64_t(7), codes.data());
    src += code_bytes(len, BITS);
    for (int64_t i = 0; i < len; ++i) scratch[i] = lo + float(codes[i]) * unit;
    sink(j * B, scratch, len);
  }
  return first_bad;
}

template <typename F>
auto dispatch_bits(int bits, F&& f) {
  switch (bits) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

void check_dtype(c10::ScalarType t) {
  LOCKSTEP_CHECK(t == c10::kFloat || t == c10::kBFloat16 || t == c10::kHalf,
                 "compression takes float32, bfloat16 or float16, not ", c10::toString(t));
}

template <typename T>
void to_float(const T* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]);
}
template <typename T>
void from_float(const float* x, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(x[i]);
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
  return dispatch_bits(o.bits, [&](auto b) {
    return encode_t<decltype(b)::value>(x, n, o, key, first_bucket, out);
  });
}

int64_t encode(const void* x, c10::ScalarType dtype, int64_t n, const CodecOptions& o,
               const StreamKey& key, uint64_t first_bucket, uint8_t* out) {
  check_dtype(dtype);
  if (dtype == c10::kFloat)
    return encode(static_cast<const float*>(x), n, o, key, first_bucket, out);
  validate(o);
  // Convert one bucket-aligned block at a time into float32 and encode it as a
  // sub-segment: blocks are whole buckets, so the bytes equal a one-shot encoding.
  const int64_t block = o.bucket_size * std::max<int64_t>(1, 4096 / o.bucket_size);
  std::vector<float> buf(size_t(std::min(block, std::max<int64_t>(n, 1))));
  int64_t first_bad = -1, done = 0;
  std::vector<uint8_t> tmp;
  // Metadata and codes of a segment live in separate regions, so encode each block into a
  // temporary and scatter its two regions into place.
  const int64_t nb_all = num_buckets(n, o);
  uint8_t* codes_dst = out + nb_all * 8;
  while (done < n) {
    const int64_t len = std::min(block, n - done);
    if (dtype == c10::kBFloat16)
      to_float(static_cast<const c10::BFloat16*>(x) + done, len, buf.data());
    else
      to_float(static_cast<const c10::Half*>(x) + done, len, buf.data());
    tmp.resize(size_t(encoded_bytes(len, o)));
    const int64_t bad =
        encode(buf.data(), len, o, key, first_bucket + done / o.bucket_size, tmp.data());
    if (bad >= 0 && first_bad < 0) first_bad = done / o.bucket_size + bad;
    const int64_t nb = num_buckets(len, o);
    std::memcpy(out + (done / o.bucket_size) * 8, tmp.data(), size_t(nb * 8));
    const int64_t cb = (len / o.bucket_size) * code_bytes(o.bucket_size, o.bits) +
                       code_bytes(len % o.bucket_size, o.bits);
    std::memcpy(codes_dst, tmp.data() + nb * 8, size_t(cb));
    codes_dst += cb;
    done += len;
  }
  std::memset(codes_dst, 0, size_t(out + encoded_bytes(n, o) - codes_dst));
  return first_bad;
}

int64_t decode(const uint8_t* in, int64_t n, const CodecOptions& o, float* out) {
  validate(o);
  return dispatch_bits(o.bits, [&](auto b) {
    // Decode straight into `out`: the scratch pointer walks along the output.
    int64_t j = 0;
    const int64_t B = o.bucket_size, nb = num_buckets(n, o);
    std::vector<uint8_t> codes(size_t((B + 7) & ~int64_t(7)));
    const uint8_t* src = in + nb * 8;
    int64_t first_bad = -1;
    constexpr int kBits = decltype(b)::value;
    for (; j < nb; ++j) {
      const int64_t len = std::min<int64_t>(B, n - j * B);
      float lo, unit;
      get_meta(in, j, lo, unit);
      if (lo != lo && first_bad < 0) first_bad = j;
      unpack<kBits>(src, (len + 7) & ~int64_t(7), codes.data());
      src += code_bytes(len, kBits);
      float* dst = out + j * B;
      for (int64_t i = 0; i < len; ++i) dst[i] = lo + float(codes[i]) * unit;
    }
    return first_bad;
  });
}

int64_t decode(const uint8_t* in, int64_t n, const CodecOptions& o, void* out,
               c10::ScalarType dtype) {
  check_dtype(dtype);
  if (dtype == c10::kFloat) return decode(in, n, o, static_cast<float*>(out));
  validate(o);
  std::vector<float> scratch(size_t(o.bucket_size));
  return dispatch_bits(o.bits, [&](auto b) {
    return decode_t<decltype(b)::value>(
        in, n, o, scratch.data(), [&](int64_t off, const float* v, int64_t len) {
          if (dtype == c10::kBFloat16)
            from_float(v, len, static_cast<c10::BFloat16*>(out) + off);
          else
            from_float(v, len, static_cast<c10::Half*>(out) + off);
        });
  });
}

int64_t decode_add(const uint8_t* in, int64_t n, const CodecOptions& o, float* acc) {
  validate(o);
  std::vector<float> scratch(size_t(o.bucket_size));
  return dispatch_bits(o.bits, [&](auto b) {
    return decode_t<decltype(b)::value>(in, n, o, scratch.data(),
                                        [&](int64_t off, const float* v, int64_t len) {
                                          float* a = acc + off;
                                          for (int64_t i = 0; i < len; ++i) a[i] += v[i];
                                        });
  });
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
