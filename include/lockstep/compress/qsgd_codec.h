// lockstep/compress/qsgd_codec.h: QSGD-style stochastic quantization of gradient segments.
//
// A segment is n consecutive values of ONE layer. It is cut into buckets of
// `bucket_size` values from its start (the last one may be shorter); buckets never span
// two segments, so a caller that encodes layer by layer never mixes two layers' ranges.
// Per bucket the codec keeps, in float32 whatever the input dtype (fp16 would underflow
// small gradients' scales), the bucket's minimum and its step
//     unit = (max - min) / (2^bits - 1)
// and one `bits`-bit code per value: decoded = min + code * unit. The min/max form (as in
// CGX) spends all 2^bits levels on the range the bucket really has; max-abs with a sign
// bit wastes one bit of every code on the sign and half the levels on a side that is
// often nearly empty, which hurts most at 1-2 bits.
//
// Rounding: stochastic (default) rounds t = (x - min) / unit up with probability frac(t),
// so E[decoded] = x (unbiased) and, per value,
//     |decoded - x| < unit,   Var[decoded] <= unit^2 / 4;
// deterministic rounding rounds to nearest: |decoded - x| <= unit / 2 (+ float rounding).
// Zeros and constant buckets (max == min) come back exactly; the bounds above hold for
// short tail buckets too. The random numbers come from rng.h, keyed by
// (StreamKey, first_bucket + bucket index in the segment): reproducible, thread-free.
//
// NaN / Inf: a bucket holding one is encoded with NaN metadata (min = unit = NaN, codes 0)
// so that it decodes to NaN everywhere and the receiver can tell, without a side channel;
// encode() returns the index of the first such bucket so the caller can raise an error
// naming the layer (NonFiniteGradient). Nothing is silently averaged away.
// Extremes: a bucket whose range max - min overflows float gets unit = FLT_MAX; one whose
// unit is subnormal has its inverse clamped to FLT_MAX; codes never exceed 2^bits - 1 (the
// scaled value is clamped in float before conversion); a min of -0 is stored as +0.
// Subnormal inputs are ordinary values (no flush to zero unless the caller's thread set
// the CPU's FTZ/DAZ flags).
//
// Speed: the kernels run on the widest SIMD path this CPU has (AVX-512, AVX2, or the
// baseline), chosen once per process; LOCKSTEP_CODEC_ISA=generic|avx2|avx512 or
// set_codec_isa() pick one. Every path writes the same bytes (docs/compression.md).
//
// The byte layout is in docs/wire-format.md; both sides compute sizes from (n, options),
// so no header travels. All functions are pure and thread-safe.
#pragma once

#include <lockstep/compress/rng.h>
#include <lockstep/error.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::compress {

struct CodecOptions {
  int bits = 4;               // 1..8 bits per value
  int64_t bucket_size = 128;  // values per bucket, >= 1; metadata costs 64 bits per bucket
  bool stochastic = true;     // false: round to nearest (biased, half the max error)
};

// Throws InvalidArgument unless bits in [1, 8] and bucket_size in [1, 2^24].
void validate(const CodecOptions& o);

// A gradient held NaN or Inf. Raised (on every rank, after the collective completed) by
// the compressed allreduce, naming the layer; never raised by the codec itself.
class NonFiniteGradient : public Error {
 public:
  NonFiniteGradient(std::string layer, const std::string& what)
      : Error(what), layer_(std::move(layer)) {}
  const std::string& layer() const { return layer_; }

 private:
  std::string layer_;
};

// Number of buckets of an n-value segment.
int64_t num_buckets(int64_t n, const CodecOptions& o);
// Exact size in bytes of an encoded n-value segment (a multiple of 4; 0 for n == 0).
int64_t encoded_bytes(int64_t n, const CodecOptions& o);

// Encodes x[0, n) into out[0, encoded_bytes(n)). Bucket j of the segment draws its random
// numbers from (key, first_bucket + j). Returns the index within the segment of the first
// bucket holding NaN/Inf, or -1.
int64_t encode(const float* x, int64_t n, const CodecOptions& o, const StreamKey& key,
               uint64_t first_bucket, uint8_t* out);
// Same for bfloat16 / float16 / float32 input given as raw memory of dtype `dtype`.
int64_t encode(const void* x, c10::ScalarType dtype, int64_t n, const CodecOptions& o,
               const StreamKey& key, uint64_t first_bucket, uint8_t* out);

// Decodes in[0, encoded_bytes(n)) into out[0, n). Returns the first NaN-marked bucket or -1.
int64_t decode(const uint8_t* in, int64_t n, const CodecOptions& o, float* out);
// Decodes into bfloat16 / float16 / float32 memory (converted with round-to-nearest-even).
int64_t decode(const uint8_t* in, int64_t n, const CodecOptions& o, void* out,
               c10::ScalarType dtype);
// acc[i] += decoded[i] (float32 accumulation, as the reducing rank does).
int64_t decode_add(const uint8_t* in, int64_t n, const CodecOptions& o, float* acc);

// Bounds of this bucket's encoding, for tests and docs: the quantization step of a bucket
// whose values span [lo, hi].
inline double unit_for(double lo, double hi, int bits) {
  return (hi - lo) / double((1 << bits) - 1);
}

// The codec's SIMD path in use ("avx512", "avx2" or "generic"); the paths this build has
// and this CPU runs, best first; and a switch to one of them (process-wide, for tests and
// benchmarks; InvalidArgument naming the available ones otherwise).
std::string codec_isa();
std::vector<std::string> codec_isas();
void set_codec_isa(const std::string& name);

// True if all of x[0, n) is finite (vectorized scan).
bool all_finite(const float* x, int64_t n);
bool all_finite(const void* x, c10::ScalarType dtype, int64_t n);

}  // namespace lockstep::compress
