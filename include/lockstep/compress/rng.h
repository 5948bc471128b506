// lockstep/compress/rng.h: the counter-based random numbers behind stochastic rounding.
//
// Stochastic rounding needs one uniform number per element, reproducible for a fixed
// seed and free of shared state, so any thread may encode any bucket in any order.
// A counter-based generator gives exactly that: the number for element i of bucket k is
// a pure function hash(key(seed, step, rank, phase, k), i). There is no state to carry,
// and the per-element hash is a handful of 32-bit multiplies and shifts, written so the
// compiler vectorizes it across elements (no per-element calls, no data-dependent loop).
//
// Quality: the bucket key goes through splitmix64 (full 64-bit avalanche); the element
// hash is murmur3's fmix32 finalizer over (lane + key_hi) * golden ^ key_lo, a bijection
// with full avalanche, which is ample for rounding decisions (the tests check unbiasedness
// and the variance bound empirically). The top 24 bits become a float in [0, 1), so the
// rounding bias is at most 2^-24 of one quantization step.
#pragma once

#include <cstdint>

// The CUDA codec (src/compress/cuda/) calls these same functions in its kernels, so both
// codecs draw identical numbers: __host__ __device__ under nvcc, nothing otherwise.
// Always inlined on the host as well: the CPU codec's AVX2 and AVX-512 kernels call them,
// and an out-of-line copy compiled with those flags could be the one the linker keeps for
// every caller (tests/unit: codec_isa_linkage checks the objects).
#ifndef LOCKSTEP_HOST_DEVICE
#ifdef __CUDACC__
#define LOCKSTEP_HOST_DEVICE __host__ __device__ __attribute__((always_inline))
#else
#define LOCKSTEP_HOST_DEVICE __attribute__((always_inline))
#endif
#endif

namespace lockstep::compress {

// Everything that selects one random stream. Two encodings with equal keys and bucket
// indices round identically; change any field and the decisions are independent.
struct StreamKey {
  uint64_t seed = 0;   // the job's seed (QsgdOptions::seed)
  uint64_t step = 0;   // the training step (or call counter)
  uint32_t rank = 0;   // the rank doing the encoding
  uint32_t phase = 0;  // which quantization within one allreduce (1: scatter, 2: gather)
};

namespace rng {

LOCKSTEP_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The 64-bit key of one bucket: chains every field through splitmix64 so that nearby
// (step, rank, bucket) triples give unrelated keys.
LOCKSTEP_HOST_DEVICE inline uint64_t bucket_key(const StreamKey& k, uint64_t bucket) {
  uint64_t h = splitmix64(k.seed);
  h = splitmix64(h ^ k.step);
  h = splitmix64(h ^ ((uint64_t(k.rank) << 32) | k.phase));
  return splitmix64(h ^ bucket);
}

// Uniform in [0, 1) for element `lane` of the bucket with key `key`. Inline and branch
// free so that a loop over lanes vectorizes.
LOCKSTEP_HOST_DEVICE inline float uniform(uint64_t key, uint32_t lane) {
  uint32_t h = (lane + uint32_t(key >> 32)) * 0x9E3779B9u ^ uint32_t(key);
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return float(int32_t(h >> 8)) * (1.0f / 16777216.0f);  // int32: converts in SIMD
}

}  // namespace rng
}  // namespace lockstep::compress
