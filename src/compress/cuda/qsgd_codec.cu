// The CUDA QSGD kernels: the same bytes as the CPU codec (src/compress/qsgd_codec.cpp,
// docs/wire-format.md) for the same input, options and StreamKey.
//
// Layout of the work: one thread per group of 8 values, which it quantizes into their
// `bits` code bytes, exactly the CPU's little-endian group.
// - Encode, buckets of up to 32 groups (B <= 256; the default 128 has 16): the S lanes of
//   a bucket (S: its groups rounded up to a power of two) are consecutive lanes of one
//   warp, 32 / S buckets to a warp, 256 threads to a block. Each lane loads its 8 values
//   once into registers; the bucket's min, max and NaN/Inf flag are reduced by shuffles
//   within the S lanes (no shared memory, no barrier).
// - Encode, larger buckets: one thread block per bucket (up to 256 threads, each over
//   several groups), reduced through shared memory, the values read twice.
// - Decode: the same lanes for buckets of up to 32 groups (float32 written 16 bytes at a
//   time where aligned), a flat grid over every group of the segment above.
// A block of 32 threads per bucket, the first layout, left half of each warp idle at
// B = 128 and a quarter of the GPU's threads resident: 26% (encode) and 41% (decode) of
// a device copy's rate on an H200 (docs/gpu.md). No block depends on another, so one
// launch does a whole segment.
//
// Bit identity with the CPU (docs/gpu.md): every float operation is one IEEE operation
// rounded to nearest, as the CPU's x86-64 baseline SSE does it: __fsub_rn/__fmul_rn/
// __fadd_rn/__fdiv_rn cannot be contracted into an FMA or replaced by an approximation,
// whatever the flags (the file is also compiled with --fmad=false, cmake/Cuda.cmake).
// min and max of the same set are the same numbers in any order, except for the sign of
// zero, which both codecs canonicalise (+ 0.0f). The random numbers are rng.h's, shared
// by both. The scaled value is clamped to the top code in float before its truncation, so
// no conversion ever sees an out-of-range float.
#include "compress/cuda/qsgd_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

namespace lockstep::compress::cuda_detail {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kMaxBlocks = 1 << 20;  // grid-stride beyond: any number of buckets

__device__ __forceinline__ float load(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float load(const __half* x, int64_t i) { return __half2float(x[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* x, int64_t i) {
  return __bfloat162float(x[i]);
}
__device__ __forceinline__ void store(float* y, int64_t i, float v) { y[i] = v; }
__device__ __forceinline__ void store(__half* y, int64_t i, float v) { y[i] = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* y, int64_t i, float v) {
  y[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ void put_f32(uint8_t* p, float v) {
  const unsigned u = __float_as_uint(v);
  for (int b = 0; b < 4; ++b) p[b] = uint8_t(u >> (8 * b));  // any alignment, little-endian
}
__device__ __forceinline__ float get_f32(const uint8_t* p) {
  unsigned u = 0;
  for (int b = 0; b < 4; ++b) u |= unsigned(p[b]) << (8 * b);
  return __uint_as_float(u);
}

struct Range {
  float lo, hi;
  int bad;
};

__device__ __forceinline__ float min_f(float a, float b) { return a < b ? a : b; }
__device__ __forceinline__ float max_f(float a, float b) { return a > b ? a : b; }

// min, max and "holds NaN/Inf" of xb[0, len), on every thread of the block. blockDim.x is
// a multiple of 32. NaNs never win a compare; (v - v) != 0 flags NaN and +-Inf.
template <typename T>
__device__ Range block_range(const T* xb, int64_t len) {
  __shared__ float s_lo[32], s_hi[32];
  __shared__ int s_bad[32];
  float lo = INFINITY, hi = -INFINITY;
  int bad = 0;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const float v = load(xb, i);
    lo = min_f(v, lo);
    hi = max_f(v, hi);
    bad |= !(__fsub_rn(v, v) == 0.0f);
  }
  for (int off = 16; off > 0; off >>= 1) {
    lo = min_f(__shfl_xor_sync(0xffffffffu, lo, off), lo);
    hi = max_f(__shfl_xor_sync(0xffffffffu, hi, off), hi);
    bad |= __shfl_xor_sync(0xffffffffu, bad, off);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) s_lo[warp] = lo, s_hi[warp] = hi, s_bad[warp] = bad;
  __syncthreads();
  if (warp == 0) {
    lo = lane < warps ? s_lo[lane] : INFINITY;
    hi = lane < warps ? s_hi[lane] : -INFINITY;
    bad = lane < warps ? s_bad[lane] : 0;
    for (int off = 16; off > 0; off >>= 1) {
      lo = min_f(__shfl_xor_sync(0xffffffffu, lo, off), lo);
      hi = max_f(__shfl_xor_sync(0xffffffffu, hi, off), hi);
      bad |= __shfl_xor_sync(0xffffffffu, bad, off);
    }
    if (lane == 0) s_lo[0] = lo, s_hi[0] = hi, s_bad[0] = bad;
  }
  __syncthreads();
  const Range r{s_lo[0], s_hi[0], s_bad[0]};
  __syncthreads();  // the next bucket's reduction reuses the shared slots
  return r;
}

__device__ __forceinline__ int64_t group_bytes(int64_t len, int bits) {
  return (len + 7) / 8 * bits;
}

template <int BITS, typename T>
__global__ void encode_kernel(const T* x, int64_t n, int64_t B, int64_t nb, bool stochastic,
                              StreamKey key, uint64_t first_bucket, uint8_t* out,
                              unsigned long long* first_bad) {
  constexpr int kTop = (1 << BITS) - 1;
  for (int64_t j = blockIdx.x; j < nb; j += gridDim.x) {
    const int64_t len = B < n - j * B ? B : n - j * B;
    const T* xb = x + j * B;
    uint8_t* codes = out + nb * 8 + j * group_bytes(B, BITS);  // buckets before j are full
    const int64_t groups = (len + 7) / 8;
    const Range r = block_range(xb, len);
    if (r.bad) {  // the NaN marker: meta (NaN, NaN), zero codes
      if (threadIdx.x == 0) {
        put_f32(out + j * 8, __uint_as_float(0x7FC00000u));  // the CPU's NAN
        put_f32(out + j * 8 + 4, __uint_as_float(0x7FC00000u));
        if (first_bad) atomicMin(first_bad, (unsigned long long)j);
      }
      for (int64_t b = threadIdx.x; b < groups * BITS; b += blockDim.x) codes[b] = 0;
      continue;
    }
    const float lo = __fadd_rn(r.lo, 0.0f), hi = __fadd_rn(r.hi, 0.0f);  // -0 -> +0
    float unit = __fdiv_rn(__fsub_rn(hi, lo), float(kTop));
    if (!(unit <= FLT_MAX)) unit = FLT_MAX;
    float inv = unit > 0.0f ? __fdiv_rn(1.0f, unit) : 0.0f;
    if (!(inv <= FLT_MAX)) inv = FLT_MAX;  // subnormal unit
    if (threadIdx.x == 0) put_f32(out + j * 8, lo), put_f32(out + j * 8 + 4, unit);
    const uint64_t bkey = rng::bucket_key(key, first_bucket + uint64_t(j));
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      uint64_t w = 0;
      for (int k = 0; k < 8; ++k) {
        const int64_t i = g * 8 + k;
        if (i >= len) break;  // the last group is completed with zero codes
        const float u = stochastic ? rng::uniform(bkey, uint32_t(i)) : 0.5f;
        float t = __fadd_rn(__fmul_rn(__fsub_rn(load(xb, i), lo), inv), u);
        t = t < float(kTop) ? t : float(kTop);  // clamped in float, as the CPU codec does
        w |= uint64_t(__float2int_rz(t)) << (k * BITS);
      }
      for (int b = 0; b < BITS; ++b) codes[g * BITS + b] = uint8_t(w >> (8 * b));
    }
  }
}

// Buckets of at most 32 groups: see the layout at the top. `S` lanes per bucket, a
// power of two >= the groups of a full bucket; blockDim.x is a multiple of 32.
template <int BITS, typename T>
__global__ void encode_lanes_kernel(const T* x, int64_t n, int64_t B, int64_t nb, int S,
                                    bool stochastic, StreamKey key, uint64_t first_bucket,
                                    uint8_t* out, unsigned long long* first_bad) {
  constexpr int kTop = (1 << BITS) - 1;
  const int64_t per_block = blockDim.x / S;
  const int g = int(threadIdx.x % unsigned(S));  // this lane's group in its bucket
  // Every lane of a warp runs the same iterations (the bound is the block's), so the
  // shuffles below always have all 32 lanes.
  for (int64_t j0 = int64_t(blockIdx.x) * per_block; j0 < nb;
       j0 += int64_t(gridDim.x) * per_block) {
    const int64_t j = j0 + threadIdx.x / unsigned(S);
    const int64_t len = j < nb ? (B < n - j * B ? B : n - j * B) : 0;
    const int64_t first = int64_t(g) * 8;
    const T* xb = x + (j < nb ? j * B : 0);
    float v[8];
    float lo = INFINITY, hi = -INFINITY;
    int bad = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[k] = first + k < len ? load(xb, first + k) : 0.0f;
      if (first + k < len) {
        lo = min_f(v[k], lo);
        hi = max_f(v[k], hi);
        bad |= !(__fsub_rn(v[k], v[k]) == 0.0f);
      }
    }
    for (int off = S / 2; off > 0; off >>= 1) {  // xor below S stays in the bucket's lanes
      lo = min_f(__shfl_xor_sync(0xffffffffu, lo, off), lo);
      hi = max_f(__shfl_xor_sync(0xffffffffu, hi, off), hi);
      bad |= __shfl_xor_sync(0xffffffffu, bad, off);
    }
    if (j >= nb) continue;
    uint8_t* codes = out + nb * 8 + j * group_bytes(B, BITS);  // buckets before j are full
    const bool mine = first < len;                             // a group of this bucket
    if (bad) {  // the NaN marker: meta (NaN, NaN), zero codes
      if (g == 0) {
        put_f32(out + j * 8, __uint_as_float(0x7FC00000u));  // the CPU's NAN
        put_f32(out + j * 8 + 4, __uint_as_float(0x7FC00000u));
        if (first_bad) atomicMin(first_bad, (unsigned long long)j);
      }
      if (mine)
        for (int b = 0; b < BITS; ++b) codes[g * BITS + b] = 0;
      continue;
    }
    lo = __fadd_rn(lo, 0.0f), hi = __fadd_rn(hi, 0.0f);  // -0 -> +0
    float unit = __fdiv_rn(__fsub_rn(hi, lo), float(kTop));
    if (!(unit <= FLT_MAX)) unit = FLT_MAX;
    float inv = unit > 0.0f ? __fdiv_rn(1.0f, unit) : 0.0f;
    if (!(inv <= FLT_MAX)) inv = FLT_MAX;  // subnormal unit
    if (g == 0) put_f32(out + j * 8, lo), put_f32(out + j * 8 + 4, unit);
    if (!mine) continue;
    const uint64_t bkey = rng::bucket_key(key, first_bucket + uint64_t(j));
    uint64_t w = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = first + k;
      if (i >= len) break;  // the last group is completed with zero codes
      const float u = stochastic ? rng::uniform(bkey, uint32_t(i)) : 0.5f;
      float t = __fadd_rn(__fmul_rn(__fsub_rn(v[k], lo), inv), u);
      t = t < float(kTop) ? t : float(kTop);  // clamped in float, as the CPU codec does
      w |= uint64_t(__float2int_rz(t)) << (k * BITS);
    }
    for (int b = 0; b < BITS; ++b) codes[g * BITS + b] = uint8_t(w >> (8 * b));
  }
}

// Decode of larger buckets: a flat grid over every group of the segment.
template <int BITS, typename T, bool ADD>
__global__ void decode_kernel(const uint8_t* in, int64_t n, int64_t B, int64_t nb, T* out,
                              unsigned long long* first_bad) {
  constexpr uint64_t kMask = (1u << BITS) - 1;
  const int64_t G = (B + 7) / 8;  // groups of a full bucket
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < nb * G;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = t / G, g = t % G;
    const int64_t len = B < n - j * B ? B : n - j * B;
    if (g * 8 >= len) continue;  // the last bucket may have fewer groups
    const float lo = get_f32(in + j * 8), unit = get_f32(in + j * 8 + 4);
    if (g == 0 && lo != lo && first_bad) atomicMin(first_bad, (unsigned long long)j);
    const uint8_t* codes = in + nb * 8 + j * group_bytes(B, BITS);
    T* yb = out + j * B;
    uint64_t w = 0;
    for (int b = 0; b < BITS; ++b) w |= uint64_t(codes[g * BITS + b]) << (8 * b);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = g * 8 + k;
      if (i >= len) break;
      const float v = __fadd_rn(lo, __fmul_rn(float((w >> (k * BITS)) & kMask), unit));
      if constexpr (ADD)
        store(yb, i, __fadd_rn(load(yb, i), v));
      else
        store(yb, i, v);
    }
  }
}

// Decode of buckets of at most 32 groups: the lanes of encode_lanes_kernel (2^shift a
// bucket, no shuffles needed), each writing its 8 values; float32 output as two 16-byte
// stores where aligned.
template <int BITS, typename T, bool ADD>
__global__ void decode_lanes_kernel(const uint8_t* in, int64_t n, int64_t B, int64_t nb, int shift,
                                    T* out, unsigned long long* first_bad) {
  constexpr uint64_t kMask = (1u << BITS) - 1;
  const int64_t per_block = blockDim.x >> shift;
  const int g = int(threadIdx.x & ((1u << shift) - 1));
  for (int64_t j0 = int64_t(blockIdx.x) * per_block; j0 < nb;
       j0 += int64_t(gridDim.x) * per_block) {
    const int64_t j = j0 + (threadIdx.x >> shift);
    if (j >= nb) continue;
    const int64_t len = B < n - j * B ? B : n - j * B, first = int64_t(g) * 8;
    if (first >= len) continue;
    const float lo = get_f32(in + j * 8), unit = get_f32(in + j * 8 + 4);
    if (g == 0 && lo != lo && first_bad) atomicMin(first_bad, (unsigned long long)j);
    const uint8_t* codes = in + nb * 8 + j * group_bytes(B, BITS) + g * BITS;
    uint64_t w = 0;
    for (int b = 0; b < BITS; ++b) w |= uint64_t(codes[b]) << (8 * b);
    T* y = out + j * B + first;
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[k] = __fadd_rn(lo, __fmul_rn(float((w >> (k * BITS)) & kMask), unit));
      if constexpr (ADD) v[k] = __fadd_rn(k < len - first ? load(y, k) : 0.0f, v[k]);
    }
    if constexpr (std::is_same_v<T, float>) {
      if (len - first >= 8 && (reinterpret_cast<uintptr_t>(y) & 15) == 0) {
        reinterpret_cast<float4*>(y)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(y)[1] = make_float4(v[4], v[5], v[6], v[7]);
        continue;
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < len - first) store(y, k, v[k]);
  }
}

struct Grid {
  int blocks, threads;
};

int blocks_for(int64_t work, int64_t per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return int(b < kMaxBlocks ? b : kMaxBlocks);
}

// Large buckets: one block per bucket, one thread per group of 8 values (a multiple of 32,
// at most 256).
Grid block_grid(int64_t nb, int64_t B) {
  const int64_t groups = (B + 7) / 8;
  int threads = int(((groups < kMaxThreads ? groups : kMaxThreads) + 31) / 32 * 32);
  return {blocks_for(nb, 1), threads};
}

// The lanes of a bucket of at most 32 groups: its groups rounded up to a power of two.
int lanes_for(int64_t B) {
  const int64_t groups = (B + 7) / 8;
  int s = 1;
  while (s < groups) s *= 2;
  return s;
}

template <typename F>
void dispatch_bits(int bits, F&& f) {
  switch (bits) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 3:
      f(std::integral_constant<int, 3>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 5:
      f(std::integral_constant<int, 5>{});
      break;
    case 6:
      f(std::integral_constant<int, 6>{});
      break;
    case 7:
      f(std::integral_constant<int, 7>{});
      break;
    default:
      f(std::integral_constant<int, 8>{});
      break;
  }
}

template <typename F>
void dispatch_dtype(Dtype d, F&& f) {
  if (d == Dtype::BF16)
    f(static_cast<__nv_bfloat16*>(nullptr));
  else if (d == Dtype::F16)
    f(static_cast<__half*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}

int64_t encoded_bytes(int64_t n, const Layout& l) {
  const int64_t B = l.bucket_size, full = n / B, tail = n % B;
  const int64_t bytes =
      (n + B - 1) / B * 8 + full * ((B + 7) / 8 * l.bits) + (tail + 7) / 8 * l.bits;
  return (bytes + 3) & ~int64_t(3);
}

const char* status(cudaError_t e) { return e == cudaSuccess ? nullptr : cudaGetErrorString(e); }

// first_bad starts as all ones: -1 as int64, above every index for atomicMin.
cudaError_t reset_first_bad(int64_t* first_bad, cudaStream_t s) {
  return first_bad ? cudaMemsetAsync(first_bad, 0xFF, sizeof(int64_t), s) : cudaSuccess;
}

}  // namespace

const char* launch_encode(const void* x, Dtype dtype, int64_t n, const Layout& l,
                          const StreamKey& key, uint64_t first_bucket, uint8_t* out,
                          int64_t* first_bad, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (const auto e = reset_first_bad(first_bad, s); e != cudaSuccess) return status(e);
  if (n == 0) return nullptr;
  const int64_t B = l.bucket_size, nb = (n + B - 1) / B;
  auto* bad = reinterpret_cast<unsigned long long*>(first_bad);
  const int S = (B + 7) / 8 <= 32 ? lanes_for(B) : 0;  // 0: a block per bucket
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* xt = static_cast<const T*>(x);
    dispatch_bits(l.bits, [&](auto b) {
      constexpr int kBits = decltype(b)::value;
      if (S > 0) {
        encode_lanes_kernel<kBits, T><<<blocks_for(nb, kMaxThreads / S), kMaxThreads, 0, s>>>(
            xt, n, B, nb, S, l.stochastic, key, first_bucket, out, bad);
      } else {
        const Grid g = block_grid(nb, B);
        encode_kernel<kBits, T><<<g.blocks, g.threads, 0, s>>>(xt, n, B, nb, l.stochastic, key,
                                                               first_bucket, out, bad);
      }
    });
  });
  if (const auto e = cudaGetLastError(); e != cudaSuccess) return status(e);
  // The 0-3 padding bytes after the last bucket's codes.
  const int64_t used = nb * 8 + (n / B) * ((B + 7) / 8 * l.bits) + (n % B + 7) / 8 * l.bits;
  const int64_t pad = encoded_bytes(n, l) - used;
  return pad > 0 ? status(cudaMemsetAsync(out + used, 0, size_t(pad), s)) : nullptr;
}

const char* launch_decode(const uint8_t* in, int64_t n, const Layout& l, void* out, Dtype dtype,
                          bool add, int64_t* first_bad, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (const auto e = reset_first_bad(first_bad, s); e != cudaSuccess) return status(e);
  if (n == 0) return nullptr;
  const int64_t B = l.bucket_size, nb = (n + B - 1) / B;
  auto* bad = reinterpret_cast<unsigned long long*>(first_bad);
  const int S = (B + 7) / 8 <= 32 ? lanes_for(B) : 0;  // 0: the flat grid
  int shift = 0;
  while ((1 << shift) < S) ++shift;
  auto launch = [&](auto kBits, auto* tag, auto add_tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr bool kAdd = decltype(add_tag)::value;
    auto* y = static_cast<T*>(out);
    if (S > 0)
      decode_lanes_kernel<decltype(kBits)::value, T, kAdd>
          <<<blocks_for(nb, kMaxThreads / S), kMaxThreads, 0, s>>>(in, n, B, nb, shift, y, bad);
    else
      decode_kernel<decltype(kBits)::value, T, kAdd>
          <<<blocks_for(nb * ((B + 7) / 8), kMaxThreads), kMaxThreads, 0, s>>>(in, n, B, nb, y,
                                                                               bad);
  };
  dispatch_bits(l.bits, [&](auto b) {
    if (add) return launch(b, static_cast<float*>(nullptr), std::true_type{});
    dispatch_dtype(dtype, [&](auto* tag) { launch(b, tag, std::false_type{}); });
  });
  return status(cudaGetLastError());
}

}  // namespace lockstep::compress::cuda_detail
